"""Loading a run config: schema defaults < `base` (e.g. a checkpoint's saved config) < preset < `key=value`
overrides, merged, migrated (old keys, storage/migration.py), validated and returned read-only.

A layer that names another component (`objective.name=x`) starts that section afresh. A new run that starts from
`train.init_from` takes the model section of the run it loads, and `data.seq_len=N` alone sizes a new model for N.
The parts live beside this module: schema.py (the dataclasses), presets.py (YAML and `extends`), overrides.py
(`key=value`), validation.py (checks and one-line errors), help.py (the key listing).
"""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tcsm.builders.overrides import parse_overrides
from tcsm.builders.presets import load_preset
from tcsm.builders.registry import import_plugins
from tcsm.builders.schema import COMPONENTS, FIXED_SECTIONS, schema_for, to_dict
from tcsm.builders.validation import friendly, validate
from tcsm.core.errors import ConfigError
from tcsm.storage.migration import current_key, move_layers, without_reference

__all__ = ["load_config", "set_values", "to_dict"]  # to_dict (schema.py) is here too: most callers need both


def _drop_replaced_components(raw: DictConfig, layer: DictConfig) -> DictConfig:
    """A layer that names another component (e.g. `objective.name=x`) starts that section afresh: the keys the
    lower layers set were meant for the previous component."""
    for section, (key, _, _) in COMPONENTS.items():
        new, old = layer.get(section), raw.get(section)
        if (
            isinstance(new, DictConfig)
            and isinstance(old, DictConfig)
            and key in new
            and new[key] != old.get(key)
        ):
            raw = OmegaConf.merge(raw, {})  # a copy
            del raw[section]
    return raw


def load_config(
    preset: str | None = None, overrides: Sequence[str] = (), base: dict | DictConfig | None = None
) -> DictConfig:
    """Merge schema defaults < base < preset (name or YAML path) < `key=value` overrides; validate; return a
    read-only DictConfig. Raises ConfigError with a one-line message on any mistake."""
    labelled: list[tuple[DictConfig, str | None]] = []
    if base is not None:
        labelled.append((OmegaConf.create(base) if not isinstance(base, DictConfig) else base, None))
    if preset is not None:
        labelled.append((load_preset(preset), f"config {preset}"))
    labelled.append((parse_overrides(overrides), "the overrides"))
    layers = move_layers(labelled)  # old keys → new, across layers (an override's key under a preset's entry name)
    raw = OmegaConf.create({})
    for layer in layers:
        raw = OmegaConf.merge(_drop_replaced_components(raw, layer), layer)
    import_plugins(raw.get("plugins") or [])  # before any schema is read: a plugin's model may have its own
    if base is None:
        raw = _architecture_of_init_from(raw, layers[-1])
        raw = _max_len_follows_seq_len(raw, layers[-1])
    for section in COMPONENTS:
        if section in raw and not isinstance(raw[section], DictConfig):
            raise ConfigError(f"config section {section!r} must be a mapping of keys, got {raw[section]!r}")
    unknown = sorted(set(raw.keys()) - FIXED_SECTIONS)
    if unknown:
        raise ConfigError(f"unknown config section {unknown[0]!r}; sections are {sorted(FIXED_SECTIONS)}")
    try:
        cfg = OmegaConf.merge(schema_for(raw), raw)
    except OmegaConfBaseException as e:
        raise ConfigError(friendly(e)) from None
    validate(cfg)
    OmegaConf.set_readonly(cfg, True)
    return cfg


def _architecture_of_init_from(raw: DictConfig, overrides: DictConfig) -> DictConfig:
    """A new run that starts from `train.init_from` (a run, checkpoint or export) builds the model it loads: the
    `model` section is the source's, with only the model keys given as overrides on top (a preset's model keys
    describe a fresh model, not this one; `model.name=` another model starts that section afresh). A saved run or
    a recipe passes its own base config, which already is the source's."""
    where = OmegaConf.select(raw, "train.init_from", default=None)
    if not where:
        return raw
    from tcsm.storage.checkpoint import read_state, resolve_checkpoint

    source = read_state(resolve_checkpoint(where))[1].get("config")
    model = without_reference(source).get("model") if isinstance(source, dict) else None
    if not isinstance(model, dict):
        return raw  # not written by tcsm train: the config's own model (a mismatch is then named at loading)
    given = overrides.get("model")
    given = OmegaConf.to_container(given) if isinstance(given, DictConfig) else {}
    if given.get("name", model.get("name", "denoiser")) != model.get("name", "denoiser"):
        return raw
    raw = OmegaConf.merge(raw, {})  # a copy, whose model section is replaced
    raw["model"] = OmegaConf.merge(OmegaConf.create(model), given)
    return raw


def _max_len_follows_seq_len(raw: DictConfig, overrides: DictConfig) -> DictConfig:
    """`data.seq_len=N` given without `model.max_len` sizes a new model for N: the presets tie the two (the
    synthetic preset's model allows exactly its 32), and a user who changes the data's length means the model's
    too. A saved run's model keeps its own length (its callers pass a base)."""
    seq_len = OmegaConf.select(overrides, "data.seq_len")
    model = overrides.get("model")
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or (isinstance(model, DictConfig) and "max_len" in model):
        return raw
    if "max_len" not in schema_for(raw).get("model", {}):  # e.g. a Hugging Face model: its own length
        return raw
    return OmegaConf.merge(raw, {"model": {"max_len": seq_len}})


def set_values(cfg, values: dict):
    """The config with dotted keys set to Python values (no YAML parsing of strings such as reward specs)."""
    if not values:
        return cfg
    d = to_dict(cfg)
    for key, v in values.items():
        node = d
        *parents, leaf = current_key(key, v, d).split(".")  # an old name sets the key the config holds
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = v
    return load_config(base=OmegaConf.create(d))
