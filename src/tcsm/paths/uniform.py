"""The uniform source: kernels, bridges, the prior KL, and the integrands of its two bounds, the time reversal
(MATH.md §2.3 B) and DFM (§2.3 A), computed in closed, cancellation-free pieces.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tcsm.paths.base import ProbabilityPath, _col, _log_m, _log_mass_except, _uniform01
from tcsm.paths.schedules import Schedule


class UniformPath(ProbabilityPath):
    """Uniform source: k_t(x_t | x_1) = α_t 1[x_t = x_1] + (1 − α_t) / V over the clean tokens."""

    kind = "uniform"
    bounds = ("reversal", "dfm")

    def __init__(self, vocab_size: int, schedule: Schedule | None = None, block_length: int | None = None):
        super().__init__(vocab_size, schedule, block_length)
        self.mask_id = None
        self.num_states = self.vocab_size

    def prior_sample(self, batch_size, length, device=None, generator=None):
        return torch.randint(0, self.vocab_size, (batch_size, length), device=device, generator=generator)

    def noise(self, xs, s, t, generator=None):
        # p(x_t | x_s) = (α_t/α_s) 1[x_t = x_s] + (1 − α_t/α_s) / V.
        a_s, a_t = self.alpha(s), self.alpha(t)
        keep_p = torch.where(a_s > 0, a_t / a_s.clamp_min(torch.finfo(a_s.dtype).tiny), torch.zeros_like(a_s))
        keep = _uniform01(xs.shape, xs.device, generator) < _col(keep_p, xs)
        fresh = torch.randint(0, self.vocab_size, xs.shape, device=xs.device, generator=generator)
        return torch.where(keep, xs, fresh)

    def boost(self, t: Tensor) -> Tensor:
        """b_t = V α_t / (1 − α_t): likelihood boost of the observed token (MATH.md §0)."""
        onem = self.schedule.one_minus_alpha(t).clamp_min(torch.finfo(t.dtype).tiny)
        return self.vocab_size * self.alpha(t) / onem

    def reversal_rate(self, t: Tensor) -> Tensor:
        """c_t = α̇_t / (V α_t): forward jump rate to each other token, run backwards in t (MATH.md §1.2)."""
        return self.schedule.alpha_dot(t) / (self.vocab_size * self.alpha(t).clamp_min(torch.finfo(t.dtype).tiny))

    def log_kernel(self, xt, t):
        V = self.vocab_size
        a = _col(self.alpha(t), xt).unsqueeze(-1)
        base = _col(self.schedule.one_minus_alpha(t), xt).unsqueeze(-1) / V
        hit = (xt.unsqueeze(-1) == torch.arange(V, device=xt.device)).to(a.dtype)
        return torch.log(base + a * hit)

    def free(self, xt):
        return torch.ones_like(xt, dtype=torch.bool)

    def corrupt_prob(self, t):
        # A redraw hits x_1 again with probability 1/V.
        V = self.vocab_size
        return self.schedule.one_minus_alpha(t).clamp(0.0, 1.0) * (V - 1) / V

    def corrupt(self, x1, t, generator=None):
        V = self.vocab_size
        shift = torch.randint(1, V, x1.shape, generator=generator, device=x1.device)
        return (x1 + shift) % V  # uniform over the V − 1 other tokens

    def prior_kl(self, x1, dtype=torch.float64):
        # L Σ_y k_0(y|x) log(V k_0(y|x)), the same for every x.
        B, L = x1.shape
        a0 = self._alpha0(dtype, x1.device)
        if a0 <= 0.0:
            return torch.zeros(B, dtype=dtype, device=x1.device)
        V = self.vocab_size
        hit = a0 + (1.0 - a0) / V
        kl = hit * math.log(V * hit) + (V - 1) * (1.0 - a0) / V * math.log1p(-a0)
        return torch.full((B,), L * kl, dtype=dtype, device=x1.device)

    def bound_integrand(self, bound, logits, x1, xt, t):
        """"reversal" (§2.3 B, the analytic sampler's): w = c_t = α̇_t/(Vα_t), G = Σ_i Σ_{y≠x_t^i}
        D_GKL(r^i_y ‖ ŝ^i_y). "dfm" (§2.3 A, the Euler sampler's): w = κ_t, G = Σ_i g^i_t."""
        if bound == "dfm":
            return self.kappa(t), _dfm_g(logits, x1, xt, t.dtype).sum(-1)
        if bound != "reversal":
            raise ValueError(f"the uniform source has no bound {bound!r}")
        return _reversal_terms(self.schedule, self.vocab_size, logits, x1, xt, t)

    def bridge(self, xt, t, s, probs):
        # p(y) = [r 1[x=y] + (1−r)/V] · [α_s w(y) + (1−α_s)/V Σ_a w(a)],  w(a) = m(a) / k_t(x | a), r = α_t/α_s.
        V = self.vocab_size
        dt = probs.dtype
        a_t = _col(self.alpha(t), xt).unsqueeze(-1).to(dt)
        a_s = _col(self.alpha(s), xt).unsqueeze(-1).to(dt)
        onem_s = _col(self.schedule.one_minus_alpha(s), xt).unsqueeze(-1).to(dt)
        r = torch.where(a_s > 0, a_t / a_s.clamp_min(torch.finfo(dt).tiny), torch.zeros_like(a_s))
        hit = torch.nn.functional.one_hot(xt, V).to(dt)
        k_t = a_t * hit + (1.0 - a_t) / V
        w = probs / k_t
        cleaner = a_s * w + onem_s / V * w.sum(-1, keepdim=True)
        out = (r * hit + (1.0 - r) / V) * cleaner
        return out / out.sum(-1, keepdim=True)


# Elements per [rows, L, V] float64 temporary of the time-reversal bound (bounds its memory to ~128 MiB each).
_VDIM_BLOCK = 1 << 24


def _dfm_g(logits: Tensor, x1: Tensor, xt: Tensor, wd: torch.dtype) -> Tensor:
    """g^i_t = 1 − m(x_t) if x_t = x_1, else −log m(x_1) − m(x_t), per token [B, L] (MATH.md §2.3 A)."""
    lg, lse = _log_m(logits, torch.float32)
    log_mx = (lg.gather(-1, xt.unsqueeze(-1)).squeeze(-1) - lse).to(wd)
    log_mz = (lg.gather(-1, x1.unsqueeze(-1)).squeeze(-1) - lse).to(wd)
    om_x = _log_mass_except(lg, lse, xt).to(wd).exp()
    return torch.where(xt == x1, om_x, -log_mz - log_mx.exp())


def _reversal_terms(sched: Schedule, V: int, logits, x1, xt, t) -> tuple[Tensor, Tensor]:
    """(c_t, Σ_i Σ_{y≠x} GKL(r_y ‖ ŝ_y)) of the uniform time-reversal bound (MATH.md §2.3 B), in closed,
    cancellation-free pieces."""
    wd = t.dtype
    tiny = torch.finfo(wd).tiny
    alpha, oma_c, adot = sched.alpha(t), sched.one_minus_alpha(t).clamp_min(tiny), sched.alpha_dot(t)
    b = V * alpha / oma_c  # boost b_t
    rho = oma_c / (oma_c + V * alpha)  # 1 / (1 + b)
    omrho = V * alpha / (oma_c + V * alpha)  # b / (1 + b)
    c = adot / (V * alpha.clamp_min(tiny))
    # The [rows, L, V] float64 temporaries are built a slice of rows at a time to bound their memory.
    n = xt.shape[0]
    step = max(1, _VDIM_BLOCK // max(1, xt.shape[1] * V))
    parts = []
    for i in range(0, n, step):
        sl = slice(i, i + step)
        parts.append(_reversal_gkl(logits[sl], xt[sl], x1[sl], b[sl], rho[sl], omrho[sl], wd))
    G = torch.cat(parts) if parts else torch.zeros(0, dtype=wd, device=xt.device)
    return c, G


def _reversal_gkl(logits, x, z, b, rho, omrho, wd) -> Tensor:
    """Σ_i Σ_{y≠x^i} D_GKL(r^i_y ‖ ŝ^i_y) per row (MATH.md §2.3 B); b, rho = 1/(1+b), omrho = b/(1+b) per row."""
    V = logits.shape[-1]
    lg = logits.to(wd)
    lse = torch.logsumexp(lg, dim=-1)
    m = (lg - lse.unsqueeze(-1)).exp()  # [n, L, V]
    b3, rho3, omrho3 = b[:, None, None], rho[:, None, None], omrho[:, None, None]
    m_x = m.gather(-1, x.unsqueeze(-1))  # [n, L, 1]
    om_x = _log_mass_except(lg, lse, x).exp().unsqueeze(-1)  # 1 − m(x), accurately
    om_z = _log_mass_except(lg, lse, z).exp().unsqueeze(-1)
    ys = torch.arange(V, device=x.device)
    is_x = ys == x.unsqueeze(-1)
    is_z = ys == z.unsqueeze(-1)
    eq = (x == z).unsqueeze(-1)

    # ŝ_y = 1 + b m_y − b/(1+b) m_x = 1/(1+b) + b/(1+b)(1 − m_x) + b m_y: a sum of non-negative terms.
    s = rho3 + omrho3 * om_x + b3 * m
    one = torch.ones((), dtype=wd, device=x.device)
    # r_y: x = x_1 → 1/(1+b) for every y ≠ x; x ≠ x_1 → 1 + b at y = x_1, 1 elsewhere.
    r = torch.where(eq, rho3, torch.where(is_z, 1.0 + b3, one))
    # ŝ − r, with each case's cancellation done by hand.
    s_minus_r = torch.where(
        eq,
        omrho3 * om_x + b3 * m,
        torch.where(is_z, -omrho3 * m_x - b3 * om_z, b3 * m - omrho3 * m_x),
    )
    d = s_minus_r / r
    # log(ŝ/r): log1p where ŝ ≈ r (t → 0, where GKL ~ (ŝ − r)²), a plain difference elsewhere.
    log_ratio = torch.where(d.abs() < 0.5, torch.log1p(d.clamp_min(-0.5)), torch.log(s) - torch.log(r))
    gkl = torch.where(is_x, torch.zeros((), dtype=wd, device=x.device), s_minus_r - r * log_ratio)
    return gkl.sum((-1, -2))
