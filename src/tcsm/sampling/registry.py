"""The samplers a run can choose, by name, each with its own settings (MATH.md §6). A sampler is a class with a
`name`, a frozen settings dataclass (`settings_type`: only the fields it uses, each with its help) and `__call__`
drawing (tokens [num, length], stats); `@register_sampler` makes it selectable as `sample.method` and adds its
fields to the run's `sample:` section. A new sampler is one class in one file."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import ClassVar

from tcsm.core.parts import Parts
from tcsm.sampling.common import GRIDS
from tcsm.sampling.samplers import may_cache

__all__ = ["SAMPLERS", "DrawSettings", "ObjectiveSampler", "Sampler", "SamplerSettings", "Settings", "own_sampler_class", "register_sampler",
           "sampler_class", "sampler_names"]  # fmt: skip

#: the modules whose import registers the built-in samplers (imported before any name is looked up); a method's own
#: sampler registers from its package (`tcsm.posttrain.dre.sampler`: SIR), loaded by name like a user's plugin
HOMES = ("tcsm.sampling.path_samplers", "tcsm.sampling.orders", "tcsm.sampling.own", "tcsm.sampling.native",
         "tcsm.sampling.speculative", "tcsm.posttrain.dre.sampler")  # fmt: skip


def _help(text: str) -> dict:
    return {"help": text}


@dataclass(frozen=True)
class Settings:
    """A sampler's settings: frozen fields with their help, each sampler validating its own (`checks`)."""

    def checks(self) -> list[tuple[bool, str]]:
        return []

    def __post_init__(self):
        for ok, msg in self.checks():
            if not ok:
                raise ValueError(msg)


@dataclass(frozen=True)
class SamplerSettings(Settings):
    """What every path sampler takes: K steps on a time grid, and whether it may reuse a row's model output."""

    steps: int = field(default=128, metadata=_help("sampler steps (block models: steps per block)"))
    grid: str = field(default="uniform", metadata=_help("time grid: uniform | cosine"))
    cache: bool = field(default=True, metadata=_help(
        "MDLM's cache where the model and path allow it (a model that offers \"positions\", as tcsm's denoisers "
        "do, is called only in the steps that reveal, with or without it)"))  # fmt: skip
    engine: str = field(default="auto", metadata=_help(
        "decode engine (sampling.engine) of block and AR models and the decoding orders: auto (CUDA graphs on a "
        "GPU, eager elsewhere) | eager | graph"))  # fmt: skip
    batch_invariant: bool = field(default=True, metadata=_help(
        "a row's tokens depend only on its seed and prompt, not on the batch it shares; false: one product over all "
        "rows (faster AR decoding at large batch on the CPU)"))  # fmt: skip

    def checks(self) -> list[tuple[bool, str]]:
        from tcsm.sampling.engine import ENGINES

        return [
            (int(self.steps) >= 1, f"steps must be >= 1, got {self.steps}"),
            (self.engine in ENGINES, f"engine must be one of {list(ENGINES)}, got {self.engine!r}"),
            (self.grid in GRIDS, f"grid must be one of {list(GRIDS)}, got {self.grid!r}"),
        ]

    def time_independent(self, model, path) -> bool:
        """Whether the sampler may reuse a row's denoiser output while its x_t is unchanged (`may_cache`)."""
        return bool(self.cache) and may_cache(model, path)


