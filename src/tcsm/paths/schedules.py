"""Noise schedules α_t on t ∈ [0, 1] with α_0 = 0 (source) and α_1 = 1 (clean data).

Every schedule exposes α_t, 1 − α_t (computed in closed form, not by subtraction, so that it stays
accurate near t = 1), α̇_t and κ_t = α̇_t / (1 − α_t) (MATH.md §0). Inputs are tensors of any shape; the
outputs have the same shape and dtype. κ_t diverges at t = 1 for every schedule here; it is returned
finite by flooring 1 − α_t at the dtype's smallest normal number, which only matters at t = 1 exactly.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tcsm.core.parts import Parts


class Schedule:
    """Base class: subclasses implement `alpha`, `one_minus_alpha` and `alpha_dot`."""

    #: α at t = 0; non-zero only for deliberately clipped schedules (likelihood adds the prior term).
    alpha_min: float = 0.0

    def alpha(self, t: Tensor) -> Tensor:
        raise NotImplementedError

    def one_minus_alpha(self, t: Tensor) -> Tensor:
        return 1.0 - self.alpha(t)

    def alpha_dot(self, t: Tensor) -> Tensor:
        raise NotImplementedError

    def kappa(self, t: Tensor) -> Tensor:
        """κ_t = α̇_t / (1 − α_t), the jump intensity and masked-ELBO weight (MATH.md §0, §3.4)."""
        denom = self.one_minus_alpha(t).clamp_min(torch.finfo(t.dtype).tiny)
        return self.alpha_dot(t) / denom

    def sigma(self, t: Tensor) -> Tensor:
        """σ(t) = −log(1 − α_t), the clock in which κ_t dt = dσ (MATH.md §0)."""
        return -torch.log(self.one_minus_alpha(t).clamp_min(torch.finfo(t.dtype).tiny))

    def alpha_inverse(self, a: Tensor) -> Tensor:
        """t with α_t = a (a clamped to [α_0, 1]): the time at which a fraction a of the tokens is clean in
        expectation (MATH.md §0). α is increasing; this base version bisects (60 halvings, float64), subclasses
        with a closed form override it."""
        target = a.double().clamp(float(self.alpha(torch.zeros((), dtype=torch.float64))), 1.0)
        lo, hi = torch.zeros_like(target), torch.ones_like(target)
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            below = self.alpha(mid) < target
            lo, hi = torch.where(below, mid, lo), torch.where(below, hi, mid)
        return (0.5 * (lo + hi)).to(a.dtype)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


class LinearSchedule(Schedule):
    """α_t = t, κ_t = 1 / (1 − t)."""

    def alpha(self, t: Tensor) -> Tensor:
        return t.clone()

    def one_minus_alpha(self, t: Tensor) -> Tensor:
        return 1.0 - t

    def alpha_dot(self, t: Tensor) -> Tensor:
        return torch.ones_like(t)

    def alpha_inverse(self, a: Tensor) -> Tensor:
        return a.clamp(0.0, 1.0)


class CosineSchedule(Schedule):
    """α_t = 1 − cos(πt/2), κ_t = (π/2) tan(πt/2): MD4's cosine schedule (Shi et al. 2024), in this library's
    time direction (t = 1 clean; MD4 writes α_t = 1 − cos(π(1 − t)/2) with t = 0 clean).

    Near the clean end it corrupts faster than linear: α̇_1 = π/2 ≈ 1.57 against linear's 1, so a step back
    from t = 1 masks π/2 times as many tokens. Near the source end it is slower (α̇_0 = 0): it lingers where
    almost everything is noise. MDLM's `CosineNoise` is the other one, α_t = sin(πt/2) here (MDLM writes
    α_t = cos(πt/2) with t = 0 clean), which is slower near the clean end (α̇_1 = 0) and starts at π/2.
    """

    def alpha(self, t: Tensor) -> Tensor:
        # 2 sin²(πt/4) keeps relative accuracy near t = 0; the other branch makes α_1 = 1 exactly.
        return torch.where(t < 0.5, 2.0 * torch.sin(0.25 * math.pi * t) ** 2, 1.0 - self.one_minus_alpha(t))

    def one_minus_alpha(self, t: Tensor) -> Tensor:
        # cos(πt/2) = sin(π(1 − t)/2): exactly 0 at t = 1 and accurate near it (cos(π/2) rounds to 6e-17).
        return torch.sin(0.5 * math.pi * (1.0 - t)).clamp_min(0.0)

    def alpha_dot(self, t: Tensor) -> Tensor:
        return 0.5 * math.pi * torch.sin(0.5 * math.pi * t)

    def alpha_inverse(self, a: Tensor) -> Tensor:
        return torch.arccos((1.0 - a).clamp(0.0, 1.0)) * (2.0 / math.pi)


class PolynomialSchedule(Schedule):
    """α_t = t^p (p > 0), κ_t = p t^(p−1) / (1 − t^p)."""

    def __init__(self, exponent: float = 2.0):
        if not exponent > 0:
            raise ValueError(f"PolynomialSchedule exponent must be > 0, got {exponent}")
        self.exponent = float(exponent)

    def alpha(self, t: Tensor) -> Tensor:
        return t.pow(self.exponent)

    def one_minus_alpha(self, t: Tensor) -> Tensor:
        # 1 − t^p = −expm1(p log t): accurate as t → 1.
        return -torch.expm1(self.exponent * torch.log(t.clamp_min(torch.finfo(t.dtype).tiny)))

    def alpha_dot(self, t: Tensor) -> Tensor:
        p = self.exponent
        if p == 1.0:
            return torch.ones_like(t)
        return p * t.clamp_min(torch.finfo(t.dtype).tiny).pow(p - 1.0)

    def alpha_inverse(self, a: Tensor) -> Tensor:
        return a.clamp(0.0, 1.0).pow(1.0 / self.exponent)


class LogLinearSchedule(Schedule):
    """MDLM's log-linear noise: σ(t) = −log(1 − α_t) with α_t = 1 − (1 − ε)(1 − t).

    MDLM uses ε = 1e-3, which leaves α_0 = ε > 0 (a clipped start whose prior term the likelihood bound
    must then add; for the masked source that term is infinite). The default ε = 0 gives α_0 = 0
    exactly, where the schedule coincides with `LinearSchedule` but is stated in MDLM's σ-form.
    """

    def __init__(self, eps: float = 0.0):
        if not 0.0 <= eps < 1.0:
            raise ValueError(f"LogLinearSchedule eps must be in [0, 1), got {eps}")
        self.eps = float(eps)
        self.alpha_min = float(eps)

    def alpha(self, t: Tensor) -> Tensor:
        return 1.0 - (1.0 - self.eps) * (1.0 - t)

    def one_minus_alpha(self, t: Tensor) -> Tensor:
        return (1.0 - self.eps) * (1.0 - t)

    def alpha_dot(self, t: Tensor) -> Tensor:
        return torch.full_like(t, 1.0 - self.eps)

    def alpha_inverse(self, a: Tensor) -> Tensor:
        return (1.0 - (1.0 - a.clamp(self.eps, 1.0)) / (1.0 - self.eps)).clamp(0.0, 1.0)


SCHEDULES = Parts(
    "schedule",
    {"linear": LinearSchedule, "cosine": CosineSchedule, "polynomial": PolynomialSchedule, "loglinear": LogLinearSchedule},
)


def make_schedule(name: str, **kwargs) -> Schedule:
    """Build a schedule by name: one of `SCHEDULES`."""
    return SCHEDULES.lookup(name)(**kwargs)
