"""The decoding orders of masked models (`sampling.decoding`) as selectable samplers: which positions to unmask
next — `random`, `confidence`, `margin`, `entropy`, or `threshold` (every position above a confidence cut-off)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tcsm.sampling.decoding import decode
from tcsm.sampling.path_samplers import BlockSettings, _no_trajectory
from tcsm.sampling.registry import Sampler, register_sampler

__all__ = ["Confidence", "Entropy", "Margin", "RandomOrder", "Threshold", "ThresholdSettings"]


class _Order(Sampler):
    settings_type = BlockSettings
    steps_at_most_positions = True

    def __call__(self, model, path, num, length, *, objective=None, generator=None, device=None, fixed=None,
                 values=None, callback=None, chunk_size=None, record_steps=None):  # fmt: skip
        s = self.settings
        _no_trajectory(self, record_steps)  # decoding runs the whole batch at once: chunk_size does not apply
        return decode(
            model, path, batch_size=num, length=length, num_steps=s.steps, method=self.name, grid=s.grid,
            temperature=s.temperature, top_p=s.top_p, block_length=s.semi_ar_block, final_argmax=s.final_argmax,
            time_independent=s.time_independent(model, path), fixed=fixed, values=values, generator=generator,
            device=device, callback=callback, engine=s.engine, **self.order_settings(),
        )  # fmt: skip

    def order_settings(self) -> dict:
        """`decode`'s keywords that only this order's settings hold."""
        return {}


@register_sampler
class RandomOrder(_Order):
    name = "random"
    help = "unmask positions in random order, as many per step as the schedule says"


@register_sampler
class Confidence(_Order):
    name = "confidence"
    help = "unmask the most confident positions first"


@register_sampler
class Margin(_Order):
    name = "margin"
    help = "unmask the positions with the largest top-1 − top-2 margin first"


@register_sampler
class Entropy(_Order):
    name = "entropy"
    help = "unmask the lowest-entropy positions first"


@dataclass(frozen=True)
class ThresholdSettings(BlockSettings):
    #: 0.1, not Fast-dLLM's 0.9: measured on a 27-symbol model (docs/benchmarks.md "Decoding orders"), 0.3–0.99 all
    #: reveal one position per call (the confidence order), 0.1 about six per call (64 positions in 10 calls)
    threshold: float = field(
        default=0.1,
        metadata={"help": "method=threshold: unmask every position whose confidence exceeds this, in at most `steps` "
                          "steps (0.1: docs/benchmarks.md 'Decoding orders'; 0.9 is one position per call there)"},
    )  # fmt: skip

    def checks(self):
        return [*super().checks(), (0 < self.threshold <= 1, f"threshold must be in (0, 1], got {self.threshold}")]


@register_sampler
class Threshold(_Order):
    name = "threshold"
    help = "unmask every position whose confidence exceeds `threshold` (at most `steps` steps)"
    settings_type = ThresholdSettings
    fixed_steps = False

    def order_settings(self) -> dict:
        return {"threshold": self.settings.threshold}
