"""Exact laws of joint-step samplers by enumeration (MATH.md §10, "The joint student"), masked source, tiny V and L:
a step t → s draws its reveal set R with independent λ_{t→s} and the tokens of R jointly, left to right over R.
`TabularJointStudent` is a free logit table per (student grid point, x_t, R, state with R's prefix drawn), which
declares a step head the way a network does (`ModelKind.offers` "joint_step")."""

from __future__ import annotations

import torch

from tcsm.models.kinds import JOINT_STEP_DENOISER
from tcsm.posttrain.fewstep.target import grid_start
from tcsm.sampling.common import time_grid


def reveal_of(states):
    """[N, N] index of R = M(x) \\ M(x') as a bitmask, −1 where x' is not reachable from x in one masked step."""
    V = states.V
    a, b = states.all[:, None, :], states.all[None, :, :]
    ok = ((a == V) | (a == b)).all(-1)  # clean tokens stay, masks may stay or be revealed
    bits = 2 ** torch.arange(states.L - 1, -1, -1)
    code = (((a == V) & (b != V)).long() * bits).sum(-1)
    return torch.where(ok, code, torch.full_like(code, -1))


def reveal_law(states, x_idx: int, lam: float):
    """P(R) over bitmasks [2^L] of one step from state x: each masked position independently with λ."""
    x = states.all[x_idx]
    masked = x == states.V
    out = torch.zeros(2**states.L, dtype=torch.float64)
    bits = 2 ** torch.arange(states.L - 1, -1, -1)
    for code in range(2**states.L):
        R = (code & bits) > 0
        if (R & ~masked).any():
            continue
        out[code] = lam ** int(R.sum()) * (1 - lam) ** int((masked & ~R).sum())
    return out


def teacher_step_matrix(states, teacher, K: int, Ks: int, j: int):
    """[N, N]: the teacher's r = K/Ks steps from t_{jr} to t_{(j+1)r} (one student step's worth)."""
    g, r = time_grid(K), K // Ks
    T = torch.eye(len(states.all), dtype=torch.float64)
    for k in range(j * r, (j + 1) * r):
        T = T @ states.transition(teacher, float(g[k]), float(g[k + 1]))
    return T


class TabularJointStudent(torch.nn.Module):
    model_kind = JOINT_STEP_DENOISER

    def __init__(self, states, student_steps: int, init=None):
        super().__init__()
        self.states, self.Ks = states, int(student_steps)
        N = len(states.all)
        shape = (self.Ks, N, 2**states.L, N, states.V)
        self.table = torch.nn.Parameter(torch.zeros(shape, dtype=torch.float64) if init is None else init)
        self.cfg = type("cfg", (), {"vocab_size": states.V})()
        self.bits = 2 ** torch.arange(states.L - 1, -1, -1)

    def forward(self, xt, t, *, reveal=None, tokens=None):
        B, L = xt.shape
        out = torch.zeros(B, L, self.states.V, dtype=torch.float64)
        if reveal is None:
            return out
        j, n = grid_start(t, self.Ks), self.states.index(xt)
        code = (reveal.long() * self.bits).sum(-1)
        ar = torch.arange(L)
        for i in range(L):
            partial = torch.where(reveal & (ar < i), tokens, xt)
            out[:, i] = torch.where(reveal[:, i, None], self.table[j, n, code, self.states.index(partial)], out[:, i])
        return out

    def open_step(self, xt, t, reveal):
        return _TableStep(self, xt, t, reveal)


class _TableStep:
    def __init__(self, student, xt, t, reveal):
        from tcsm.models.step_head import reveal_order

        self.student, self.partial, self.t = student, xt.clone(), t
        self.j, self.n = grid_start(t, student.Ks), student.states.index(xt)
        self.code = (reveal.long() * student.bits).sum(-1)
        self.positions, self.valid = reveal_order(reveal)
        self.size, self.calls = self.positions.shape[1], 0

    def logits(self, k, prev):
        rows = torch.arange(self.partial.shape[0])
        if k:
            before, ok = self.positions[:, k - 1], self.valid[:, k - 1]
            self.partial[rows[ok], before[ok]] = prev[ok]
        self.calls += 1
        return self.student.table[self.j, self.n, self.code, self.student.states.index(self.partial)]


