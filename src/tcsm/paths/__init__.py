"""Probability paths p_{t|1}(x_t | x_1) = Π_i k_t(x_t^i | x_1^i): everything that depends on the noise source (MATH.md
§0–§2). `base` (the contract every source implements), `masked` and `uniform` (the two sources), `schedules` (α_t),
`timesteps` (t draws), `bounds` (which likelihood bounds a path admits and their integrands)."""

from __future__ import annotations

from tcsm.core.parts import Parts
from tcsm.paths.base import ProbabilityPath
from tcsm.paths.masked import MaskedPath
from tcsm.paths.schedules import (
    SCHEDULES,
    CosineSchedule,
    LinearSchedule,
    LogLinearSchedule,
    PolynomialSchedule,
    Schedule,
    make_schedule,
)
from tcsm.paths.uniform import UniformPath

__all__ = [
    "PATHS",
    "SCHEDULES",
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

PATHS = Parts("source", {"masked": MaskedPath, "uniform": UniformPath})


def make_path(
    kind: str, vocab_size: int, schedule: Schedule | str | None = None, *, block_length: int | None = None,
    **schedule_kwargs,
) -> ProbabilityPath:
    """Build a path by source name ("masked" | "uniform"), schedule (object or name) and block length (None: the
    whole sequence is one block)."""
    cls = PATHS.lookup(kind)
    if isinstance(schedule, str):
        schedule = make_schedule(schedule, **schedule_kwargs)
    return cls(vocab_size, schedule, block_length)
