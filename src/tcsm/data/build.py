"""`build_data(cfg)`: one entry point from a data config (dict / OmegaConf) to a `DataBundle`.

`cfg["kind"]` picks the source; the remaining keys are that source's keyword arguments:

* `synthetic` — vocab_size=8, seq_len=32, concentration=0.3, seed=0, num_train=50000, num_valid=2000,
  num_test=2000. A random stationary Markov chain with an exactly known entropy floor (tcsm.data.synthetic).
* `text8` — path=None, split="standard" | "prefix", seq_len=256, cache_dir=None, url, verify=True
  (tcsm.data.text8; downloads and verifies text8.zip when no path is given).
* `text` — path | train_path + valid_path [+ test_path], seq_len=256, valid_frac=0.05, test_frac=0.05,
  vocab=None, oov="error" | "drop", text_field="text", name=None (tcsm.data.text; a character corpus).
* `bpe` — like `text` plus tokenizer="gpt2" | "train", bpe_dir / encoder_json / vocab_bpe, vocab_size=4096,
  min_frequency=2, doc_separator=None, eos=True; seq_len defaults to 128 (tcsm.data.bpe).
* `grid` — width=128, num_modes=8, radius=0.32, std=1/40, seed=0, num_train, num_valid, num_test: points of a
  W × W grid as length-2 sequences, a ring of Gaussian modes (tcsm.data.grid; the reward demo's data).
* `shards` — path (a folder made by `tcsm prepare`), seq_len=128 (the prepared length with `--packing pad`),
  windows="random" | "chunks", seed=0, verify=True: memory-mapped token shards (tcsm.data.shards).
* `hf` — path (a `datasets.save_to_disk` folder, Parquet files or a folder of them), tokenizer (a spec as in
  `tcsm prepare`), seq_len=128, valid_frac, test_frac, text_field="text": a small corpus read whole, in memory
  (tcsm.data.hf; needs tcsm[datasets]).
* `pairs` — preference pairs (JSONL prompt / chosen / rejected) tokenized with another data section's tokenizer;
  registered by tcsm.data.pairs, which builds that section with `build_data` (preference fine-tuning, MATH.md §5.3).
* `sft` — prompt / completion records (TRL's formats, chats through a chat template) with the same conventions;
  registered by tcsm.data.sft (instruction fine-tuning).
* `tokenizer` — path (a tokenizer.json or Hugging Face directory), seq_len=128, eos=None: a tokenizer and no text,
  the data of a run imported from a Hugging Face model directory (tcsm.data.tokenizer_only).
* `task` — task (sudoku | countdown | addition), num_train, num_valid, num_test, seed, options: a verifiable task's
  problems as prompt / completion rows in its character vocabulary (tcsm.data.tasks.kind; docs/tasks.md).

Unknown kinds or keys raise a DataError that lists what is accepted.

File locations (`PATH_KEYS`) are stored absolute when a run is created (`absolute_paths`), so a run directory can
be moved and evaluated from anywhere; `missing_paths` names the ones that no longer exist.
"""

from __future__ import annotations

import importlib
import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tcsm.data.base import DataBundle, DataError
from tcsm.data.bpe import build_bpe
from tcsm.data.grid import build_grid
from tcsm.data.shards import build_shards
from tcsm.data.synthetic import build_synthetic
from tcsm.data.text import build_text
from tcsm.data.text8 import build_text8

__all__ = ["DATA_KINDS", "PATH_KEYS", "absolute_paths", "build_data", "data_kind", "missing_paths", "refuse_missing_data"]

DATA_KINDS: dict[str, Callable[..., DataBundle]] = {
    "synthetic": build_synthetic,
    "text8": build_text8,
    "text": build_text,
    "bpe": build_bpe,
    "grid": build_grid,
    "shards": build_shards,
}

#: Kinds registered by a module outside this package (which itself builds data with `build_data`, so it cannot be
#: imported here): imported on first use, by name.
PLUGIN_KINDS = {"pairs": "tcsm.data.pairs", "sft": "tcsm.data.sft", "hf": "tcsm.data.hf", "task": "tcsm.data.tasks.kind",
                "tokenizer": "tcsm.data.tokenizer_only"}

#: Keys of the data kinds that name files or folders (relative ones are read from the current directory).
PATH_KEYS = ("path", "train_path", "valid_path", "test_path", "bpe_dir", "encoder_json", "vocab_bpe", "cache_dir")


def absolute_paths(cfg: Mapping[str, Any]) -> dict[str, str]:
    """{key: absolute path} for every relative file location of a data config (`PATH_KEYS`, with ~ expanded);
    keys already absolute, or unset, are left out."""
    out = {}
    for key in PATH_KEYS:
        value = cfg.get(key)
        if isinstance(value, str) and value:
            p = Path(value).expanduser()
            if not p.is_absolute() or str(p) != value:
                out[key] = os.path.abspath(p)  # normalises '..' without following symlinks
    return out


def missing_paths(cfg: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(key, path) of the file locations of a data config that do not exist (a cache folder may be created)."""
    return [
        (key, str(cfg[key]))
        for key in PATH_KEYS
        if key != "cache_dir" and isinstance(cfg.get(key), str) and cfg[key] and not Path(cfg[key]).expanduser().exists()
    ]


def refuse_missing_data(cfg: Mapping[str, Any], owner: str, advice: str) -> None:
    """A DataError when a run's data files are gone (moved, deleted), naming the first and `advice` — the override
    that points the run at their new place, with `{key}` for the data key."""
    missing = missing_paths(cfg)
    if missing:
        key, where = missing[0]
        raise DataError(
            f"the data of {owner} is not at data.{key}={where} any more (moved or deleted); {advice.format(key=key)}"
        )


def _to_dict(cfg: Any) -> dict[str, Any]:
    if isinstance(cfg, Mapping):
        try:
            from omegaconf import DictConfig, OmegaConf

            if isinstance(cfg, DictConfig):
                return dict(OmegaConf.to_container(cfg, resolve=True))
        except ImportError:
            pass
        return dict(cfg)
    raise DataError(f"data config must be a mapping with a `kind` key, got {type(cfg).__name__}")


def data_kind(kind) -> Callable[..., DataBundle]:
    """The builder of data kind `kind` (importing its module if a plugin registers it); DataError if unknown."""
    if kind in PLUGIN_KINDS and kind not in DATA_KINDS:
        importlib.import_module(PLUGIN_KINDS[kind])
    if kind not in DATA_KINDS:
        raise DataError(f"data kind must be one of {sorted(set(DATA_KINDS) | set(PLUGIN_KINDS))}, got {kind!r}")
    return DATA_KINDS[kind]


def build_data(cfg: Mapping[str, Any] | None = None, **overrides: Any) -> DataBundle:
    """Build the `DataBundle` described by `cfg` (a mapping with `kind`), with keyword overrides."""
    fields = {**(_to_dict(cfg) if cfg is not None else {}), **overrides}
    kind = fields.pop("kind", None)
    builder = data_kind(kind)
    accepted = list(inspect.signature(builder).parameters)
    unknown = sorted(set(fields) - set(accepted))
    if unknown:
        raise DataError(f"unknown key(s) {unknown} for data kind {kind!r}; accepted: {accepted}")
    return builder(**fields)
