"""The sampler a run's objective brings (`core.protocols.Samples`): SIR over an energy model's reference
(MATH.md §6.3), left to right for an autoregressive model. Chosen by the objective's declaration, never by
`sample.method`; its settings are the SIR keys besides the common ones."""

from __future__ import annotations

from dataclasses import dataclass, field

from tcsm.sampling.registry import DrawSettings, Sampler, register_sampler

__all__ = ["OwnSampler", "OwnSettings"]


@dataclass(frozen=True)
class OwnSettings(DrawSettings):
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
class OwnSampler(Sampler):
    name = "own"
    help = "the objective's own sampler (SIR for an energy model, left to right for an AR model)"
    settings_type = OwnSettings
    own = True

    def __call__(self, model, path, num, length, *, objective=None, generator=None, device=None, fixed=None,
                 values=None, callback=None, chunk_size=None, record_steps=None):  # fmt: skip
        return objective.sample(
            model, num, length, generator=generator, device=device, settings=self.settings, fixed=fixed, values=values
        )
