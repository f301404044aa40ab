"""What every data source returns: a `DataBundle` of fixed-length token chunks plus its tokenizer.

Also the shared pieces the sources use: `DataError` (user-facing data problems), `CharTokenizer`,
file reading (`read_text`: .txt / .gz / .zip), split fractions, chunking and compact storage.
"""

from __future__ import annotations

import gzip
import json
import math
import zipfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "CharTokenizer",
    "DataBundle",
    "DataError",
    "Tokenizer",
    "chunk",
    "compact_dtype",
    "jsonl_objects",
    "read_text",
    "readable_text",
    "split_by_fractions",
]


class DataError(ValueError):
    """A problem with the user's data or data config; the message is one actionable line."""


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def readable_text(tokenizer, ids) -> str:
    """The text of token ids as a person reads a sample: a `tokenizers` vocabulary's special tokens (end of text,
    padding, [CLS], [MASK], …) are not printed; `decode` keeps them, for round trips."""
    ids = [int(i) for i in (ids.reshape(-1).tolist() if isinstance(ids, torch.Tensor) else ids)]
    hf = getattr(tokenizer, "hf", None)
    if hf is not None:
        return hf.decode(ids, skip_special_tokens=True)
    return tokenizer.decode(ids)


class CharTokenizer:
    """Characters ↔ ids 0..V−1 in the order of `chars` (sorted by the sources that build one)."""

    def __init__(self, chars: str):
        if len(set(chars)) != len(chars):
            raise DataError(f"character vocabulary has duplicates: {chars!r}")
        if not chars:
            raise DataError("character vocabulary is empty")
        self.chars = chars
        self.vocab_size = len(chars)
        self._index = {c: i for i, c in enumerate(chars)}
        # A 64K lookup table turns encoding a long string into one numpy gather when all chars are in the BMP
        # (int16 ids keep the 100M-character text8 at 200 MB while encoding).
        self._table = None
        if max(map(ord, chars)) < 65536 and len(chars) < 32768:
            table = np.full(65536, -1, dtype=np.int16)
            table[[ord(c) for c in chars]] = np.arange(len(chars), dtype=np.int16)
            self._table = table

    def encode_array(self, text: str, what: str = "text", fix: str = "extend the vocabulary or clean the text") -> np.ndarray:
        """Integer ids of every character; DataError naming the first unknown character and `fix`."""
        if self._table is not None and text.isascii():
            codes = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
            ids = self._table[codes]
        elif self._table is not None:
            codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
            ids = np.where(codes < 65536, self._table[np.minimum(codes, 65535)], -1)
        else:
            ids = np.fromiter((self._index.get(c, -1) for c in text), dtype=np.int32, count=len(text))
        bad = np.flatnonzero(ids < 0)
        if bad.size:
            c = text[int(bad[0])]
            raise DataError(
                f"{what} contains {bad.size} character(s) outside the {self.vocab_size}-symbol vocabulary, "
                f"first {c!r} at offset {int(bad[0])}; {fix}"
            )
        return ids

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


@dataclass
class DataBundle:
    """Train / valid / test token chunks [N, seq_len] (compact integer dtype) and how to read them.

    `nats_per_token_floor` is the exact −log p₁ per token of the source when it is known (synthetic sources),
    the best any model can reach. `label` is the name to print next to reported numbers (e.g. "text8-prefix").
    `source`, when set, is the generating distribution itself (it has `log_prob(x) -> Tensor[B]`), so samples
    can be scored exactly.
    """

    name: str
    vocab_size: int
    seq_len: int
    train: Tensor
    valid: Tensor
    test: Tensor
    tokenizer: Any
    nats_per_token_floor: float | None = None
    label: str = ""
    eos_id: int | None = None
    source: Any = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.label:
            self.label = self.name
        for split in ("train", "valid", "test"):
            x = getattr(self, split)
            if x.dim() != 2 or x.shape[1] != self.seq_len:
                raise DataError(
                    f"{self.name}: {split} must have shape [N, {self.seq_len}], got {tuple(x.shape)}"
                )
        if self.train.shape[0] == 0:
            raise DataError(f"{self.name}: the training split holds no complete {self.seq_len}-token chunk")

    def split(self, name: str) -> Tensor:
        if name not in ("train", "valid", "test"):
            raise DataError(f"unknown split {name!r}; choose train, valid or test")
        return getattr(self, name)

    def get_batch(self, split: str, indices: Tensor, device: torch.device | str | None = None) -> Tensor:
        """Rows `indices` of a split as a LongTensor (the compact storage is widened only per batch)."""
        x = self.split(split)[torch.as_tensor(indices, dtype=torch.long)]
        return x.to(device=device, dtype=torch.long, non_blocking=True)

    def encode(self, text: str) -> Tensor:
        return torch.tensor(self.tokenizer.encode(text), dtype=torch.long)

    def decode(self, ids) -> str:
        if isinstance(ids, Tensor):
            ids = ids.reshape(-1).tolist()
        return self.tokenizer.decode(list(ids))

    def summary(self) -> str:
        sizes = ", ".join(f"{s}={getattr(self, s).shape[0]}" for s in ("train", "valid", "test"))
        # Bits, like every other figure a run prints (losses in nats are labelled as such where they appear).
        floor = (
            ""
            if self.nats_per_token_floor is None
            else f", floor={self.nats_per_token_floor / math.log(2):.4f} bits/token"
        )
        return f"{self.label}: V={self.vocab_size}, L={self.seq_len}, chunks {sizes}{floor}"


