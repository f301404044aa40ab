"""How a run samples (MATH.md §6): its config's `sample:` section as one value, `SampleSettings` — `method` plus
every registered sampler's settings fields, derived from the registry (`sampling.registry`), so a new sampler's
keys appear here without an edit — and `draw`, the one place that turns (model, path, objective, settings) into
samples. The trainer's logged samples, `tcsm sample`, gen-PPL, quickstart, the demos and the recipe reports all
call `draw` with the run's section, so a run samples the same way everywhere.

An objective that brings its own sampler declares it (`tcsm.core.protocols.Samples`: SIR over an energy model,
left to right for an autoregressive model) and receives the section's `OwnSettings`; otherwise the sampler named
by `method` (None: `ancestral`) runs."""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, dataclass, fields

from torch import Tensor

from tcsm.core.protocols import Samples
from tcsm.sampling.common import prefix_condition
from tcsm.sampling.own import OwnSampler
from tcsm.sampling.registry import Sampler, all_sampler_classes, sampler_class, sampler_names

__all__ = ["DEFAULT_METHOD", "SampleSettings", "draw", "make_sampler", "section_fields"]

#: the sampler of `method: null`: the sparse cached reveal on a masked path, the analytic bridge elsewhere
DEFAULT_METHOD = "ancestral"


def section_fields() -> list[dataclasses.Field]:
    """The union of the registered samplers' settings fields, each once (first declaration wins)."""
    out: dict[str, dataclasses.Field] = {}
    for cls in all_sampler_classes():
        for f in fields(cls.settings_type):
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
        for cls in all_sampler_classes():  # every sampler's settings validate their own keys
            cls.from_section(self)
        if "sir_window" in self.__dataclass_fields__:
            object.__setattr__(self, "sir_window", tuple(float(v) for v in self.sir_window))

    doc = ("A run's `sample:` section: `method` and every registered sampler's settings (`section_fields`). "
           "`make_sampler` picks the sampler and gives it the keys it declares.")  # fmt: skip
    return dataclass(frozen=True)(type("SampleSettings", (), {
        "__annotations__": {n: t for n, t, _ in spec}, **{n: d for n, _, d in spec},
        "__post_init__": __post_init__, "__doc__": doc, "__module__": __name__,
    }))  # fmt: skip


SampleSettings = _section_type()


def make_sampler(settings, objective=None) -> Sampler:
    """The sampler a section chooses: the objective's own when it declares `Samples`, else `method`'s."""
    if isinstance(objective, Samples):
        return OwnSampler.from_section(settings)
    return sampler_class(settings.method or DEFAULT_METHOD).from_section(settings)


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
):
    """(tokens [num, length] or None, stats with `.method` and `.num_calls`) from the sampler `settings` choose
    (`make_sampler`). `fixed` / `values` [num, length] pin positions (infilling), `prompt` [P] or [num, P] a prefix;
    `callback(k, t, x)` sees each path step; `chunk_size`, `record_steps`: see `Sampler.__call__`."""
    if prompt is not None and prompt.numel():
        if fixed is not None:
            raise ValueError("give a prompt or fixed/values, not both")
        fixed, values = prefix_condition(prompt, num, length)
    sampler = make_sampler(settings, objective)
    return sampler(model, path, num, length, objective=objective, generator=generator, device=device, fixed=fixed,
                   values=values, callback=callback, chunk_size=chunk_size, record_steps=record_steps)  # fmt: skip
