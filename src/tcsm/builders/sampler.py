"""The one sampler of a run: its config's `sample:` section (with any command-line overrides) → `SampleSettings`,
and `RunSampler`, which draws with the run's model, path and objective through `tcsm.sampling.settings.draw`.
The trainer's logged samples and `tcsm sample` both come from here, so a run samples the same way in both."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from tcsm.builders.config import to_dict
from tcsm.core.errors import ConfigError
from tcsm.sampling.settings import SampleSettings, draw

__all__ = ["RunSampler", "build_sampler", "sample_settings"]


def sample_settings(sample_cfg, **overrides) -> SampleSettings:
    """`SampleSettings` from a run's `sample:` section, with `overrides` (None values ignored) on top; ConfigError
    for a threshold override when the resulting method is not "threshold"."""
    known = {f.name for f in fields(SampleSettings)}
    values = {k: v for k, v in to_dict(sample_cfg).items() if k in known}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(f"unknown sampler settings {unknown}")
    values.update({k: v for k, v in overrides.items() if v is not None})
    if overrides.get("threshold") is not None and values.get("method") != "threshold":
        # the cut-off of the threshold order only: ignoring it would sample with another law than the one asked for
        raise ConfigError(
            f"threshold={overrides['threshold']} is a setting of method threshold, but this sampler's method is "
            f"{values.get('method') or 'the path default'}; add method threshold (tcsm sample --method threshold) "
            "or leave the threshold out"
        )
    values["sir_window"] = tuple(values.get("sir_window", (0.4, 0.6)))
    try:
        return SampleSettings(**values)
    except ValueError as e:
        raise ConfigError(f"sample.{e}") from None


@dataclass
class RunSampler:
    """Draw from a run: `model`, `path`, the run's `objective` (its own sampler when it declares `Samples`) and
    `settings`. `__call__` returns (tokens or None, stats with `.method` and `.num_calls`)."""

    model: Any
    path: Any
    objective: Any
    settings: SampleSettings

    @property
    def own(self) -> bool:
        """Whether the objective brings its own sampler (SIR, left to right) instead of the path samplers."""
        from tcsm.core.protocols import Samples

        return isinstance(self.objective, Samples)

    def __call__(self, num: int, length: int, *, generator=None, device=None, fixed=None, values=None, callback=None):
        return draw(
            self.model, self.path, num, length, self.settings, objective=self.objective, generator=generator,
            device=device, fixed=fixed, values=values, callback=callback,
        )  # fmt: skip


def build_sampler(cfg, model, path, objective, **overrides) -> RunSampler:
    """The run's sampler: `cfg.sample` with `overrides` (a command line's flags; None: the run's value)."""
    return RunSampler(model, path, objective, sample_settings(cfg.sample, **overrides))
