"""Readers of what older versions wrote or named: module paths that moved into the layer folders (and names renamed
there, RENAMED_NAMES), presets and config values renamed (MOVED_PRESETS, MOVED_VALUES), config keys that
moved (MOVED_KEYS, and MOVED_ENTRY_KEYS inside one registry entry's section), and saved configs from before a model field existed. Every shim for an old name lives here and says, once, in one line, what the new
name is.

An old import (`import tcsm.likelihood`, `from tcsm.batch import Batch`) still works: a meta-path finder maps the old
module name to its new home (or, for a module that was split, to a view over its parts) and warns once. An old config
key (`objective.sir_k=4`, `target.teacher: run`) is read as its new one, with a note on stderr when a person wrote
it and silently when it comes from a saved run's config."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tcsm.core.errors import ConfigError

if TYPE_CHECKING:  # omegaconf is imported where a config is read, so that `import tcsm` stays cheap
    from omegaconf import DictConfig

#: the release in which an old name here stops being read (CONTRIBUTING.md "Old names"): names only code can hold
#: (MOVED_MODULES, RENAMED_NAMES, RENAMED_METHODS) go at the next minor release; names a saved run or a config can
#: hold (MOVED_KEYS, MOVED_ENTRY_KEYS, MOVED_PRESETS, MOVED_VALUES, MISSING_FIELDS) two releases on.
#: tests/storage/test_migration.py fails once the package's version reaches a name's release (`overdue`).
CODE_NAMES_UNTIL = "0.2.0"
SAVED_NAMES_UNTIL = "0.3.0"
#: old name → its removal release where the rule above does not decide it
REMOVED_IN: dict[str, str] = {
    "tcsm.posttrain.reward.rewards": SAVED_NAMES_UNTIL,  # a saved reward spec may name it (python:module:function)
}


def old_names() -> list[str]:
    """Every old name still read here, as `removal_release` takes it: module paths, names, `Class.method`, config
    keys, `section.key (section.name=entry)`, `preset NAME`, `section.key=value`, and saved configs' missing fields."""
    entry_keys = [f"{s}.{old} ({s}.name={e})" for (s, e), keys in MOVED_ENTRY_KEYS.items() for old in keys]
    values = [f"{s}.{k}={old}" for (s, k), names in MOVED_VALUES.items() for old in names]
    return [*MOVED_MODULES, *RENAMED_NAMES, *RENAMED_METHODS, *MOVED_KEYS, *entry_keys,
            *(f"preset {p}" for p in MOVED_PRESETS), *values, *MISSING_FIELDS]  # fmt: skip


def removal_release(name: str) -> str:
    """The release that stops reading the old name `name` (one of `old_names()`)."""
    if name in REMOVED_IN:
        return REMOVED_IN[name]
    code_only = name in MOVED_MODULES or name in RENAMED_NAMES or name in RENAMED_METHODS
    return CODE_NAMES_UNTIL if code_only else SAVED_NAMES_UNTIL


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("+")[0].split(".")[:3] if part.isdigit())


def overdue(version: str) -> list[str]:
    """The old names that a package of `version` must no longer read: their removal release is `version` or earlier."""
    return [n for n in old_names() if _release(removal_release(n)) <= _release(version)]


#: old module → the module(s) that now hold its names, searched in order. Internal modules no user code or saved
#: config could name (the recipes' builders and compose modules once under posttrain/<m>/, the run's sampler once in
#: builders/, objectives/clean_lm.py between two renames) are not kept.
MOVED_MODULES: dict[str, tuple[str, ...]] = {
    "tcsm.batch": ("tcsm.core.batch",),
    "tcsm.protocols": ("tcsm.core.protocols",),
    "tcsm.errors": ("tcsm.core.errors",),
    "tcsm.progress": ("tcsm.core.progress",),
    "tcsm.fileio": ("tcsm.storage.fileio",),
    "tcsm.checkpoint": ("tcsm.storage.checkpoint",),
    "tcsm.schedules": ("tcsm.paths.schedules",),
    "tcsm.timesteps": ("tcsm.paths.timesteps",),
    "tcsm.divergences": ("tcsm.objectives.divergences",),
    "tcsm.baselines": ("tcsm.objectives.sedd",),
    "tcsm.clean_losses": ("tcsm.objectives.lm",),
    "tcsm.models.clean": ("tcsm.models.lm",),
    "tcsm.models.clean_families": ("tcsm.models.lm_families",),
    "tcsm.toy": ("tcsm.evaluation.exact",),
    "tcsm.likelihood": ("tcsm.evaluation.likelihood", "tcsm.core.results", "tcsm.paths.bounds"),
    "tcsm.posttrain.preference.pairs": ("tcsm.data.pairs",),
    "tcsm.posttrain.sft.data": ("tcsm.data.sft",),
    "tcsm.posttrain.reward.rewards": ("tcsm.rewards.functions",),
    "tcsm.core.names": ("tcsm.core.parts",),  # one registry pattern: the math tables are `Parts` too
    "tcsm.models.hf_masked": ("tcsm.builders.hf_masked",),  # a family is one module: network, entry, exporter
}

