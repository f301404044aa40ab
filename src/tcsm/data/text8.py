"""text8: 100M characters of Wikipedia over 27 symbols (a–z and space), the character-level benchmark.

Two splits:

* `split="standard"` — the usual 90M / 5M / 5M characters (train / valid / test), in `seq_len` chunks
  (256 by default). Without `path`, `text8.zip` is downloaded from `TEXT8_URL` into `cache_dir` and verified
  against the SHA-1 published with Apache MXNet / GluonNLP's Text8 dataset (`TEXT8_ZIP_SHA1`, and
  `TEXT8_SHA1` for the unzipped content). With `path`, a local text8.zip, text8 / text8.txt or a .gz of it
  is read. Either way the text must be exactly 100,000,000 characters of the 27-symbol alphabet, and with
  `verify=True` (default) its SHA-1 must match; otherwise a DataError explains what differs. These digests were
  taken from that public source and could not be recomputed here (no network), so a mismatch reports both.
* `split="prefix"` — any truncated text8 file (e.g. the 12,549,840-character prefix in
  `../shared/data/text8/text8_prefix.txt.gz`; `path` is required): first 90% train, next 5% valid, last 5% test.
  Its label is "text8-prefix": numbers from it are not comparable with text8 results and must say so.

Ids: space = 0, a–z = 1..26.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.request
from pathlib import Path

import numpy as np
import torch

from tcsm.data.base import CharTokenizer, DataBundle, DataError, chunk, read_text, split_by_fractions
from tcsm.storage.fileio import file_digest

__all__ = ["ALPHABET", "TEXT8_URL", "build_text8", "default_cache_dir", "fetch"]

ALPHABET = " abcdefghijklmnopqrstuvwxyz"
TEXT8_URL = "http://mattmahoney.net/dc/text8.zip"
TEXT8_ZIP_SHA1 = "6c70299b93b7e1f927b42cd8f6ac1a31547c7a2e"  # of text8.zip (31,344,016 bytes)
TEXT8_SHA1 = "0dc3edebc970dcc96137e7deda4d9995af9d93de"  # of the unzipped file
TEXT8_NUM_CHARS = 100_000_000
STANDARD_SPLIT = (0.05, 0.05)  # valid, test fractions of 100M: 90M / 5M / 5M


def default_cache_dir() -> Path:
    """$TCSM_CACHE_DIR, else $XDG_CACHE_HOME/tcsm, else ~/.cache/tcsm."""
    if os.environ.get("TCSM_CACHE_DIR"):
        return Path(os.environ["TCSM_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "tcsm"


def fetch(url: str, dest: str | Path, sha1: str | None) -> Path:
    """Download url to dest (atomically, via dest.part) and check its SHA-1; DataError on any failure."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    try:
        with urllib.request.urlopen(url, timeout=60) as r, open(part, "wb") as f:
            shutil.copyfileobj(r, f, 1 << 20)
    except OSError as e:  # URLError and HTTPError are OSErrors
        part.unlink(missing_ok=True)
        raise DataError(
            f"download of {url} failed ({e}); download it yourself and pass its local path"
        ) from None
    if sha1 is not None:
        got = file_digest(part, "sha1")
        if got != sha1:
            part.unlink(missing_ok=True)
            raise DataError(
                f"checksum mismatch for {url}: SHA-1 {got}, expected {sha1}; the download was deleted"
            )
    part.replace(dest)
    return dest


def _read_text8(path: Path) -> str:
    member = None
    if path.suffix == ".zip" and path.is_file():
        import zipfile

        try:
            with zipfile.ZipFile(path) as z:
                member = "text8" if "text8" in z.namelist() else None
        except (OSError, zipfile.BadZipFile) as e:
            raise DataError(f"cannot read text8 archive {path}: {e}; replace or delete the file") from None
    return read_text(path, "text8 file", member=member)


def build_text8(
    path: str | None = None,
    split: str = "standard",
    seq_len: int = 256,
    cache_dir: str | None = None,
    url: str = TEXT8_URL,
    verify: bool = True,
) -> DataBundle:
    """The `text8` data kind (see the module docstring for the two splits)."""
    if split not in ("standard", "prefix"):
        raise DataError(f"text8 split must be 'standard' or 'prefix', got {split!r}")
    if split == "prefix":
        if path is None:
            raise DataError(
                "text8 split 'prefix' needs `path` to a truncated text8 file (e.g. text8_prefix.txt.gz)"
            )
        text = read_text(Path(path), "text8 prefix file")
    else:
        if path is None:
            zpath = Path(cache_dir).expanduser() if cache_dir else default_cache_dir() / "text8"
            zpath = zpath / "text8.zip"
            if not zpath.exists():
                fetch(url, zpath, TEXT8_ZIP_SHA1 if verify else None)
            path = zpath
        text = _read_text8(Path(path))
        if len(text) != TEXT8_NUM_CHARS:
            raise DataError(
                f"{path} has {len(text):,} characters, but text8 has exactly {TEXT8_NUM_CHARS:,}; "
                "for a truncated file use split: prefix"
            )
    tok = CharTokenizer(ALPHABET)
    ids = tok.encode_array(text, what=f"text8 file {path}").astype(np.uint8)
    if split == "standard" and verify:
        got = hashlib.sha1(text.encode("ascii")).hexdigest()
        if got != TEXT8_SHA1:
            raise DataError(
                f"{path} is not the published text8 (SHA-1 {got}, expected {TEXT8_SHA1}); "
                "pass verify: false to use it anyway"
            )
    del text
    a, b = split_by_fractions(len(ids), *STANDARD_SPLIT)
    ids = torch.from_numpy(ids)
    parts = [chunk(ids[:a], seq_len, 27), chunk(ids[a:b], seq_len, 27), chunk(ids[b:], seq_len, 27)]
    label = "text8" if split == "standard" else "text8-prefix"
    return DataBundle(
        name="text8",
        vocab_size=len(ALPHABET),
        seq_len=int(seq_len),
        train=parts[0],
        valid=parts[1],
        test=parts[2],
        tokenizer=tok,
        label=label,
        meta={"path": str(path), "split": split, "chars": {"train": a, "valid": b - a, "test": len(ids) - b}},
    )
