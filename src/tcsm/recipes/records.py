"""The base config of a recipe that trains on prompted records (preference pairs, SFT records): the source run's
config with its data replaced by the records file, tokenized with the source run's own text tokenizer (a fine-tune of
a fine-tune keeps the original one), the data target, and no output directory inherited from the source."""

from __future__ import annotations

from pathlib import Path

from tcsm.builders.source import source_run
from tcsm.core.errors import ConfigError
from tcsm.data.prompted import PROMPTED_KINDS

__all__ = ["records_base", "records_config"]


def records_base(checkpoint, recipe: str, kind: str, records, *, is_dir: str, missing: str) -> tuple[Path, dict]:
    """(source run directory, base config) for `records` of data kind `kind`; `is_dir` / `missing` are the one-line
    errors for a directory or a missing file (formatted with `path`)."""
    directory, base = source_run(checkpoint, recipe)
    path = Path(records).expanduser()
    if path.is_dir():
        raise ConfigError(is_dir.format(path=str(path)))
    if not path.is_file():
        raise ConfigError(missing.format(path=path))
    text_data = dict(base.get("data") or {})
    if text_data.get("kind") in PROMPTED_KINDS:  # a fine-tune of a fine-tune: keep the original tokenizer
        text_data = dict(text_data["tokenizer"])
    base["data"] = {"kind": kind, "path": str(path.resolve()), "tokenizer": text_data}
    base["target"] = {"name": "data"}
    base["train"] = {**base.get("train", {}), "out_dir": None}  # never write into the pre-trained run
    return directory, base


def records_config(checkpoint, recipe: str, kind: str, records, preset, overrides, values: dict | None, *,
                   what: str, is_dir: str, missing: str, frozen_reference: bool = False):  # fmt: skip
    """Source run's config < preset < overrides < `values` for `records_base`'s records, whose objective must be
    `recipe`'s (ConfigError naming `what` otherwise), started from the source run's weights (`train.init_from`; set
    train.init_from=null in `values` to start afresh). `frozen_reference`: the source run is also the frozen
    reference (`reference.path`), and the start takes the weights the reference does."""
    from tcsm.builders.config import load_config, set_values

    directory, base = records_base(checkpoint, recipe, kind, records, is_dir=is_dir, missing=missing)
    values = values or {}
    cfg = load_config(preset, list(overrides), base=base)
    cfg = set_values(cfg, {**({"reference.path": str(directory)} if frozen_reference else {}), **values})
    if cfg.objective.name != recipe:
        raise ConfigError(f"{what} needs objective.name={recipe}, got {cfg.objective.name!r}")
    weights = "model" if frozen_reference and not cfg.reference.ema else "ema"
    start = {"train.init_from": str(directory), "train.init_weights": weights}
    return set_values(cfg, {k: v for k, v in start.items() if k not in values})