#: names renamed in the moved modules, old → new: the models of the data that are not diffusion models are LMs.
RENAMED_NAMES: dict[str, str] = {
    "CleanLMConfig": "LMConfig",
    "CleanTransformer": "LMTransformer",
    "CLEAN_PRESETS": "LM_PRESETS",
    "CLEAN_LOSSES": "LM_LOSSES",
    "CleanLoss": "LMLoss",
    "make_clean_loss": "make_lm_loss",
    "build_clean_model": "build_lm",
    "clean_model_families": "lm_families",
    "NameTable": "Parts",
}

#: methods renamed on a class, "Class.old" → new (each kept by `renamed_method`, which refuses one not listed here)
RENAMED_METHODS: dict[str, str] = {"ProbabilityPath.sample": "draw_xt"}

#: model fields a saved config may lack, → the value its model was trained with (`migrate_saved_config`)
MISSING_FIELDS: dict[str, str] = {"model.activation": "gelu_tanh"}  # the denoiser's MLP before `activation`


class _Moved(importlib.abc.Loader):
    def __init__(self, old: str, homes: tuple[str, ...]):
        self.old, self.homes = old, homes

    def create_module(self, spec):
        modules = [importlib.import_module(h) for h in self.homes]
        renamed = [f"{old} is {new}" for old, new in RENAMED_NAMES.items() if any(hasattr(m, new) for m in modules)]
        also = f" ({', '.join(renamed)})" if renamed else ""
        warnings.warn(f"{self.old} moved to {' + '.join(self.homes)}; import it from there{also}", DeprecationWarning, stacklevel=2)
        if len(modules) == 1 and not renamed:
            return modules[0]
        view = types.ModuleType(self.old, f"{self.old}: the names of {', '.join(self.homes)}")

        def __getattr__(name):
            name = RENAMED_NAMES.get(name, name)
            for m in modules:
                if hasattr(m, name):
                    return getattr(m, name)
            raise AttributeError(f"module {self.old!r} has no attribute {name!r}")

        view.__getattr__ = __getattr__
        return view

    def exec_module(self, module) -> None:
        pass


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        homes = MOVED_MODULES.get(fullname)
        return importlib.util.spec_from_loader(fullname, _Moved(fullname, homes)) if homes else None


def install_module_aliases() -> None:
    """Let old module paths import (idempotent); called when `tcsm` is imported."""
    if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedModuleFinder())


def migrate_saved_config(config: dict | None) -> None:
    """Saved configs from before a model field existed get the value those models were trained with, so that
    they rebuild the same function rather than the new default; a renamed value (MOVED_VALUES) reads as its new name."""
    for (section, key), names in MOVED_VALUES.items():  # a saved run's old value names, silently
        node = config.get(section) if isinstance(config, dict) else None
        if isinstance(node, dict) and isinstance(node.get(key), str) and node[key] in names:
            node[key] = names[node[key]]
    model = config.get("model") if isinstance(config, dict) else None
    if not isinstance(model, dict):
        return
    # An energy run's config describes its reference denoiser too.
    for node in (model, model.get("reference_model")):
        is_denoiser = isinstance(node, dict) and node and node.get("name", "denoiser") == "denoiser"  # its schema
        if is_denoiser and "activation" not in node:
            node["activation"] = MISSING_FIELDS["model.activation"]  # the default is now exact GELU


#: Presets renamed, old → new: the models of the data that are not diffusion models are named for what they are.
MOVED_PRESETS = {"clean-mlm": "mlm", "clean-causal": "causal-lm", "clean-hollow": "hollow"}


