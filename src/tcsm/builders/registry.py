"""Name → builder registries: how a config becomes a model, a target or an objective (DESIGN.md).

A component registers itself in its own module, so adding one never edits the trainer or the CLI:

    from tcsm.builders.registry import TARGETS

    @TARGETS.register("bert", schema=BertTargetConfig)   # schema: an optional dataclass of its config keys
    def build_bert_target(node: dict, ctx: BuildContext) -> Target: ...

The config section that selects it (`target.name=bert`) is then validated against `schema` (unknown keys and
wrong types become one-line errors) and `node` holds that section's keys without `name`. Built-in entries live
in the `BUILDER_MODULES` (tcsm.builders.models, .targets, .objectives and one module per post-training recipe), which
a registry imports before it reports a name as unknown. A name of the form `package.module:function` is
imported and used as the builder directly, so a user's own component needs no registration at all.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tcsm.core.errors import ConfigError, TCSMError
from tcsm.models.kinds import UNDECLARED, ModelKind

__all__ = ["FAMILY_MODULES", "MODELS", "OBJECTIVES", "TARGETS", "BuildContext", "Entry", "ReferenceUse", "Registry",
           "family_of_name", "import_plugins", "model_families"]


@dataclass
class BuildContext:
    """What a builder may need besides its own config node. Fields are filled in build order
    (data → path → reference → model → target → objective), so a model builder sees the frozen reference, a target
    builder the model, an objective the target; nothing writes a field back."""

    config: Any  # the whole run config (DictConfig)
    device: Any = None  # torch.device the run trains on
    data: Any = None  # tcsm.data.DataBundle
    path: Any = None  # tcsm.paths.ProbabilityPath
    reference: Any = None  # the run's frozen model (`reference.path`), loaded once before the model (or None)
    reference_checkpoint: Any = None  # the checkpoint it came from (None for a Hugging Face directory)
    model: Any = None  # the trainable denoiser (unwrapped)
    target: Any = None  # tcsm.targets.Target
    extras: dict[str, Any] = field(default_factory=dict)  # free slot for components that cooperate

    @property
    def vocab_size(self) -> int:
        return int(self.data.vocab_size)

    @property
    def seq_len(self) -> int:
        return int(self.data.seq_len)


@dataclass(frozen=True)
class ReferenceUse:
    """An entry's use of the run's frozen model: how errors name it (`role`), the model families it accepts, and, for
    a reference that is not a tcsm checkpoint (a Hugging Face teacher), `load(node, ctx) -> model` instead of the
    checked checkpoint loader. `scoring`: also needed to score a saved run (not only to train)."""

    role: str
    families: tuple[str, ...] = ("denoiser",)
    load: Callable[[dict, BuildContext], Any] | None = None
    scoring: bool = False


@dataclass(frozen=True)
class Entry:
    name: str
    builder: Callable[[dict, BuildContext], Any]
    schema: type | None = None  # a dataclass: the keys of the config section besides `name`
    help: str = ""
    reference: ReferenceUse | None = None  # the entry reads ctx.reference
    kind: ModelKind | None = None  # a model entry: the kind it builds (None: a denoiser, or its class says)


class Registry:
    """A dict of `Entry`s keyed by name, with helpful errors and lazy import of the modules that register."""

    def __init__(self, kind: str, homes: tuple[str, ...] = ()):
        self.kind = kind
        self.homes = tuple(homes)
        self._entries: dict[str, Entry] = {}
        self._homes_imported = False

    def register(
        self,
        name: str,
        builder: Callable | None = None,
        *,
        schema: type | None = None,
        help: str | None = None,
        overwrite: bool = False,
        reference: ReferenceUse | None = None,
        kind: ModelKind | None = None,
    ):
        """Register `builder(node, ctx)` under `name`; usable as a decorator. Returns the builder. A model entry
        declares the `kind` of model it builds: what `family_of_name(name)` answers before anything is built."""

        def add(fn: Callable) -> Callable:
            if name in self._entries and not overwrite and self._entries[name].builder is not fn:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered; pass overwrite=True to replace it"
                )
            doc = help if help is not None else (fn.__doc__ or "").strip().split("\n")[0]
            self._entries[name] = Entry(name, fn, schema, doc, reference, kind)
            return fn

        return add(builder) if builder is not None else add

    def _import_homes(self) -> None:
        if not self._homes_imported:
            self._homes_imported = True
            for module in self.homes:
                importlib.import_module(module)

    def get(self, name: str) -> Entry:
        if name not in self._entries:
            self._import_homes()
        if name in self._entries:
            return self._entries[name]
        if ":" in name:  # "package.module:builder" — a user's component, used without registration
            module, _, attr = name.partition(":")
            try:
                fn = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as e:
                raise ConfigError(f"cannot import {self.kind} builder {name!r}: {e}") from None
            return Entry(name, fn, getattr(fn, "schema", None), (fn.__doc__ or "").strip().split("\n")[0])
        raise ConfigError(
            f"unknown {self.kind} {name!r}; choose one of {self.names()} or give 'module:function'"
        )

    def names(self) -> list[str]:
        self._import_homes()
        return sorted(self._entries)

    def __contains__(self, name: str) -> bool:
        self._import_homes()
        return name in self._entries

    def build(self, name: str, node: dict, ctx: BuildContext) -> Any:
        """The entry's object; a ValueError of the parts it builds (an option out of range) is the config's error,
        in one line naming the section."""
        builder = self.get(name).builder
        try:
            return builder(node, ctx)
        except TCSMError:
            raise
        except ValueError as e:
            raise ConfigError(f"{self.kind}: {e}") from None

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"


def _recipe_builders() -> tuple[str, ...]:
    """`tcsm.recipes.<m>.builder` of every recipe folder: found by listing the package, never imported here (the
    recipes sit above the builders and plug into them, as a user's `plugins:` module does)."""
    spec = importlib.util.find_spec("tcsm.recipes")
    locations = spec.submodule_search_locations if spec is not None else None
    return tuple(
        f"tcsm.recipes.{m.name}.builder" for m in sorted(pkgutil.iter_modules(locations or []), key=lambda m: m.name)
        if m.ispkg
    )


#: The modules of the model families, one line each. A family module is the family's one room: its `ModelKind`, its
#: `@MODELS.register(name, schema=..., kind=...)` entry, its `@EXPORTERS.register` exporter and, unless it lives in
#: `models/` for the layers below to use, its network (DESIGN.md "A new model family"). The model registry and the
#: exporters import these before they report a name as unknown; a user's family is a `plugins:` module instead.
FAMILY_MODULES = ("tcsm.builders.models", "tcsm.builders.diffusion_gemma", "tcsm.builders.hf_masked")

#: The modules whose import registers the built-in entries; one module may register several kinds (a recipe's
#: model, target and objective together). A registry imports them all before it reports a name as unknown.
BUILDER_MODULES = (*FAMILY_MODULES, "tcsm.builders.targets", "tcsm.builders.objectives", *_recipe_builders())

MODELS = Registry("model", homes=BUILDER_MODULES)
TARGETS = Registry("target", homes=BUILDER_MODULES)
OBJECTIVES = Registry("objective", homes=BUILDER_MODULES)


def family_of_name(name: str | None) -> ModelKind:
    """The kind a config's `model.name` builds, as its entry declares it (None, or an entry that declares none, such
    as a user's `module:function`: a denoiser)."""
    try:
        kind = MODELS.get(name or "denoiser").kind
    except ConfigError:
        return UNDECLARED
    return kind or UNDECLARED


def model_families() -> dict[str, ModelKind]:
    """`model.name` → the kind it builds, for every registered model entry that declares one."""
    return {name: MODELS.get(name).kind for name in MODELS.names() if MODELS.get(name).kind is not None}


def import_plugins(modules) -> None:
    """Import user modules named in the config's `plugins` list so that their registrations run."""
    for module in modules or ():
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"cannot import plugin module {module!r}: {e}") from None
