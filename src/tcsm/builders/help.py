"""The `--help` listing of config keys, read from the schema: every key of a preset's config with its value and the
help text of its dataclass field, so a new component's keys are listed without an edit."""

from __future__ import annotations

import dataclasses
from typing import Any

from omegaconf import DictConfig, OmegaConf

from tcsm.builders.config import load_config
from tcsm.builders.schema import RunConfig, schema_for

__all__ = ["describe_keys"]


def _walk(node, prefix: str, schema_type, out: list) -> None:
    fields = (
        {f.name: f for f in dataclasses.fields(schema_type)} if dataclasses.is_dataclass(schema_type) else {}
    )
    for key in node:
        value = node[key]
        full = f"{prefix}{key}"
        f = fields.get(key)
        sub_type = OmegaConf.get_type(node, key)
        if isinstance(value, DictConfig) and dataclasses.is_dataclass(sub_type):
            _walk(value, full + ".", sub_type, out)
        else:
            shown = (
                OmegaConf.to_container(value)
                if isinstance(value, (DictConfig,)) or OmegaConf.is_list(value)
                else value
            )
            out.append((full, shown, (f.metadata.get("help", "") if f is not None else "")))


def describe_keys(preset: str | None = None) -> list[tuple[str, Any, str]]:
    """(dotted key, value, help) for every key of `preset`'s config (None: the schema defaults and default
    component choices), so that help can show what a run of that preset uses."""
    cfg = load_config(preset) if preset is not None else OmegaConf.merge(schema_for(OmegaConf.create({})), {})
    out: list = []
    for section in cfg:
        value = cfg[section]
        sub_type = OmegaConf.get_type(cfg, section)
        f = {f.name: f for f in dataclasses.fields(RunConfig)}[section]
        if isinstance(value, DictConfig):
            if dataclasses.is_dataclass(sub_type):
                _walk(value, section + ".", sub_type, out)
            else:
                for key in value:
                    out.append((f"{section}.{key}", value[key], f.metadata.get("help", "")))
        else:
            shown = OmegaConf.to_container(value) if OmegaConf.is_list(value) else value
            out.append((section, shown, f.metadata.get("help", "")))
    return out
