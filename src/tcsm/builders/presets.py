"""YAML presets: the files in `tcsm/configs/` (or any YAML path). A preset's first comment line describes it, and a
top-level `extends: <preset>` key inherits another preset (its keys over the parent's; a cycle is an error). A YAML
file of your own without `extends` is applied over the schema defaults, not over the `synthetic` preset."""

from __future__ import annotations

import importlib.resources
from pathlib import Path as FsPath

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tcsm.core.errors import ConfigError
from tcsm.storage.migration import MOVED_PRESETS, current_preset

__all__ = ["first_line", "list_presets", "load_preset", "preset_description", "preset_text"]


def first_line(e: BaseException) -> str:
    """The first line of an error's message (OmegaConf's messages run over several)."""
    return str(e).strip().split("\n")[0]


def _preset_dir():
    return importlib.resources.files("tcsm") / "configs"


def list_presets() -> list[str]:
    """Names of the YAML presets shipped in tcsm/configs."""
    return sorted(p.name[:-5] for p in _preset_dir().iterdir() if p.name.endswith(".yaml"))


def preset_text(name_or_path: str) -> tuple[str, str]:
    """(text, label) of a preset name (an old name of a renamed preset too) or a YAML path."""
    if name_or_path in MOVED_PRESETS and not FsPath(name_or_path).exists():
        name_or_path = current_preset(name_or_path)
    if name_or_path in list_presets():
        return (_preset_dir() / f"{name_or_path}.yaml").read_text(encoding="utf-8"), name_or_path
    p = FsPath(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        try:
            return p.read_text(encoding="utf-8"), str(p)
        except OSError as e:
            raise ConfigError(f"cannot read config file {str(p)!r}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"config file {str(p)!r} is not a YAML text file (it is not UTF-8 text)") from None
    raise ConfigError(f"unknown preset {name_or_path!r}; choose one of {list_presets()} or give a YAML path")


def preset_description(name: str) -> str:
    """The first comment line of a preset."""
    text, _ = preset_text(name)
    for line in text.splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""


def load_preset(name_or_path: str, seen: tuple[str, ...] = ()) -> DictConfig:
    text, label = preset_text(name_or_path)
    if label in seen:
        raise ConfigError(f"preset {label!r} extends itself (cycle {' -> '.join(seen + (label,))})")
    try:
        node = OmegaConf.create(text) if text.strip() else OmegaConf.create({})
    except (OmegaConfBaseException, yaml.YAMLError) as e:
        raise ConfigError(f"config {label!r} is not valid YAML: {first_line(e)}") from None
    if not isinstance(node, DictConfig):
        raise ConfigError(f"config {label!r} must be a YAML mapping of sections, got a list")
    parent = node.pop("extends", None)
    if parent is not None:
        node = OmegaConf.merge(load_preset(str(parent), seen + (label,)), node)
    return node

