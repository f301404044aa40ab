"""The TCSM objective and its parts (MATH.md §3, §7): `losses` (L_distrib, L_score, per position), `divergences`
(Bregman generators, f-divergences), `weighting` (ω(t)), `composed` (the `Objective` a trainer calls), `sedd` (the
SEDD score-entropy baseline) and `lm` (losses of LMs, the models of the data that are not diffusion models: MLM, AR, pseudo-likelihood)."""

from __future__ import annotations

from tcsm.objectives.composed import Objective
from tcsm.objectives.losses import DEFAULT_CLAMP, LOSSES, distrib_loss, get_loss, neutral_rows, score_loss
from tcsm.objectives.weighting import WEIGHTINGS, get_weighting, reduce_loss

__all__ = [
    "DEFAULT_CLAMP",
    "LOSSES",
    "WEIGHTINGS",
    "Objective",
    "distrib_loss",
    "get_loss",
    "get_weighting",
    "neutral_rows",
    "reduce_loss",
    "score_loss",
]
