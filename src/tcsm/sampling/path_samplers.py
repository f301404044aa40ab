"""The path samplers (MATH.md §6.1, §6.2) as selectable samplers: `ancestral` (the default; the sparse cached
reveal for an absorbing path, the analytic bridge otherwise), `analytic`, `euler`, and `joint` (the bridge applied
to a jointly drawn x̂_1, for a model that draws one: `model.x1_sampler(path)`). With `semi_ar_block` the first three
decode block by block (`sampling.decoding`, the ancestral law inside each block). A model with a step head
(`ModelKind.offers` "joint_step") is sampled by the masked joint step (`sampling.joint_step`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tcsm.core.errors import ConfigError
from tcsm.models.kinds import kind_of
from tcsm.sampling.decoding import decode
from tcsm.sampling.joint_step import sample_joint_steps
from tcsm.sampling.registry import DrawSettings, Sampler, SamplerSettings, register_sampler
from tcsm.sampling.samplers import sample

__all__ = ["Analytic", "Ancestral", "BlockSettings", "Euler", "Joint"]


@dataclass(frozen=True)
class BlockSettings(DrawSettings):
    semi_ar_block: int | None = field(
        default=None,
        metadata={"help": "masked full-sequence models: semi-autoregressive decoding in blocks of this many positions, "
                          "left to right, uncached (null: one block; a block model (path.block_length) decodes its own "
                          "blocks with its KV cache)"},
    )

    def checks(self):
        ok = self.semi_ar_block is None or int(self.semi_ar_block) >= 1
        return [*super().checks(), (ok, f"semi_ar_block must be >= 1 or null, got {self.semi_ar_block}")]


class _PathSampler(Sampler):
    settings_type = BlockSettings

    def __call__(self, model, path, num, length, *, objective=None, generator=None, device=None, fixed=None,
                 values=None, callback=None, chunk_size=None, record_steps=None):  # fmt: skip
        s = self.settings
        if "joint_step" in kind_of(model).offers:  # a step head: each step's tokens drawn jointly (MATH.md §10)
            if s.semi_ar_block is not None or record_steps is not None or not path.absorbing:
                raise ConfigError("a model with a step head samples with the masked joint step: no semi_ar_block, "
                                  "no record_steps, masked source only")  # fmt: skip
            return sample_joint_steps(model, path, num, length, s.steps, grid=s.grid, temperature=s.temperature,
                                      top_p=s.top_p, final_argmax=s.final_argmax, fixed=fixed, values=values,
                                      generator=generator, device=device, callback=callback,
                                      chunk_size=chunk_size)  # fmt: skip
        if s.semi_ar_block is not None:
            _no_trajectory(self, record_steps)  # blocks run the path sampler's law as "ancestral" (masked: §6.1 = §6.2)
            return decode(
                model, path, batch_size=num, length=length, num_steps=s.steps, method="ancestral", grid=s.grid,
                temperature=s.temperature, top_p=s.top_p, block_length=s.semi_ar_block, final_argmax=s.final_argmax,
                time_independent=s.time_independent(model, path), fixed=fixed, values=values, generator=generator,
                device=device, callback=callback,
            )  # fmt: skip
        return sample(
            model, path, batch_size=num, length=length, num_steps=s.steps, method=self.name, grid=s.grid,
            temperature=s.temperature, top_p=s.top_p, final_argmax=s.final_argmax,
            time_independent=s.time_independent(model, path), fixed=fixed, values=values, generator=generator,
            device=device, return_stats=True, callback=callback, chunk_size=chunk_size, record_steps=record_steps,
        )  # fmt: skip


def _no_trajectory(sampler, record_steps) -> None:
    if record_steps is not None:
        raise ValueError(f"{sampler.name} with blocks keeps no trajectory: record_steps needs a path sampler without semi_ar_block")


@register_sampler
class Ancestral(_PathSampler):
    name = "ancestral"
    help = "masked: sparse cached reveal (MDLM); other sources: the analytic bridge (§6.2)"


@register_sampler
class Analytic(_PathSampler):
    name = "analytic"
    help = "the exact time-reversal bridge step (§6.2)"


@register_sampler
class Euler(_PathSampler):
    name = "euler"
    help = "DFM Euler / τ-leaping step (§6.1)"


@register_sampler
class Joint(Sampler):
    """The exact bridge on x̂_1 drawn jointly from p_{1|t}(· | x_t) (§6.2, exact for any K). The model declares that
    it can draw x̂_1 by having `x1_sampler(path)` → (x_t, t, generator) → x̂_1 (e.g. the exact posterior of
    `tcsm.evaluation.exact`); a network of per-token conditionals cannot."""

    name = "joint"
    help = "the bridge on a jointly drawn x̂_1 (models with x1_sampler(path), e.g. an exact posterior)"
    settings_type = SamplerSettings  # x̂_1 is drawn by the model: no temperature, nucleus or argmax applies

    def __call__(self, model, path, num, length, *, objective=None, generator=None, device=None, fixed=None,
                 values=None, callback=None, chunk_size=None, record_steps=None):  # fmt: skip
        if not callable(getattr(model, "x1_sampler", None)):
            raise ConfigError(f"method joint needs a model that draws x̂_1 jointly (x1_sampler(path)); a "
                             f"{type(model).__name__} has none: choose another sample.method")  # fmt: skip
        s = self.settings
        return sample(
            None, path, batch_size=num, length=length, num_steps=s.steps, method="joint", grid=s.grid,
            time_independent=s.time_independent(model, path), x1_sampler=model.x1_sampler(path), fixed=fixed,
            values=values, generator=generator, device=device, return_stats=True, callback=callback,
            chunk_size=chunk_size, record_steps=record_steps,
        )  # fmt: skip