def joint_step_matrix(states, student, Ks: int, j: int):
    """[N, N]: the joint student's step t_j → t_{j+1}: P(R) with λ, times its left-to-right law of y_R."""
    g = time_grid(Ks)
    lam = 1.0 if j == Ks - 1 else float((g[j + 1] - g[j]) / (1 - g[j]))
    N = len(states.all)
    codes = reveal_of(states)
    T = torch.zeros(N, N, dtype=torch.float64)
    bits = 2 ** torch.arange(states.L - 1, -1, -1)
    with torch.no_grad():
        for n in range(N):
            ok = codes[n] >= 0
            nxt = ok.nonzero().squeeze(1)
            R = (codes[n, nxt, None] & bits) > 0
            xt = states.all[n].expand(len(nxt), -1)
            logp = torch.log_softmax(student(xt, torch.full((len(nxt),), float(g[j])), reveal=R,
                                             tokens=states.all[nxt].clamp_max(states.V - 1)).double(), -1)  # fmt: skip
            y = logp.gather(-1, states.all[nxt].clamp_max(states.V - 1)[..., None])[..., 0]
            pr = reveal_law(states, n, lam)[codes[n, nxt]]
            T[n, nxt] = pr * (y * R).sum(-1).exp()
    return T


def exact_joint_table(states, step_matrices, Ks: int):
    """The table whose joint step from each (t_j, x_t) has the law of y_R | (x_t, R) of `step_matrices[j]` [N, N]
    (the conditional of each r_k's token given x_t, R and the tokens drawn at r_1..r_{k−1}); uniform where undefined."""
    N, L, V = len(states.all), states.L, states.V
    codes = reveal_of(states)
    bits = 2 ** torch.arange(L - 1, -1, -1)
    table = torch.zeros(Ks, N, 2**L, N, V, dtype=torch.float64)
    for j in range(Ks):
        T = step_matrices[j]
        for n in range(N):
            for m in (codes[n] >= 0).nonzero().squeeze(1).tolist():
                code = int(codes[n, m])
                R = (code & bits) > 0
                # for every k: the prefix state (R before r_k filled from x') and the token at r_k
                for i in R.nonzero().squeeze(1).tolist():
                    partial = torch.where(R & (torch.arange(L) < i), states.all[m], states.all[n])
                    table[j, n, code, states.index(partial), states.all[m, i]] += T[n, m]
    total = table.sum(-1, keepdim=True)
    return torch.where(total > 0, table / total.clamp_min(1e-300), torch.full_like(table, 1.0 / V)).clamp_min(
        1e-300).log()  # fmt: skip


def joint_law(states, student, Ks: int):
    p = states.prior()
    for j in range(Ks):
        p = p @ joint_step_matrix(states, student, Ks, j)
    return states.clean_law(p)


def sequential_conditionals(states, teacher, xt, R, y):
    """[L, V] float64: at each position i of R, the teacher's conditional at x_t with R's positions left of i set to
    y (its left-to-right fill's conditional there); 0 off R."""
    L = states.L
    out = torch.zeros(L, states.V, dtype=torch.float64)
    for i in R.nonzero().squeeze(1).tolist():
        partial = torch.where(R & (torch.arange(L) < i), y, xt)
        out[i] = torch.softmax(teacher(partial[None], torch.full((1,), 0.5, dtype=torch.float64)).double()[0, i], -1)
    return out


def sequential_step_matrix(states, teacher, Ks: int, j: int):
    """[N, N]: the teacher's left-to-right fill of one student step t_j → t_{j+1}: R with the student step's
    independent λ, then y_R one position at a time, left to right, each from the teacher's conditional at x_t with
    R's earlier positions set (MATH.md §10.1, "The teacher's left-to-right fill")."""
    g = time_grid(Ks)
    lam = 1.0 if j == Ks - 1 else float((g[j + 1] - g[j]) / (1 - g[j]))
    N, L, V = len(states.all), states.L, states.V
    codes = reveal_of(states)
    bits = 2 ** torch.arange(L - 1, -1, -1)
    T = torch.zeros(N, N, dtype=torch.float64)
    for n in range(N):
        pr = reveal_law(states, n, lam)
        for m in (codes[n] >= 0).nonzero().squeeze(1).tolist():
            R = (int(codes[n, m]) & bits) > 0
            y = states.all[m].clamp_max(V - 1)
            q = sequential_conditionals(states, teacher, states.all[n], R, y)
            T[n, m] = pr[int(codes[n, m])] * float(torch.where(R, q.gather(1, y[:, None])[:, 0], torch.ones(L)).prod())
    return T
