"""How a run samples (MATH.md §6): its config's `sample:` section as one value, `SampleSettings` — `method` plus
every registered sampler's settings fields, derived from the registry (`sampling.registry`), so a new sampler's
keys appear here without an edit. `sample_settings` reads a section (with a caller's explicit overrides, e.g. a
report's step count or a command line's flags), `draw` turns (model, path, objective, settings) into samples and
`RunSampler` holds them for a run. The trainer's logged samples, `tcsm sample`, gen-PPL, quickstart, the demos and
the recipe reports all go through here, so a run samples the same way everywhere.

An objective that brings its own sampler declares it (`tcsm.core.protocols.Samples`: SIR over an energy model,
left to right for an autoregressive model), names it (`sampler = "sir"`) and receives that sampler's settings from the
section; otherwise the sampler named
by `method` (None: `ancestral`) runs. A block model (`kind_of(model).blocks`) is decoded block by block with its KV
cache (`sampling.blocks`), that sampler inside each block and `steps` per block; `eos_id` stops its rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

import torch
from torch import Tensor

from tcsm.core.errors import ConfigError
from tcsm.core.protocols import Samples
from tcsm.models.kinds import kind_of
from tcsm.models.layers import batch_invariance
from tcsm.sampling.blocks import BlockDecodeSettings, _fill_after_eos, decode_blocks
from tcsm.sampling.common import prefix_condition, row_streams
from tcsm.sampling.registry import (
    Sampler,
    all_sampler_classes,
    own_sampler_class,
    sampler_class,
    sampler_names,
)
from tcsm.sampling.samplers import _infer_device, in_row_chunks

__all__ = [
    "DEFAULT_METHOD", "RunSampler", "SampleSettings", "build_sampler", "draw", "draw_pool", "make_sampler",
    "sample_settings",
    "section_fields",
]  # fmt: skip

#: the sampler of `method: null`: the sparse cached reveal on a masked path, the analytic bridge elsewhere
DEFAULT_METHOD = "ancestral"


def section_fields() -> list[dataclasses.Field]:
    """The union of the registered samplers' settings fields and block decoding's, each once (first declaration
    wins)."""
    out: dict[str, dataclasses.Field] = {}
    for settings_type in [*(cls.settings_type for cls in all_sampler_classes()), BlockDecodeSettings]:
        for f in fields(settings_type):
            out.setdefault(f.name, f)
    return list(out.values())


def _section_type() -> type:
    spec = [("method", "str | None", dataclasses.field(default=None, metadata={
        "help": f"{' | '.join(sampler_names())} (null: {DEFAULT_METHOD}: the cached reveal for masked models, the "
                "analytic bridge for uniform ones)"}))]  # fmt: skip
    for f in section_fields():
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        spec.append((f.name, f.type, dataclasses.field(default=default, metadata=f.metadata)))

    def __post_init__(self):
        if self.method is not None and self.method not in sampler_names():
            raise ValueError(f"method must be one of {list(sampler_names())}, got {self.method!r}")
        for cls in all_sampler_classes():  # every sampler's settings validate (and normalise) their own keys
            own = cls.from_section(self).settings
            for f in fields(own):
                object.__setattr__(self, f.name, getattr(own, f.name))
        BlockDecodeSettings(**{f.name: getattr(self, f.name) for f in fields(BlockDecodeSettings)})

    doc = ("A run's `sample:` section: `method` and every registered sampler's settings (`section_fields`). "
           "`make_sampler` picks the sampler and gives it the keys it declares.")  # fmt: skip
    return dataclass(frozen=True)(type("SampleSettings", (), {
        "__annotations__": {n: t for n, t, _ in spec}, **{n: d for n, _, d in spec},
        "__post_init__": __post_init__, "__doc__": doc, "__module__": __name__,
    }))  # fmt: skip


SampleSettings = _section_type()


def sample_settings(section, **overrides) -> SampleSettings:
    """`SampleSettings` from a run's `sample:` section (a config node, dataclass or mapping; keys that are not
    sampler settings, such as `num`, are left out) with `overrides` (None values ignored) on top. ConfigError in one
    line for a bad value, or for a threshold override when the method is not "threshold"."""
    known = [f.name for f in fields(SampleSettings)]
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise TypeError(f"unknown sampler settings {unknown}")
    read = section.get if isinstance(section, Mapping) else lambda k, d: getattr(section, k, d)
    values = {k: v for k in known if (v := read(k, MISSING)) is not MISSING}
    values.update({k: v for k, v in overrides.items() if v is not None})
    if overrides.get("threshold") is not None and values.get("method") != "threshold":
        # the cut-off of the threshold order only: ignoring it would sample with another law than the one asked for
        raise ConfigError(
            f"threshold={overrides['threshold']} is a setting of method threshold, but this sampler's method is "
            f"{values.get('method') or 'the path default'}; add method threshold (tcsm sample --method threshold) "
            "or leave the threshold out"
        )
    try:
        return SampleSettings(**values)
    except ValueError as e:
        raise ConfigError(f"sample.{e}") from None


def make_sampler(settings, objective=None, drafter_model=None) -> Sampler:
    """The sampler a section chooses: the objective's own when it declares `Samples` (the registered sampler its
    `sampler` attribute names, else "own") unless `method` names a sampler that replaces it (speculative decoding),
    else `method`'s. `drafter_model`: the model `sample.drafter` names, loaded by the caller
    (`tcsm.builders.loading.load_drafter`), for the speculative sampler."""
    cls = sampler_class(settings.method or DEFAULT_METHOD)
    if isinstance(objective, Samples) and not cls.replaces_own:
        return own_sampler_class(getattr(objective, "sampler", "own")).from_section(settings)
    sampler = cls.from_section(settings)
    if drafter_model is not None:
        if not hasattr(sampler, "drafter_model"):
            raise ConfigError(f"a drafter model drafts for method=speculative, not {cls.name}")
        sampler.drafter_model = drafter_model
    return sampler


def draw(
    model,
    path,
    num: int,
    length: int,
    settings,
    *,
    objective=None,
    generator=None,
    device=None,
    fixed: Tensor | None = None,
    values: Tensor | None = None,
    prompt: Tensor | None = None,
    callback=None,
    chunk_size: int | None = None,
    record_steps=None,
    drafter_model=None,
):
    """(tokens [num, length] or None, stats with `.method` and `.num_calls`) from the sampler `settings` choose
    (`make_sampler`; `drafter_model`: the speculative sampler's drafter). `fixed` / `values` [num, length] pin
    positions (infilling), `prompt` [P] or [num, P] a prefix; `callback(k, t, x)` sees each path step; `chunk_size`,
    `record_steps`: see `Sampler.__call__`."""
    if prompt is not None and prompt.numel():
        if fixed is not None:
            raise ValueError("give a prompt or fixed/values, not both")
        fixed, values = prefix_condition(prompt, num, length)
    with batch_invariance(getattr(settings, "batch_invariant", True)):
        return _draw(model, path, num, length, settings, objective, generator, device, fixed, values, callback,
                     chunk_size, record_steps, drafter_model)  # fmt: skip


def _draw(model, path, num, length, settings, objective, generator, device, fixed, values, callback, chunk_size,
          record_steps, drafter_model):  # fmt: skip
    sampler = make_sampler(settings, objective, drafter_model)
    eos_id = getattr(settings, "eos_id", None)
    if kind_of(model).blocks and not sampler.whole_sequence:  # block by block with its KV cache, the sampler in each
        if record_steps is not None:
            raise ValueError("block decoding keeps no trajectory: record_steps needs a full-sequence model")
        return _draw_blocks(model, path, sampler, num, length, fixed, values, generator, device, eos_id, callback,
                            chunk_size)  # fmt: skip
    if eos_id is not None and not (kind_of(model).blocks and sampler.cut_at_eos):
        raise ValueError(f"sample.eos_id={eos_id} stops block decoding, and a {type(model).__name__} is a "
                         "full-sequence model: leave sample.eos_id null")  # fmt: skip
    if eos_id is not None:  # a whole-sequence decoder of a block model: the same law, the tail after EOS filled
        x, stats = sampler(model, path, num, length, objective=objective, generator=generator, device=device,
                           fixed=fixed, values=values, callback=callback, chunk_size=chunk_size)  # fmt: skip
        fixed = torch.zeros_like(x, dtype=torch.bool) if fixed is None else fixed.expand_as(x)
        return _fill_after_eos(x, fixed, int(eos_id)), stats
    return sampler(model, path, num, length, objective=objective, generator=generator, device=device, fixed=fixed,
                   values=values, callback=callback, chunk_size=chunk_size, record_steps=record_steps)  # fmt: skip


def draw_pool(model, path, num: int, length: int, steps: int, *, prompt: Tensor | None = None, generator=None,
              chunk_size: int | None = None) -> Tensor:
    """Tokens [num, length] of a model for a training-time sample pool (on-policy proposals, reference draws):
    `sampling.sample` with `steps` steps for a full-sequence model; a block model block by block through its KV
    cache, the default sampler with `steps` steps in each block (MATH.md §9)."""
    if kind_of(model).blocks:
        return draw(model, path, num, length, sample_settings({}, steps=int(steps)), generator=generator,
                    prompt=prompt, chunk_size=chunk_size)[0]  # fmt: skip
    from tcsm.sampling.samplers import sample

    return sample(model, path, batch_size=num, length=length, num_steps=steps, generator=generator, prompt=prompt,
                  chunk_size=chunk_size)  # fmt: skip


def _draw_blocks(model, path, inner, num, length, fixed, values, generator, device, eos_id, callback, chunk_size):
    """`decode_blocks` over chunks of at most `chunk_size` rows (one after another), its stats summed."""
    streams = row_streams(generator, num, device if device is not None else _infer_device(model, values))
    return in_row_chunks(lambda n, rows, pins: decode_blocks(model, path, inner, n, length, generator=rows, device=device,
                                                             eos_id=eos_id, callback=callback, **pins),
                         num, length, chunk_size, streams, fixed, values)  # fmt: skip


@dataclass
class RunSampler:
    """Draw from a run: `model`, `path`, the run's `objective` (its own sampler when it declares `Samples`) and
    `settings`. `__call__` returns (tokens or None, stats with `.method` and `.num_calls`)."""

    model: Any
    path: Any
    objective: Any
    settings: Any
    #: the model `settings.drafter` names (speculative decoding), loaded by the builders
    drafter_model: Any = None

    @property
    def own(self) -> bool:
        """Whether the objective brings its own sampler (SIR, left to right) instead of a registered one."""
        return isinstance(self.objective, Samples)

    def __call__(self, num: int, length: int, *, generator=None, device=None, fixed=None, values=None, callback=None):
        return draw(
            self.model, self.path, num, length, self.settings, objective=self.objective, generator=generator,
            device=device, fixed=fixed, values=values, callback=callback, drafter_model=self.drafter_model,
        )  # fmt: skip


def build_sampler(cfg, model, path, objective, drafter_model=None, **overrides) -> RunSampler:
    """The run's sampler: `cfg.sample` with `overrides` (a command line's flags; None: the run's value);
    `drafter_model` the model its `sample.drafter` names (`tcsm.builders.loading.load_drafter`)."""
    return RunSampler(model, path, objective, sample_settings(cfg.sample, **overrides), drafter_model)
