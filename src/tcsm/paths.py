"""Probability paths p_{t|1}(x_t | x_1) = Π_i k_t(x_t^i | x_1^i) for the masked and uniform sources.

Time runs from t = 0 (source) to t = 1 (clean data). The clean vocabulary is {0, …, V−1}; the masked
source adds one input-only symbol, the mask, with index V (MATH.md §0, §1). Denoisers output logits over the
V clean tokens only. Per-token math lives here; nothing in this module holds learnable state.
"""

from __future__ import annotations

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
    "ProbabilityPath",
    "PolynomialSchedule",
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
    """Common interface of the two sources. `t` is always a per-sequence tensor of shape [B]."""

    kind: str
    vocab_size: int
    num_states: int  # size of the noisy (input) alphabet
    mask_id: int | None

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

    def loss_mask(self, xt: Tensor) -> Tensor:
        """Positions whose N^1 target is not a point mass (masked: x_t^i = M; uniform: all)."""
        raise NotImplementedError

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

    def loss_mask(self, xt):
        return xt == self.mask_id

    def reveal_prob(self, t: Tensor, s: Tensor) -> Tensor:
        """λ_{t→s} = (α_s − α_t) / (1 − α_t): probability that a masked token at t is revealed by s."""
        onem_t = self.schedule.one_minus_alpha(t)
        lam = (self.alpha(s) - self.alpha(t)) / onem_t.clamp_min(torch.finfo(onem_t.dtype).tiny)
        return lam.clamp(0.0, 1.0)

    def bridge(self, xt, t, s, probs):
        lam = _col(self.reveal_prob(t, s), xt).unsqueeze(-1).to(probs.dtype)
        out = torch.cat([lam * probs, (1.0 - lam).expand(probs.shape[:-1] + (1,))], dim=-1)
        carried = torch.nn.functional.one_hot(xt, self.num_states).to(probs.dtype)
        return torch.where((xt == self.mask_id).unsqueeze(-1), out, carried)


class UniformPath(ProbabilityPath):
    """Uniform source: k_t(x_t | x_1) = α_t 1[x_t = x_1] + (1 − α_t) / V over the clean tokens."""

    kind = "uniform"

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

    def loss_mask(self, xt):
        return torch.ones_like(xt, dtype=torch.bool)

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


PATHS = {"masked": MaskedPath, "uniform": UniformPath}


def make_path(kind: str, vocab_size: int, schedule: Schedule | str | None = None, **schedule_kwargs) -> ProbabilityPath:
    """Build a path by source name ("masked" | "uniform") and schedule (object or name)."""
    if kind not in PATHS:
        raise ValueError(f"unknown source {kind!r}; choose one of {sorted(PATHS)}")
    if isinstance(schedule, str):
        schedule = make_schedule(schedule, **schedule_kwargs)
    return PATHS[kind](vocab_size, schedule)
