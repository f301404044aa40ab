"""Command-line overrides: `section.key=value` strings parsed into a config layer (values typed by YAML: `3` is an
int, `[a, b]` a list, `null` None); the schema then rejects unknown keys and wrong types in one line."""

from __future__ import annotations

from collections.abc import Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tcsm.builders.presets import first_line
from tcsm.core.errors import ConfigError

__all__ = ["parse_overrides"]


def parse_overrides(overrides: Sequence[str]) -> DictConfig:
    for item in overrides:
        key = item.split("=", 1)[0]
        if "=" not in item or not key or key.strip() != key:
            raise ConfigError(f"override {item!r} is not of the form section.key=value")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except OmegaConfBaseException as e:
        raise ConfigError(f"cannot parse overrides: {first_line(e)}") from None