@dataclass(frozen=True)
class TensorRows:
    """One split of records held as tensors of equal first dimension (e.g. chosen, rejected, prompt mask): sliced
    like a tensor (`rows[:k]`, `rows[index_tensor]`) and sized like one (`shape`, `len`), so the trainer's data
    plumbing treats it as the split's rows. Subclasses name the tensors (dataclass fields) and give `to_batch`."""

    @property
    def shape(self) -> torch.Size:
        return getattr(self, fields(self)[0].name).shape

    def __len__(self) -> int:
        return int(self.shape[0])

    def __getitem__(self, index):
        if isinstance(index, int):
            index = slice(index, index + 1)
        return type(self)(*(getattr(self, f.name)[index] for f in fields(self)))

    def to_batch(self, device=None):
        raise NotImplementedError


@dataclass
class RowsBundle(DataBundle):
    """A `DataBundle` whose splits are `TensorRows` and whose batches are their `to_batch` (a `Batch` with a prompt
    mask, a rejected sequence, ...)."""

    #: what a record is called in messages (e.g. "pair")
    record: ClassVar[str] = "record"

    def __post_init__(self) -> None:
        self.label = self.label or self.name
        if len(self.train) == 0:
            raise DataError(f"{self.name}: no usable {self.record} is left for training; lower valid_frac / test_frac")

    def get_batch(self, split: str, indices, device=None):
        return self.split(split)[torch.as_tensor(indices, dtype=torch.long)].to_batch(device)

    def describe_rows(self, what: str) -> str:
        """`label: V=.., L=.., <what> train=.., valid=.., test=..` and the records skipped or truncated."""
        sizes = ", ".join(f"{s}={len(getattr(self, s))}" for s in ("train", "valid", "test"))
        bad = self.meta.get("bad_records") or {}
        skipped = "; skipped " + ", ".join(f"{n} {why}" for why, n in bad.items()) if bad else ""
        cut = f"; {self.meta['truncated']} truncated to fit" if self.meta.get("truncated") else ""
        return f"{self.label}: V={self.vocab_size}, L={self.seq_len}, {what} {sizes}{skipped}{cut}"


# --- shared helpers --------------------------------------------------------------------------------------


def wide_encoding(raw: bytes) -> str | None:
    """"UTF-16" or "UTF-32" when `raw` is text in one of those with a byte-order mark, "UTF-16LE" / "UTF-16BE" for
    the every-other-byte NULs of UTF-16 without one, else None: such a file is text in another encoding, not binary
    (the name is the one iconv takes)."""
    if raw.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "UTF-32"
    if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "UTF-16"
    head = raw[: 4096 - 4096 % 2]
    if len(head) >= 8:
        even, odd = head[0::2], head[1::2]
        for zeros, other, enc in ((odd, even, "UTF-16LE"), (even, odd, "UTF-16BE")):
            if zeros.count(0) >= 0.9 * len(zeros) and other.count(0) <= 0.1 * len(other):
                return enc
    return None


def not_utf8(p: Path, raw: bytes) -> str | None:
    """The one-line message for a file in UTF-16 / UTF-32 (`wide_encoding`), with the command that converts it."""
    enc = wide_encoding(raw)
    if enc is None:
        return None
    return (
        f"{p} is {enc} text, not UTF-8; convert it, e.g. iconv -f {enc} -t UTF-8 {p.name} > {p.stem}-utf8{p.suffix}"
    )


