"""Targets: what p_{1|t} the denoiser must match. See `tcsm.targets.base`."""

# Importing the parametric targets registers target.name = parametric with tcsm.registry.TARGETS.
from tcsm.targets import parametric as _parametric  # noqa: F401
from tcsm.targets import reward_tilt as _reward_tilt  # noqa: F401  (registers target.name = reward)
from tcsm.targets.base import ConditionalTarget, DataTarget, Target, TargetBatch

__all__ = ["Target", "TargetBatch", "DataTarget", "ConditionalTarget"]  # noqa: RUF022 (reading order)
