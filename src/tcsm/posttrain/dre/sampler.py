"""SIR as a registered sampler (`tcsm.sampling.registry`): the one an energy model's objective brings (MATH.md §6.3).
Its settings (`sir_k`, `sir_window`, `sir_temperature`) join the run's `sample:` section and `tcsm sample`'s flags
by this registration; the draw itself is `EnergyObjective.sample` → `sir.sample_sir`."""

from __future__ import annotations

from dataclasses import dataclass, field

from tcsm.sampling.registry import ObjectiveSampler, SamplerSettings, register_sampler

__all__ = ["SIRSampler", "SIRSettings"]


@dataclass(frozen=True)
class SIRSettings(SamplerSettings):
    sir_k: int = field(default=2, metadata={"help": "energy (DRE ii) runs: SIR candidates per step"})
    sir_window: tuple[float, float] = field(
        default=(0.4, 0.6), metadata={"help": "energy runs: α_t window where SIR is used ([0, 1]: every step)"}
    )
    sir_temperature: float = field(default=1.0, metadata={"help": "energy runs: SIR selection ∝ softmax(f / T)"})

    def __post_init__(self):
        lo, hi = (float(v) for v in self.sir_window)
        object.__setattr__(self, "sir_window", (lo, hi))
        super().__post_init__()

    def checks(self):
        lo, hi = self.sir_window
        return [
            *super().checks(),
            (int(self.sir_k) >= 1, f"sir_k must be >= 1, got {self.sir_k}"),
            (0.0 <= lo <= hi <= 1.0, f"sir_window must be [lo, hi] with 0 <= lo <= hi <= 1, got {[lo, hi]}"),
            (self.sir_temperature > 0, f"sir_temperature must be > 0, got {self.sir_temperature}"),
        ]


@register_sampler
class SIRSampler(ObjectiveSampler):
    name = "sir"
    help = "SIR over an energy model's reference (tcsm finetune dre strategy ii)"
    settings_type = SIRSettings