def current_preset(name: str) -> str:
    """The preset's name now; an old name is read as its new one with a one-line note on stderr (once per name)."""
    new = MOVED_PRESETS.get(name)
    if new is None:
        return name
    if ("preset", name) not in _noted:
        _noted.add(("preset", name))
        sys.stderr.write(f"tcsm: note: preset {name} is now {new}\n")
    return new


#: Keys that moved, old → new. A config (YAML, override) that still uses an old key is read as the new one with a
#: one-line note on stderr; a saved run's config is migrated silently, so every existing run still loads.
MOVED_KEYS = {
    "objective.sir_k": "sample.sir_k",
    "objective.sir_window": "sample.sir_window",
    "objective.sir_temperature": "sample.sir_temperature",
    # the one frozen model of a run, four names before
    "target.pretrained": "reference.path",
    "target.teacher": "reference.path",
    "model.reference": "reference.path",
    "objective.reference": "reference.path",
    "target.ema": "reference.ema",
    "model.reference_ema": "reference.ema",
    "objective.reference_ema": "reference.ema",
    # semi-autoregressive decoding of a full-sequence model, named apart from path.block_length (a block model)
    "sample.block_length": "sample.semi_ar_block",
}

#: old keys whose values listed here keep their meaning in place (objective.reference=ema | previous: strategy
#: (i) of DRE refers to the trainer's own EMA or previous iterate, not to a frozen checkpoint)
KEPT_VALUES = {"objective.reference": ("ema", "previous")}


