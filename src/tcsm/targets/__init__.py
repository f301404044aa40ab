"""Targets: what p_{1|t} the denoiser must match. See `tcsm.targets.base`."""

from tcsm.targets.base import ConditionalTarget, DataTarget, Target, TargetBatch

__all__ = ["Target", "TargetBatch", "DataTarget", "ConditionalTarget"]
