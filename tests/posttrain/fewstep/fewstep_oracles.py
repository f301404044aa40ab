"""Exact laws of per-token K-step samplers by enumeration over the noisy states (MATH.md §6.2, §10): one step is the
product over positions of the bridge Σ_a m^i(a) B(· | x_t^i, a), so a K-step law is a product of transition matrices
over the (V+1)^L (masked) or V^L (uniform) noisy states. Tiny V and L only."""

from __future__ import annotations

import itertools

import torch

from tcsm.sampling.common import time_grid


class NoisyStates:
    def __init__(self, path, length: int):
        self.path, self.L, self.V, self.S = path, int(length), path.vocab_size, path.num_states
        self.all = torch.tensor(list(itertools.product(range(self.S), repeat=self.L)), dtype=torch.long)
        self.radix = self.S ** torch.arange(self.L - 1, -1, -1)
        self.clean = (self.all < self.V).all(-1)

    def index(self, x):
        return (x.long() * self.radix).sum(-1)

    def point(self, x):
        p = torch.zeros(len(self.all), dtype=torch.float64)
        p[self.index(x.reshape(1, -1))] = 1.0
        return p

    def transition(self, denoiser, t: float, s: float):
        """T[n, n'] = P(x_s = state n' | x_t = state n) of one per-token step t → s."""
        N = len(self.all)
        tt = torch.full((N,), float(t), dtype=torch.float64)
        probs = torch.softmax(denoiser(self.all, tt).double(), -1).nan_to_num(1.0 / self.V)
        bridge = self.path.bridge(self.all, tt, torch.full((N,), float(s), dtype=torch.float64), probs)
        trans = torch.ones(N, N, dtype=torch.float64)
        for i in range(self.L):
            trans = trans * bridge[:, i, self.all[:, i]]
        return trans

    def law(self, denoiser, start, grid):
        """The law over noisy states after running `denoiser`'s sampler on `grid` from the law `start`."""
        p = start
        for k in range(len(grid) - 1):
            p = p @ self.transition(denoiser, float(grid[k]), float(grid[k + 1]))
        return p

    def clean_law(self, p):
        return p[self.clean]

    def marginals(self, p):
        """Per-position marginals [L, V] of a law over clean states."""
        onehot = torch.nn.functional.one_hot(self.all[self.clean], self.V).double()
        return torch.einsum("n,nlv->lv", self.clean_law(p), onehot)

    def prior(self):
        if self.path.mask_id is not None:
            return self.point(torch.full((self.L,), self.path.mask_id))
        p = torch.zeros(len(self.all), dtype=torch.float64)
        p[self.clean] = 1.0 / self.clean.sum()
        return p


def teacher_law_from(states: NoisyStates, denoiser, x, K: int, k: int, window: int | None = None):
    """The law of x_1 of the teacher's K-step sampler started at x on its grid point t_k (with a window: at most
    `window` of its steps, then the step to 1)."""
    g = time_grid(K)
    g = g[k:] if window is None or k + window >= K else torch.cat([g[k : k + window + 1], torch.ones(1, dtype=g.dtype)])
    return states.law(denoiser, states.point(x), g)


def tv(p, q) -> float:
    return 0.5 * float((p - q).detach().abs().sum())


def target_table(states: NoisyStates, teacher, K: int, Ks: int, window: int | None = None):
    """[Ks, N, L, V]: per student grid point j and noisy state, the marginals of the teacher's K-step law from that
    state at t_{j·K/Ks} (the per-position target a factorised student matches; uniform where undefined)."""
    table = torch.zeros(Ks, len(states.all), states.L, states.V, dtype=torch.float64)
    for j in range(Ks):
        for n, x in enumerate(states.all):
            law = teacher_law_from(states, teacher, x, K, j * (K // Ks), window)
            table[j, n] = states.marginals(law).nan_to_num(1.0 / states.V)
    return table


class TableDenoiser:
    """Logits log table[j, state] at the student grid point j = ⌊t·Ks⌋: a student that is exactly a target table."""

    def __init__(self, states: NoisyStates, table):
        self.states, self.Ks, self.log_table = states, table.shape[0], table.clamp_min(1e-300).log()

    def __call__(self, xt, t):
        j = (t.double() * self.Ks).floor().clamp(0, self.Ks - 1).long()
        return self.log_table[j, self.states.index(xt)]


def fit(objective, student, dist, steps: int = 150, lr: float = 0.2, batch: int = 1024, seed: int = 0) -> dict:
    """Adam on `objective` over fresh draws of `dist`, the learning rate decayed to zero (no SGD noise left at the
    end); the last step's metrics."""
    from tcsm.core.batch import Batch

    opt = torch.optim.Adam(student.parameters(), lr=lr)
    decay = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1 - i / steps)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        loss, metrics = objective(student, Batch(x1=dist.sample(batch, generator=g)), g)
        opt.zero_grad()
        loss.backward()
        opt.step()
        decay.step()
    return metrics


def check_calls(calls, steps: int, masked: bool, *, to_end: bool = True) -> None:
    """The teacher calls a rollout reports per row [B]: on a masked path one per step that reveals something in the
    row (at least one when it runs to t = 1 from a masked state, fewer than `steps` in some row of a large batch),
    on a uniform one every step."""
    if not masked:
        assert (calls == steps).all()
        return
    assert (calls <= steps).all() and (calls < steps).any()
    if to_end:
        assert (calls >= 1).all()