@dataclass(frozen=True)
class DrawSettings(SamplerSettings):
    """A sampler that draws each token from the denoiser's conditionals: how they are shaped before the draw."""

    temperature: float = field(default=1.0, metadata=_help("softmax temperature of the denoiser's conditionals"))
    top_p: float = field(default=1.0, metadata=_help("nucleus truncation of each conditional (1: none)"))
    final_argmax: bool = field(default=False, metadata=_help("take the most likely token at the last step"))

    def checks(self) -> list[tuple[bool, str]]:
        return [
            *super().checks(),
            (self.temperature > 0, f"temperature must be > 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
        ]


class Sampler:
    """A sampler with its settings; `sampler(model, path, num, length, ...)` → (tokens [num, length], stats)."""

    name: ClassVar[str] = ""
    help: ClassVar[str] = ""
    settings_type: ClassVar[type] = SamplerSettings
    #: chosen by the run's objective (its `Samples` declaration), never by `sample.method`
    own: ClassVar[bool] = False
    #: reveals at least one position per step, so it takes at most as many steps as there are positions to fill
    steps_at_most_positions: ClassVar[bool] = False
    #: draws whole sequences with the model's own decoding (a block model's included), not a step rule that a
    #: block decoder could run inside each block
    whole_sequence: ClassVar[bool] = False
    #: chosen by `sample.method` even for a run whose objective brings its own sampler (an AR run's left to right)
    replaces_own: ClassVar[bool] = False
    #: a whole-sequence decoder of a block model whose draws may be cut at `eos_id` afterwards (the law of the text up
    #: to the first EOS is the same as stopping there)
    cut_at_eos: ClassVar[bool] = False
    #: takes exactly `steps` steps (False: its settings decide how many, at most `steps`)
    fixed_steps: ClassVar[bool] = True
    #: continues a prompt (a fixed prefix) only: it cannot fill a template
    prompts_only: ClassVar[bool] = False

    def __init__(self, settings: SamplerSettings | None = None):
        self.settings = settings if settings is not None else self.settings_type()

    @classmethod
    def from_section(cls, section) -> Sampler:
        """The sampler with the keys of a `sample:` section (any object with those attributes) it declares."""
        return cls(cls.settings_type(**{f.name: getattr(section, f.name) for f in fields(cls.settings_type)}))

    def __call__(self, model, path, num: int, length: int, *, objective=None, generator=None, device=None,
                 fixed=None, values=None, callback=None, chunk_size=None, record_steps=None):  # fmt: skip
        """(tokens [num, length], stats). `fixed` / `values` [num, length] pin positions (prompts, infilling);
        `callback(k, t, x)` sees each step; `chunk_size` bounds the rows per network call and `record_steps` keeps
        x_{t_k} in `stats.trajectory` (path samplers)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.settings})"


class ObjectiveSampler(Sampler):
    """A sampler the run's objective brings (`core.protocols.Samples`): its `sample` draws with these settings."""

    own = True

    def __call__(self, model, path, num, length, *, objective=None, generator=None, device=None, fixed=None,
                 values=None, callback=None, chunk_size=None, record_steps=None):  # fmt: skip
        return objective.sample(
            model, num, length, generator=generator, device=device, settings=self.settings, fixed=fixed, values=values
        )


#: name → sampler class (`tcsm.core.parts.Parts`, the one registry pattern), the built-in ones loaded from HOMES
SAMPLERS = Parts("sampler", homes=HOMES)


def register_sampler(cls: type[Sampler]) -> type[Sampler]:
    """Class decorator: make `cls` selectable by `cls.name`."""
    return SAMPLERS.register(cls)


def sampler_names() -> tuple[str, ...]:
    """Every name `sample.method` accepts, in registration order."""
    return tuple(n for n, c in SAMPLERS.items() if not c.own)


def sampler_class(name: str) -> type[Sampler]:
    """The sampler registered as `name`; ValueError (one line, with the choices) otherwise."""
    cls = SAMPLERS.get(name, None)
    if cls is None or cls.own:
        raise ValueError(f"method must be one of {list(sampler_names())}, got {name!r}")
    return cls


def own_sampler_class(name: str) -> type[Sampler]:
    """The sampler an objective (or a model kind's `own_sampler`) names, registered with `own = True`."""
    cls = SAMPLERS.get(name, None)
    if cls is None or not cls.own:
        raise ValueError(f"no objective's own sampler is registered as {name!r}; known: "
                         f"{[n for n, c in SAMPLERS.items() if c.own]}")  # fmt: skip
    return cls


def all_sampler_classes() -> list[type[Sampler]]:
    return list(SAMPLERS.values())
