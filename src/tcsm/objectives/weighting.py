"""Time weightings ω(path, t) of the objective (κ_t, unit, α̇_t; MATH.md §3.5, §7) and the per-sequence reduction.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from tcsm.core.parts import Parts
from tcsm.objectives.losses import _masked
from tcsm.paths import ProbabilityPath
from tcsm.targets.base import TargetBatch

WeightFn = Callable[[ProbabilityPath, Tensor], Tensor]



def kappa_weight(path: ProbabilityPath, t: Tensor) -> Tensor:
    """ω(t) = κ_t = α̇_t/(1 − α_t): the ELBO weight (MATH.md §3.4, §7); with masked L_distrib this is MDLM's NELBO."""
    return path.kappa(t)


def unit_weight(path: ProbabilityPath, t: Tensor) -> Tensor:
    """ω(t) = 1: unweighted; same per-t minimiser, not a likelihood bound (MATH.md §3.4, §8 item 4)."""
    return torch.ones_like(t)


def alpha_dot_weight(path: ProbabilityPath, t: Tensor) -> Tensor:
    """ω(t) = α̇_t = κ_t (1 − α_t): the ELBO weight without the 1/(1 − α_t) factor that diverges at t = 1 (MATH.md §0)."""
    return path.schedule.alpha_dot(t)


WEIGHTINGS = Parts(
    "time weighting",
    {
    "kappa": kappa_weight,
    "elbo": kappa_weight,
    "uniform": unit_weight,
    "none": unit_weight,
    "alpha_dot": alpha_dot_weight,
    },
    passes=callable,
)


def get_weighting(name: str | WeightFn) -> WeightFn:
    """Look up a time weighting ω(path, t) → [B] by name (one of `WEIGHTINGS`) or pass a callable through."""
    return WEIGHTINGS.lookup(name)


def reduce_loss(per_pos: Tensor, batch: TargetBatch, time_weight: Tensor | None = None) -> Tensor:
    """Nats per token: (1/B) Σ_b ω(t_b) w_b (1/L) Σ_{i: loss_mask} ℓ_b^i (MATH.md §2.2, §3.4).

    `per_pos` is [B, L] (positions outside `batch.loss_mask` dropped) or [B] (already summed over positions);
    `batch.weight` (e.g. importance weights) multiplies each sequence as given, without renormalisation.
    """
    L = batch.xt.shape[-1]
    if time_weight is not None and time_weight.dim() == 2:  # per-position times of a block path (MATH.md §9)
        per_seq = (_masked(per_pos, batch.loss_mask) * time_weight.to(per_pos.dtype)).sum(-1)
        time_weight = None
    else:
        per_seq = _masked(per_pos, batch.loss_mask).sum(-1) if per_pos.dim() == 2 else per_pos
    if time_weight is not None:
        per_seq = per_seq * time_weight.to(per_seq.dtype)
    if batch.weight is not None:
        per_seq = per_seq * batch.weight.to(per_seq.dtype)
    return per_seq.mean() / L

