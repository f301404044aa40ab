"""Targets: what p_{1|t} the denoiser must match. See `tcsm.targets.base` for the call contract."""

from tcsm.targets.base import ConditionalTarget, DataTarget, Target, TargetBatch, freeze
from tcsm.targets.parametric import ParametricTarget, make_teacher
from tcsm.targets.reward_tilt import RewardFullTarget, RewardN1Target

__all__ = [  # noqa: RUF022 (reading order)
    "Target",
    "TargetBatch",
    "DataTarget",
    "ConditionalTarget",
    "ParametricTarget",
    "RewardN1Target",
    "RewardFullTarget",
    "freeze",
    "make_teacher",
]
