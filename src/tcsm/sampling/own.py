"""The samplers a run's objective brings (`core.protocols.Samples`), chosen by the objective's declaration (its
`sampler` attribute names one), never by `sample.method`: left to right for an autoregressive model, and `own` for
an objective that names none. SIR over an energy model's reference is the density-ratio package's plug-in
(`tcsm.posttrain.dre.sampler`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tcsm.sampling.registry import DrawSettings, ObjectiveSampler, Settings, register_sampler

__all__ = ["LeftToRightSampler", "LeftToRightSettings", "OwnSampler", "OwnSettings"]

#: the settings an objective's own sampler receives when it names no sampler of its own
OwnSettings = DrawSettings


@register_sampler
class OwnSampler(ObjectiveSampler):
    name = "own"
    help = "the objective's own sampler, when it names none of the registered ones"
    settings_type = OwnSettings


@dataclass(frozen=True)
class LeftToRightSettings(Settings):
    """An autoregressive draw x^j ~ p(· | x^{<j}): one position per step, its conditionals shaped before the draw."""

    temperature: float = field(default=1.0, metadata={"help": "softmax temperature of the denoiser's conditionals"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus truncation of each conditional (1: none)"})

    def checks(self):
        return [
            (self.temperature > 0, f"temperature must be > 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
        ]


@register_sampler
class LeftToRightSampler(ObjectiveSampler):
    name = "left_to_right"
    help = "an autoregressive LM's draw, left to right after the prompt"
    settings_type = LeftToRightSettings
    prompts_only = True
