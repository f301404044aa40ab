"""The `tokenizer` data kind: a tokenizer and a length, no text. It is the data section of a run imported from a
Hugging Face model directory (the model brings its own tokenizer, the text comes later): a recipe over prompted
records (`sft`, `pairs`) tokenizes its records with it, and a run that would train or evaluate on it is refused in
one line naming the data to give."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tcsm.data import tokenizer_spec
from tcsm.data.base import DataBundle, DataError
from tcsm.data.build import DATA_KINDS

__all__ = ["TokenizerBundle", "build_tokenizer_only"]

NO_TEXT = (
    "data.kind=tokenizer (the data of a Hugging Face model directory) holds no text to {what}; give the data: a "
    "recipe's records (--data FILE), or data.kind=shards data.path=SHARDS data.seq_len=N over shards made by "
    "`tcsm prepare TEXT -o SHARDS --tokenizer {path}`"
)


@dataclass
class TokenizerBundle(DataBundle):
    """A `DataBundle` with empty splits: its tokenizer, vocabulary, length and end-of-text id only."""

    def __post_init__(self) -> None:
        if not self.label:
            self.label = self.name

    def split(self, name: str):
        raise DataError(NO_TEXT.format(what=f"read a {name} split from", path=self.meta.get("path", "DIR")))

    def get_batch(self, split, indices, device=None):
        return self.split(split)


def build_tokenizer_only(path: str, seq_len: int = 128, eos: str | None = None, name: str | None = None) -> TokenizerBundle:
    """The tokenizer at `path` (a tokenizer.json or a Hugging Face directory holding one) with rows of `seq_len`."""
    if int(seq_len) < 1:
        raise DataError(f"data.seq_len must be >= 1, got {seq_len}")
    tok = tokenizer_spec.resolve(str(path), eos=eos)
    if int(tok.vocab_size) < 2:
        raise DataError(f"tokenizer {path!r} has a vocabulary of {tok.vocab_size} token(s); a model needs at least 2")
    empty = torch.zeros(0, int(seq_len), dtype=torch.long)
    return TokenizerBundle(
        name=name or f"{Path(path).name}-tokenizer",
        vocab_size=int(tok.vocab_size),
        seq_len=int(seq_len),
        train=empty,
        valid=empty,
        test=empty,
        tokenizer=tok,
        eos_id=tok.eos_id,
        meta={"tokenizer_identity": tokenizer_spec.identity(tok), "path": str(path)},
    )


DATA_KINDS["tokenizer"] = build_tokenizer_only