def read_text(path: str | Path, what: str = "text file", member: str | None = None) -> str:
    """Read a UTF-8 text file: plain, gzip (.gz) or a zip archive (.zip; its only or named member)."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"{what} not found: {p}")
    if p.is_dir():
        raise DataError(f"{what} is a directory, expected a file: {p}")
    try:
        if p.suffix == ".gz":
            with gzip.open(p, "rt", encoding="utf-8") as f:
                text = f.read()
        elif p.suffix == ".zip":
            with zipfile.ZipFile(p) as z:
                names = [n for n in z.namelist() if not n.endswith("/")]
                if member is None:
                    if len(names) != 1:
                        raise DataError(f"{what} {p} holds {len(names)} files; name the one to read")
                    member = names[0]
                elif member not in names:
                    raise DataError(f"{what} {p} has no member {member!r} (members: {names[:5]})")
                text = z.read(member).decode("utf-8")
        else:
            text = p.read_text(encoding="utf-8")
    except DataError:
        raise
    except UnicodeDecodeError as e:
        wide = not_utf8(p, e.object[:4096] if isinstance(e.object, bytes) else b"")
        raise DataError(wide or f"cannot read {what} {p}: {type(e).__name__}: {e}") from None
    except (OSError, EOFError, zipfile.BadZipFile, gzip.BadGzipFile) as e:
        raise DataError(f"cannot read {what} {p}: {type(e).__name__}: {e}") from None
    if not text:
        raise DataError(f"{what} is empty: {p}")
    wide = not_utf8(p, text[:4096].encode("utf-8")) if "\x00" in text[:4096] else None
    if wide:  # UTF-16 without a byte-order mark decodes as UTF-8 with a NUL after every character
        raise DataError(wide)
    return text


def split_by_fractions(n: int, valid_frac: float, test_frac: float) -> tuple[int, int]:
    """Boundaries (a, b) so that [0, a) is train, [a, b) valid, [b, n) test; fractions of n, rounded down."""
    for name, f in (("valid_frac", valid_frac), ("test_frac", test_frac)):
        if not 0.0 <= f < 1.0:
            raise DataError(f"{name} must be in [0, 1), got {f}")
    if valid_frac + test_frac >= 1.0:
        raise DataError(
            f"valid_frac + test_frac must be < 1 (leave data to train on), got {valid_frac + test_frac}"
        )
    n_valid, n_test = int(n * valid_frac), int(n * test_frac)
    return n - n_valid - n_test, n - n_test


def compact_dtype(vocab_size: int) -> torch.dtype:
    """Smallest signed-safe integer dtype holding ids < vocab_size (uint8 is fine: ids are non-negative)."""
    if vocab_size <= 256:
        return torch.uint8
    if vocab_size <= 32768:
        return torch.int16
    return torch.int32


def chunk(ids: np.ndarray | Tensor, seq_len: int, vocab_size: int) -> Tensor:
    """Cut a 1-D id stream into non-overlapping rows of seq_len (the incomplete tail is dropped)."""
    if seq_len < 1:
        raise DataError(f"seq_len must be a positive integer, got {seq_len}")
    ids = torch.as_tensor(np.asarray(ids) if not isinstance(ids, Tensor) else ids)
    n = ids.numel() // seq_len
    return ids[: n * seq_len].to(compact_dtype(vocab_size)).reshape(n, seq_len)


def bundle_from_streams(
    streams: dict[str, Any], *, seq_len: int, tokenizer, src, label: str | None, unit: str, **fields: Any
) -> DataBundle:
    """Chunk the train/valid/test id streams into rows of seq_len and wrap them in a DataBundle; a training
    split shorter than one chunk is a DataError (the text, BPE and HF corpora share this). `label` None: the
    name of the file `src` without its extensions."""
    label = label or Path(src).name.split(".")[0]
    parts = {k: chunk(v, seq_len, tokenizer.vocab_size) for k, v in streams.items()}
    if parts["train"].shape[0] == 0:
        raise DataError(
            f"the training split of {src} has {len(streams['train'])} {unit}, less than one chunk of {seq_len}"
        )
    return DataBundle(
        name=label,
        vocab_size=tokenizer.vocab_size,
        seq_len=int(seq_len),
        train=parts["train"],
        valid=parts["valid"],
        test=parts["test"],
        tokenizer=tokenizer,
        label=label,
        **fields,
    )


_BAD_JSON = object()


def jsonl_objects(path: Path):
    """(line number, parsed value) of each non-blank line of a JSON-lines file (gzip when it ends in .gz); the value
    is `jsonl_objects.BAD` where the line is not valid JSON, so each reader chooses to refuse or count it. A file
    that cannot be read raises one DataError."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8-sig") as f:  # -sig: a byte-order mark is not part of line 1
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield n, json.loads(line)
                except json.JSONDecodeError:
                    yield n, _BAD_JSON
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read {path}: {type(e).__name__}: {e}") from None


jsonl_objects.BAD = _BAD_JSON
