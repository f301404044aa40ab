"""Targets: what p_{1|t} the denoiser must match. See `tcsm.targets.base` for the call contract.

The pre-training targets live here (data, parametric MLM / AR / Hollow models of p_1); the post-training ones live
with their method: reward-tilted targets in `tcsm.posttrain.reward.targets`, the distillation teacher in
`tcsm.posttrain.distill.target`."""

from tcsm.targets.base import ConditionalTarget, DataTarget, Target, TargetBatch, freeze
from tcsm.targets.parametric import ParametricTarget, make_teacher

__all__ = [  # noqa: RUF022 (reading order)
    "Target",
    "TargetBatch",
    "DataTarget",
    "ConditionalTarget",
    "ParametricTarget",
    "freeze",
    "make_teacher",
]
