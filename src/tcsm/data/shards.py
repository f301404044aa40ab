"""Prepared token shards: the files `tcsm prepare` writes and the `shards` data kind reads.

A prepared folder holds raw little-endian token files (`train-00000.bin`, `valid-00000.bin`, …; uint16 when the
vocabulary fits, else uint32), the tokenizer (`tokenizer/`) and `index.json`, written last: the folder is usable
exactly when the index exists. The index records the tokenizer's identity, vocabulary size, EOS id, the packing,
per split the documents, tokens and shards (file, tokens, sha256), and the command that made it. Its own sha256
(`index_checksum`) names the corpus in a run.

The `shards` data kind memory-maps the files (nothing is copied; memory does not grow with the corpus). The
training split is cut into rows of `seq_len` tokens inside each shard, either aligned (`windows="chunks"`) or
each row shifted by a pseudo-random offset in [0, seq_len) that is a pure function of (seed, shard, row)
(`windows="random"`); the trainer's seeded, resumable and rank-disjoint order (`EpochBatches`) picks rows.
The validation and test splits are aligned chunks. With `packing="pad"` every row is one document, padded or
cut to the prepared length, and `seq_len` must equal it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from tcsm.data.base import DataBundle, DataError, compact_dtype
from tcsm.data.tokenizer_spec import load_saved

__all__ = ["FORMAT", "INDEX", "TokenRows", "build_shards", "index_checksum", "read_index", "verify_shards"]

FORMAT = "tcsm-token-shards"
INDEX = "index.json"
SPLITS = ("train", "valid", "test")


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype("<u2") if vocab_size <= 65535 else np.dtype("<u4")


def index_checksum(directory: str | Path) -> str:
    return hashlib.sha256((Path(directory) / INDEX).read_bytes()).hexdigest()


def file_sha256(path: Path, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def read_index(directory: str | Path) -> dict[str, Any]:
    """The parsed index of a prepared folder; DataError if there is none or it is not one."""
    d = Path(directory).expanduser()
    if not d.is_dir():
        raise DataError(f"shards folder not found: {d}; make one with tcsm prepare")
    p = d / INDEX
    if not p.is_file():
        partial = any(d.glob(".prepare-*"))
        hint = " (an interrupted tcsm prepare: run it again)" if partial else "; make one with tcsm prepare"
        raise DataError(f"{d} holds no {INDEX}{hint}")
    try:
        index = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DataError(f"{p} is not a readable index: {type(e).__name__}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise DataError(f"{p} is not a tcsm shard index (format {FORMAT!r})")
    return index


def verify_shards(directory: Path, index: dict, checksums: bool = True) -> None:
    """DataError naming the first shard that is missing, has the wrong size, or (with checksums) other bytes."""
    itemsize = np.dtype(index["dtype"]).itemsize
    for split in SPLITS:
        for shard in index["splits"][split]["shards"]:
            p = directory / shard["file"]
            if not p.is_file():
                raise DataError(f"shard {p} is missing; prepare the folder again")
            size = p.stat().st_size
            if size != shard["tokens"] * itemsize:
                raise DataError(
                    f"shard {p} has {size} bytes, the index says {shard['tokens'] * itemsize}: truncated or "
                    "replaced; prepare the folder again"
                )
            if checksums and file_sha256(p) != shard["sha256"]:
                raise DataError(f"shard {p} does not match its sha256 in the index (corrupted); prepare again")


def _offsets(seed: int, shard: int, rows: np.ndarray, seq_len: int) -> np.ndarray:
    """A pseudo-random offset in [0, seq_len) per row: splitmix64 of (seed, shard, row), stateless."""
    with np.errstate(over="ignore"):
        z = rows.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15) * np.uint64(
            (int(seed) * 1_000_003 + int(shard) + 1) % (1 << 63)
        )
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z % np.uint64(seq_len)).astype(np.int64)


class TokenRows:
    """[N, seq_len] rows over memory-mapped shards, read only when indexed (a lazy stand-in for a Tensor:
    `shape`, `dim()`, `len()`, and indexing by ints, slices or index tensors, which returns an int64 Tensor)."""

    def __init__(self, arrays: list[np.ndarray], seq_len: int, windows: str = "chunks", seed: int = 0):
        self.arrays, self.seq_len, self.windows, self.seed = arrays, int(seq_len), windows, int(seed)
        L = self.seq_len
        # With random offsets a row needs L − 1 tokens of room after its aligned start.
        counts = [(len(a) - L + 1) // L if windows == "random" else len(a) // L for a in arrays]
        self.counts = np.asarray([max(c, 0) for c in counts], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.counts)])
        self.shape = torch.Size([int(self.starts[-1]), L])

    def dim(self) -> int:
        return 2

    def __len__(self) -> int:
        return self.shape[0]

    def rows(self, index: np.ndarray) -> np.ndarray:
        """int64 [len(index), L] of the rows `index` (each in [0, N))."""
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        if index.size and (index.min() < 0 or index.max() >= self.shape[0]):
            raise IndexError(f"row index out of range [0, {self.shape[0]})")
        out = np.empty((index.size, self.seq_len), dtype=np.int64)
        shard = np.searchsorted(self.starts, index, side="right") - 1
        for s in np.unique(shard):
            where = np.flatnonzero(shard == s)
            local = index[where] - self.starts[s]
            begin = local * self.seq_len
            if self.windows == "random":
                begin = begin + _offsets(self.seed, int(s), local, self.seq_len)
            a = self.arrays[int(s)]
            for k, b in zip(where, begin):  # contiguous slices: one page-range read per row
                out[k] = a[b : b + self.seq_len]
        return out

    def __getitem__(self, key) -> Tensor:
        if isinstance(key, slice):
            key = np.arange(*key.indices(self.shape[0]))
        elif isinstance(key, Tensor):
            key = key.cpu().numpy()
        elif isinstance(key, int):
            return torch.from_numpy(self.rows(np.asarray([key])))[0]
        return torch.from_numpy(self.rows(np.asarray(key)))


def _open(directory: Path, shards: list[dict], dtype: np.dtype) -> list[np.ndarray]:
    out = []
    for s in shards:
        if s["tokens"]:
            out.append(np.memmap(directory / s["file"], dtype=dtype, mode="r", shape=(int(s["tokens"]),)))
    return out


def build_shards(
    path: str,
    seq_len: int | None = None,
    windows: str = "random",
    seed: int = 0,
    verify: bool = True,
    name: str | None = None,
) -> DataBundle:
    """The `shards` data kind: a folder made by `tcsm prepare` (see the module docstring). `verify=True` checks
    every shard's sha256 before use (about a second per GB of tokens); `False` checks sizes only."""
    if windows not in ("random", "chunks"):
        raise DataError(f"data.windows must be 'random' or 'chunks', got {windows!r}")
    if not path or path == "???":
        raise DataError("data.kind=shards needs data.path=DIR, a folder made by tcsm prepare")
    directory = Path(path).expanduser()
    index = read_index(directory)
    verify_shards(directory, index, checksums=bool(verify))
    tokenizer = load_saved(directory / "tokenizer", index["tokenizer"])
    dtype = np.dtype(index["dtype"])
    packed = index["packing"] == "pad"
    if packed:
        if seq_len not in (None, index["seq_len"]):
            raise DataError(
                f"{directory} holds documents padded to {index['seq_len']} tokens; set data.seq_len="
                f"{index['seq_len']} or prepare again with --seq-len {seq_len}"
            )
        seq_len = int(index["seq_len"])
    seq_len = 128 if seq_len is None else int(seq_len)
    if seq_len < 1:
        raise DataError(f"data.seq_len must be a positive integer, got {seq_len}")
    splits = {}
    for split in SPLITS:
        arrays = _open(directory, index["splits"][split]["shards"], dtype)
        if split == "train":
            splits[split] = TokenRows(arrays, seq_len, "chunks" if packed else windows, seed)
        else:
            # Held-out splits are read whole (they are small) so that evaluation gets an ordinary tensor.
            rows = TokenRows(arrays, seq_len, "chunks")
            small = compact_dtype(int(index["vocab_size"]))
            splits[split] = rows[:].to(small) if len(rows) else torch.zeros(0, seq_len, dtype=small)
    if len(splits["train"]) == 0:
        raise DataError(
            f"the training split of {directory} has {index['splits']['train']['tokens']} tokens, less than one "
            f"row of {seq_len}"
        )
    return DataBundle(
        name=name or directory.name,
        vocab_size=int(index["vocab_size"]),
        seq_len=seq_len,
        train=splits["train"],
        valid=splits["valid"],
        test=splits["test"],
        tokenizer=tokenizer,
        eos_id=index.get("eos_id"),
        meta={
            "index_checksum": index_checksum(directory),
            "tokenizer_identity": index["tokenizer"]["identity"],
            "tokens": {s: index["splits"][s]["tokens"] for s in SPLITS},
            "documents": {s: index["splits"][s]["documents"] for s in SPLITS},
        },
    )
