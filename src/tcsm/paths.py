"""Probability paths p_{t|1}(x_t | x_1) = Π_i k_t(x_t^i | x_1^i) for the masked and uniform sources.

Time runs from t = 0 (source) to t = 1 (clean data). The clean vocabulary is {0, …, V−1}; the masked
source adds one input-only symbol, the mask, with index V (MATH.md §0, §1). Denoisers output logits over the
V clean tokens only. Everything that depends on the source lives here, so that the likelihood estimator
and the samplers are generic: the kernel and its draws, the bridge, which positions are still free, the
prior term, and the per-(t, x_t) integrands of the path's likelihood bounds (MATH.md §2). Nothing in this
module holds learnable state.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tcsm.schedules import (  # noqa: F401  (re-exported: the public API names schedules in tcsm.paths)
    SCHEDULES,
    CosineSchedule,
    LinearSchedule,
    LogLinearSchedule,
    PolynomialSchedule,
    Schedule,
    make_schedule,
)

__all__ = [
    "CosineSchedule",
    "LinearSchedule",
    "LogLinearSchedule",
    "MaskedPath",
    "PolynomialSchedule",
    "ProbabilityPath",
    "Schedule",
    "UniformPath",
    "make_path",
    "make_schedule",
]


def _col(v: Tensor, like: Tensor) -> Tensor:
    """Reshape a per-sequence value [B] so that it broadcasts against [B, L, ...]."""
    return v.reshape(v.shape + (1,) * (like.dim() - v.dim()))


def _uniform01(shape, device, generator) -> Tensor:
    return torch.rand(shape, device=device, generator=generator)


class ProbabilityPath:
    """Common interface of the sources. `t` is always a per-sequence tensor of shape [B].

    A new source implements the methods that raise NotImplementedError and sets the class attributes below;
    the defaults of the boolean attributes are the conservative (always correct, possibly slower) choice.
    docs/DESIGN.md "Adding a noise source" lists the interface.
    """

    kind: str  # a label for printing and configs only; code never branches on it
    vocab_size: int
    num_states: int  # size of the noisy (input) alphabet
    mask_id: int | None  # index of the mask in the noisy alphabet, if the source has one

    #: Names of the likelihood bounds this source admits (MATH.md §2); the first is the default.
    bounds: tuple[str, ...] = ()
    #: Whether p_{1|t}(·|x_t) depends on t. If not (masked, §1.3), a denoiser that ignores t can be exact and a
    #: sampler may reuse its output while x_t does not change (§6.2 cache; `tcsm.sampling.may_cache`).
    posterior_depends_on_t: bool = True
    #: Whether a free token can only jump straight to its clean value and then stays (absorbing source): the
    #: bridge from a free position is then λ δ_{x̂} + (1 − λ) δ_{x_t}, which samplers run in sparse form (§6.2).
    absorbing: bool = False
    #: Whether every bound's integrand G(t, x_t) vanishes at x_t = x_1, so that the likelihood estimator
    #: need never draw the uncorrupted x_t (§2.4).
    integrand_zero_at_x1: bool = False
    #: Whether k_t(x_t^i | y) is the same for every clean y at a free position (masked: the mask comes from any
    #: token alike). Kernel-tilted estimators (`objectives.score_loss`, tilt) are then the untilted ones.
    kernel_flat_on_free: bool = False

    def __init__(self, vocab_size: int, schedule: Schedule | None = None):
        if int(vocab_size) < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        self.vocab_size = int(vocab_size)
        self.schedule = schedule if schedule is not None else LinearSchedule()

    # --- schedule shortcuts -------------------------------------------------------------------------
    def alpha(self, t: Tensor) -> Tensor:
        return self.schedule.alpha(t)

    def kappa(self, t: Tensor) -> Tensor:
        """κ_t = α̇_t / (1 − α_t) (MATH.md §0)."""
        return self.schedule.kappa(t)

    # --- interface ----------------------------------------------------------------------------------
    def sample(self, x1: Tensor, t: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Draw x_t ~ p_{t|1}(· | x_1) independently per token (MATH.md §1.1)."""
        return self.noise(x1, torch.ones_like(t), t, generator)

    def prior_sample(self, batch_size: int, length: int, device=None, generator=None) -> Tensor:
        """Draw x_0 ~ p_0."""
        raise NotImplementedError

    def noise(self, xs: Tensor, s: Tensor, t: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Noising chain: draw x_t ~ p(x_t | x_s) for t ≤ s (x_s is the cleaner state; MATH.md §1.1)."""
        raise NotImplementedError

    def log_kernel(self, xt: Tensor, t: Tensor) -> Tensor:
        """log k_t(x_t^i | y) for every clean y: FloatTensor[B, L, V] (MATH.md §1.1)."""
        raise NotImplementedError

    def free(self, xt: Tensor) -> Tensor:
        """Positions whose clean token is not yet determined by x_t^i, i.e. p_{1|t}(x_1^i = x_t^i | x_t) < 1
        in general: the ones a sampler may still change (masked: x_t^i = M; uniform: all; MATH.md §1.3)."""
        raise NotImplementedError

    def loss_mask(self, xt: Tensor) -> Tensor:
        """Positions whose N^1 target is not a point mass: exactly the `free` ones (MATH.md §1.3)."""
        return self.free(xt)

    def corrupt_prob(self, t: Tensor) -> Tensor:
        """e_t = P(x_t^i ≠ x_1^i) = 1 − k_t(x_1 | x_1) per token, [B] (MATH.md §1.1)."""
        raise NotImplementedError

    def corrupt(self, x1: Tensor, t: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Draw x_t ~ k_t(· | x_1, x_t ≠ x_1) for every token of x1 [B, L] (MATH.md §1.1)."""
        raise NotImplementedError

    def jump_prob(self, t: Tensor, s: Tensor) -> Tensor:
        """λ_{t→s} = (α_s − α_t)/(1 − α_t), s > t: probability that a free token resolves by s, the exact
        1 − exp(−∫_t^s κ) of a mixture path (MATH.md §0, §6.1)."""
        onem = self.schedule.one_minus_alpha(t)
        lam = (self.alpha(s) - self.alpha(t)) / onem.clamp_min(torch.finfo(onem.dtype).tiny)
        return lam.clamp(0.0, 1.0)

    def prior_kl(self, x1: Tensor, dtype: torch.dtype = torch.float64) -> Tensor:
        """KL(p_{0|1}(·|x_1) ‖ p_0) per sequence [B]: zero when α_0 = 0 (MATH.md §2.1); ValueError if infinite."""
        raise NotImplementedError

    def bound_integrand(self, bound: str, logits: Tensor, x1: Tensor, xt: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        """(w(t), G(t, x_t)), each [B] in t's dtype, of bound `bound` ∈ `bounds`: the bound is
        ∫_0^1 w(t) E_{x_t ~ p_{t|1}}[G] dt (MATH.md §2.1). `logits` [B, L, V] are the denoiser's at (x_t, t)."""
        raise NotImplementedError

    def _alpha0(self, dtype: torch.dtype, device) -> float:
        return float(self.schedule.alpha(torch.zeros(1, dtype=dtype, device=device))[0])

    def bridge(self, xt: Tensor, t: Tensor, s: Tensor, probs: Tensor) -> Tensor:
        """p(x_s^i = y | x_t) = Σ_a m^i(a) B(y | x_t^i, a), s ≥ t, for clean-token probabilities m^i = `probs`
        [B, L, V]; returns probabilities over the noisy alphabet [B, L, num_states] (MATH.md §6.2)."""
        raise NotImplementedError

    def target_conditional(self, log_p1_cond: Tensor, xt: Tensor, t: Tensor) -> Tensor:
        """log q^i(y) = log softmax_y[log p_1(y | x_1^{≠i}) + log k_t(x_t^i | y)] (MATH.md §1.3, §4).

        `log_p1_cond` [B, L, V] holds the clean-data single-site conditionals; the result is the N^1
        posterior target. For the masked source it is p_1(· | x_1^{≠i}) at masked positions and δ_{x_t^i}
        elsewhere.
        """
        return torch.log_softmax(log_p1_cond + self.log_kernel(xt, t).to(log_p1_cond.dtype), dim=-1)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, schedule={self.schedule!r})"


class MaskedPath(ProbabilityPath):
    """Absorbing source: k_t(x_t | x_1) = α_t 1[x_t = x_1] + (1 − α_t) 1[x_t = M], mask id = V."""

    kind = "masked"
    bounds = ("masked",)
    posterior_depends_on_t = False
    absorbing = True
    integrand_zero_at_x1 = True  # nothing masked: the carry-over model CTMC has nothing to pay
    kernel_flat_on_free = True

    def __init__(self, vocab_size: int, schedule: Schedule | None = None):
        super().__init__(vocab_size, schedule)
        self.mask_id = self.vocab_size
        self.num_states = self.vocab_size + 1

    def prior_sample(self, batch_size, length, device=None, generator=None):
        return torch.full((batch_size, length), self.mask_id, dtype=torch.long, device=device)

    def noise(self, xs, s, t, generator=None):
        # An unmasked token at s survives to t with probability α_t / α_s.
        a_s, a_t = self.alpha(s), self.alpha(t)
        keep_p = torch.where(a_s > 0, a_t / a_s.clamp_min(torch.finfo(a_s.dtype).tiny), torch.zeros_like(a_s))
        keep = _uniform01(xs.shape, xs.device, generator) < _col(keep_p, xs)
        return torch.where(keep, xs, torch.full_like(xs, self.mask_id))

    def log_kernel(self, xt, t):
        a = _col(self.alpha(t), xt).unsqueeze(-1)
        onem = _col(self.schedule.one_minus_alpha(t), xt).unsqueeze(-1)
        V = self.vocab_size
        ys = torch.arange(V, device=xt.device)
        is_mask = (xt == self.mask_id).unsqueeze(-1)
        hit = xt.unsqueeze(-1) == ys
        out = torch.where(hit, torch.log(a).expand(hit.shape), torch.full(hit.shape, -torch.inf, device=xt.device))
        return torch.where(is_mask, torch.log(onem).expand(hit.shape), out)

    def free(self, xt):
        return xt == self.mask_id

    def corrupt_prob(self, t):
        return self.schedule.one_minus_alpha(t).clamp(0.0, 1.0)

    def corrupt(self, x1, t, generator=None):
        return torch.full_like(x1, self.mask_id)

    def reveal_prob(self, t: Tensor, s: Tensor) -> Tensor:
        """λ_{t→s} = (α_s − α_t) / (1 − α_t): probability that a masked token at t is revealed by s."""
        return self.jump_prob(t, s)

    def prior_kl(self, x1, dtype=torch.float64):
        a0 = self._alpha0(dtype, x1.device)
        if a0 > 0.0:
            raise ValueError(
                f"schedule {self.schedule!r} starts at α_0 = {a0:.3g} > 0: for the masked source the prior term "
                "KL(p_0|1 ‖ δ_mask) is infinite, so no valid bound exists (MATH.md §2.1, §8.21); use α_0 = 0 "
                "(e.g. LogLinearSchedule(eps=0))"
            )
        return torch.zeros(x1.shape[0], dtype=dtype, device=x1.device)

    def bound_integrand(self, bound, logits, x1, xt, t):
        """"masked" (§2.2): w = κ_t, G = Σ_{i: x_t^i = M} −log m^i(x_1^i | x_t); unmasked positions are copied
        by the carry-over model CTMC and contribute nothing."""
        if bound != "masked":
            raise ValueError(f"the masked source has no bound {bound!r}")
        wd = t.dtype
        lg, lse = _log_m(logits, torch.float32)
        nll = lse - lg.gather(-1, x1.unsqueeze(-1)).squeeze(-1)
        g = torch.where(xt == self.mask_id, nll.to(wd), torch.zeros((), dtype=wd, device=xt.device))
        return self.kappa(t), g.sum(-1)

    def bridge(self, xt, t, s, probs):
        lam = _col(self.jump_prob(t, s), xt).unsqueeze(-1).to(probs.dtype)
        out = torch.cat([lam * probs, (1.0 - lam).expand(probs.shape[:-1] + (1,))], dim=-1)
        carried = torch.nn.functional.one_hot(xt, self.num_states).to(probs.dtype)
        return torch.where((xt == self.mask_id).unsqueeze(-1), out, carried)


class UniformPath(ProbabilityPath):
    """Uniform source: k_t(x_t | x_1) = α_t 1[x_t = x_1] + (1 − α_t) / V over the clean tokens."""

    kind = "uniform"
    bounds = ("reversal", "dfm")

    def __init__(self, vocab_size: int, schedule: Schedule | None = None):
        super().__init__(vocab_size, schedule)
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


# --- likelihood-bound integrands (MATH.md §2.2, §2.3), named by the paths' `bound_integrand` ------------------

# Elements per [rows, L, V] float64 temporary of the time-reversal bound (bounds its memory to ~128 MiB each).
_VDIM_BLOCK = 1 << 24


def _log_m(logits: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(logits, logsumexp) in at least `dtype` (bf16/fp16 model outputs are upcast first)."""
    logits = logits.to(torch.promote_types(logits.dtype, dtype))
    return logits, torch.logsumexp(logits, dim=-1)


def _log_mass_except(logits: Tensor, lse: Tensor, idx: Tensor) -> Tensor:
    """log Σ_{y≠idx} m(y), computed without the cancellation of log(1 − m(idx))."""
    excl = logits.scatter(-1, idx.unsqueeze(-1), -torch.inf)
    return torch.logsumexp(excl, dim=-1) - lse


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


PATHS = {"masked": MaskedPath, "uniform": UniformPath}


def make_path(kind: str, vocab_size: int, schedule: Schedule | str | None = None, **schedule_kwargs) -> ProbabilityPath:
    """Build a path by source name ("masked" | "uniform") and schedule (object or name)."""
    if kind not in PATHS:
        raise ValueError(f"unknown source {kind!r}; choose one of {sorted(PATHS)}")
    if isinstance(schedule, str):
        schedule = make_schedule(schedule, **schedule_kwargs)
    return PATHS[kind](vocab_size, schedule)