def without_reference(run_config: dict) -> dict:
    """A run's config (plain dict) without its frozen model (`reference` and every old name of it): the base of a
    recipe that starts from that run and chooses its own reference."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in run_config.items() if k != "reference"}
    for old, new in MOVED_KEYS.items():
        section, key = old.split(".", 1)
        inside = isinstance(out.get(section), dict) and out[section].get(key) not in KEPT_VALUES.get(old, ())
        if new.startswith("reference.") and inside:
            out[section].pop(key, None)
    return out

_noted: set = set()  # the old keys noted so far (once per process)


def move_keys(layer: DictConfig, label: str | None) -> DictConfig:
    """`layer` with every key of MOVED_KEYS it sets under its new name; a note per old key unless `label` is None."""
    from omegaconf import OmegaConf

    moved = {}
    for old, new in MOVED_KEYS.items():
        value = OmegaConf.select(layer, old, default=_ABSENT)
        if value is _ABSENT or value in KEPT_VALUES.get(old, ()):
            continue
        if value is None:  # unset under its old name: nothing to carry over
            moved[old] = (None, None)
            continue
        there = OmegaConf.select(layer, new, default=_ABSENT)
        if there is not _ABSENT and there != value:
            raise ConfigError(f"{old} (the old name of {new}) and {new} are both set, to different values")
        earlier = next((v for n, v in moved.values() if n == new), _ABSENT)
        if earlier is not _ABSENT and earlier != value:
            raise ConfigError(f"{old} and another old name of {new} are both set, to different values")
        moved[old] = (new, value)
    if not moved:
        return layer
    layer = OmegaConf.merge(layer, {})  # a copy: presets are cached by nobody, but callers may reuse a base
    for old, (new, value) in moved.items():
        section, key = old.split(".", 1)
        del layer[section][key]
        if new is None:
            continue
        OmegaConf.update(layer, new, value, force_add=True)
        if label is not None and old not in _noted:
            _noted.add(old)
            sys.stderr.write(f"tcsm: note: {old} is now {new} (read as {new}={_show(value)}; in {label})\n")
    return layer


#: Keys that moved inside the section of one registry entry only: (section, the section's `name`) → {old: new}.
#: DRE's Bregman generator (lsif | bce | gkl) was `objective.loss`; it is `objective.bregman`, as in the composed
#: objective, whose `objective.loss` (distrib | score, the loss form) keeps its name.
MOVED_ENTRY_KEYS: dict[tuple[str, str], dict[str, str]] = {("objective", "dre"): {"loss": "bregman"}}


#: Values renamed, (section, key) → {old: new}: `objective.name: clean_lm` (the family's LM loss) is `lm`.
MOVED_VALUES: dict[tuple[str, str], dict[str, str]] = {("objective", "name"): {"clean_lm": "lm"}}


def _move_values(layer: DictConfig, label: str | None) -> DictConfig:
    """`layer` with every old value of MOVED_VALUES under its new name; a note per old value unless `label` is None."""
    from omegaconf import DictConfig, OmegaConf

    for (section, key), names in MOVED_VALUES.items():
        node = layer.get(section)
        value = node.get(key) if isinstance(node, DictConfig) else None
        if not isinstance(value, str) or value not in names:
            continue
        layer = OmegaConf.merge(layer, {})  # a copy, as in move_keys
        layer[section][key] = names[value]
        if label is not None and (section, key, value) not in _noted:
            _noted.add((section, key, value))
            sys.stderr.write(f"tcsm: note: {section}.{key}={value} is now {section}.{key}={names[value]} (in {label})\n")
    return layer


def move_layers(layers: Sequence[tuple[DictConfig, str | None]]) -> list[DictConfig]:
    """The layers of a run config, lowest first, each with the label of who wrote it (None: a saved run's config),
    with every moved key under its new name: MOVED_KEYS in every layer (`move_keys`), MOVED_ENTRY_KEYS in a layer
    whose section names that entry or, not naming one, lies over a layer that does (a preset's `objective.name:
    dre` under an override's `objective.loss=lsif`). A note per old key unless the label is None."""
    from omegaconf import DictConfig

    names: dict[str, object] = {}  # section → the entry named by the highest layer so far
    out = []
    for layer, label in layers:
        layer = move_keys(layer, label)
        layer = _move_values(layer, label)
        for (section, entry), keys in MOVED_ENTRY_KEYS.items():
            node = layer.get(section)
            if not isinstance(node, DictConfig):
                continue
            names[section] = node.get("name", names.get(section))
            if names[section] == entry:
                layer = _move_entry_keys(layer, section, entry, keys, label)
        out.append(layer)
    return out


def _move_entry_keys(layer: DictConfig, section: str, entry: str, keys: dict[str, str], label: str | None):
    from omegaconf import OmegaConf

    for old, new in keys.items():
        value = layer[section].get(old, _ABSENT)
        if value is _ABSENT:
            continue
        there = layer[section].get(new, _ABSENT)
        if value is not None and there is not _ABSENT and there != value:
            raise ConfigError(
                f"{section}.{old} (the old name of {section}.{new} for {section}.name={entry}) and {section}.{new} "
                "are both set, to different values"
            )
        layer = OmegaConf.merge(layer, {})  # a copy, as in move_keys
        del layer[section][old]
        if value is None:  # unset under its old name: nothing to carry over
            continue
        OmegaConf.update(layer, f"{section}.{new}", value, force_add=True)
        if label is not None and (section, entry, old) not in _noted:
            _noted.add((section, entry, old))
            sys.stderr.write(
                f"tcsm: note: {section}.{old} of {section}.name={entry} is now {section}.{new} "
                f"(read as {section}.{new}={_show(value)}; in {label})\n"
            )
    return layer


def current_key(key: str, value, config: dict) -> str:
    """The name that the dotted `key`, set to `value` on top of the complete run `config` (a plain dict), has now:
    a caller that sets values on a loaded config (`builders.config.set_values`) writes the key the config holds,
    rather than an old name beside it."""
    if key in MOVED_KEYS and value not in KEPT_VALUES.get(key, ()):
        return MOVED_KEYS[key]
    section, _, leaf = key.partition(".")
    node = config.get(section)
    name = node.get("name") if isinstance(node, dict) else None
    return f"{section}.{MOVED_ENTRY_KEYS[section, name][leaf]}" if leaf in MOVED_ENTRY_KEYS.get((section, name), {}) else key


_ABSENT = object()


def _show(value) -> str:
    from omegaconf import DictConfig, ListConfig, OmegaConf

    return str(OmegaConf.to_container(value) if isinstance(value, (DictConfig, ListConfig)) else value)


def renamed_method(cls, old: str, new: str) -> None:
    """Keep `cls.old` working as `cls.new` with a one-line DeprecationWarning (once per call site), so code written
    against the old name runs unchanged. The rename must be listed in RENAMED_METHODS (its removal release)."""
    if RENAMED_METHODS.get(f"{cls.__name__}.{old}") != new:
        raise ValueError(f"{cls.__name__}.{old} → {new} is not in storage/migration.py RENAMED_METHODS")

    def old_name(self, *args, **kwargs):
        warnings.warn(f"{cls.__name__}.{old} is now {cls.__name__}.{new}", DeprecationWarning, stacklevel=2)
        return getattr(self, new)(*args, **kwargs)

    old_name.__name__, old_name.__doc__ = old, f"The old name of `{new}`."
    setattr(cls, old, old_name)
