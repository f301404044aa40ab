"""Byte-level BPE corpora (the `bpe` data kind): GPT-2's tokenizer from local files, or one trained here.

* `tokenizer="gpt2"`: GPT-2's byte-level BPE built from `encoder.json` + `vocab.bpe` (give `bpe_dir` holding
  both, or the two paths). Ids are identical to GPT-2's ("Hello world" → [15496, 995]); V = 50,257 and
  "<|endoftext|>" (id 50256) is the end-of-document token.
* `tokenizer="train"`: a byte-level BPE trained on the training split with Hugging Face `tokenizers`
  (`vocab_size` tokens including the 256 byte symbols and "<|endoftext|>", `min_frequency`). Training is
  deterministic, so the same data config always rebuilds the same tokenizer.

Token stream: the text is cut into documents (one per JSON line for .jsonl files, else by `doc_separator`,
else the whole file is one document); each document is encoded and followed by the EOS token when `eos=True`
(the default, the GPT-2 / OpenWebText packing convention), and the concatenated stream is cut into
non-overlapping `seq_len` chunks (the tail is dropped), so chunks may span document boundaries.
Splits as in the `text` kind: `path` + `valid_frac` / `test_frac` (applied to the token stream: first part
train, then valid, then test), or `train_path` / `valid_path` / `test_path`.

Needs the optional `tokenizers` package (`pip install tcsm[text]`); it is imported only here, when used.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tcsm.data.base import DataBundle, DataError, bundle_from_streams, split_by_fractions
from tcsm.data.text import read_documents, resolve_splits

__all__ = ["EOS_TOKEN", "BPETokenizer", "build_bpe", "gpt2_tokenizer", "train_bpe_tokenizer"]

EOS_TOKEN = "<|endoftext|>"


def _tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise DataError("BPE data needs the `tokenizers` package: pip install 'tcsm[text]'") from None
    return tokenizers


class BPETokenizer:
    """A thin wrapper over a Hugging Face byte-level BPE tokenizer: encode/decode, vocab_size, eos_id."""

    def __init__(self, hf_tokenizer, name: str):
        self.hf, self.name = hf_tokenizer, name
        self.vocab_size = hf_tokenizer.get_vocab_size()
        self.eos_id = hf_tokenizer.token_to_id(EOS_TOKEN)

    # Without the tokenizer's post-processor: a BERT or Llama tokenizer would wrap every text in [CLS] … [SEP] or
    # <s>; documents are ended by the EOS the packing adds (GPT-2's byte-level BPE has no post-processor).
    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.hf.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=False)

    def save(self, path: str | Path) -> None:
        """Write the tokenizer as one JSON file (reload with `tokenizers.Tokenizer.from_file`)."""
        self.hf.save(str(path))


def gpt2_tokenizer(
    bpe_dir: str | None = None, encoder_json: str | None = None, vocab_bpe: str | None = None
) -> BPETokenizer:
    """GPT-2's tokenizer from local encoder.json and vocab.bpe (nothing is downloaded)."""
    if bpe_dir is not None:
        encoder_json = encoder_json or str(Path(bpe_dir) / "encoder.json")
        vocab_bpe = vocab_bpe or str(Path(bpe_dir) / "vocab.bpe")
    if encoder_json is None or vocab_bpe is None:
        raise DataError("GPT-2 BPE needs `bpe_dir` (with encoder.json and vocab.bpe) or both file paths")
    for p in (encoder_json, vocab_bpe):
        if not Path(p).expanduser().is_file():
            raise DataError(f"GPT-2 BPE file not found: {p}")
    tk = _tokenizers()
    try:
        hf = tk.ByteLevelBPETokenizer.from_file(
            str(Path(encoder_json).expanduser()), str(Path(vocab_bpe).expanduser()), add_prefix_space=False
        )
    except Exception as e:  # noqa: BLE001  (tokenizers raises a bare Exception on malformed files)
        raise DataError(f"cannot load GPT-2 BPE from {encoder_json}, {vocab_bpe}: {e}") from None
    if hf.token_to_id(EOS_TOKEN) is None:
        raise DataError(f"{encoder_json} has no {EOS_TOKEN} token; is it GPT-2's encoder.json?")
    hf.add_special_tokens(
        [EOS_TOKEN]
    )  # already in the vocabulary: marks it special, so the text maps to 50256
    return BPETokenizer(hf, "gpt2")


def train_bpe_tokenizer(docs: list[str], vocab_size: int = 4096, min_frequency: int = 2) -> BPETokenizer:
    """A byte-level BPE trained on `docs` with `vocab_size` tokens (including 256 bytes and EOS)."""
    if vocab_size < 258:
        raise DataError(
            f"a byte-level BPE needs vocab_size >= 258 (256 bytes + EOS + 1 merge), got {vocab_size}"
        )
    tk = _tokenizers()
    hf = tk.ByteLevelBPETokenizer(add_prefix_space=False)
    hf.train_from_iterator(
        docs,
        vocab_size=int(vocab_size),
        min_frequency=int(min_frequency),
        special_tokens=[EOS_TOKEN],
        show_progress=False,
    )
    return BPETokenizer(hf, f"bpe{vocab_size}")


def _stream(tok: BPETokenizer, docs: list[str], eos: bool) -> np.ndarray:
    out = []
    for ids in tok.encode_batch(docs):
        out.append(np.asarray(ids, dtype=np.int64))
        if eos:
            out.append(np.asarray([tok.eos_id], dtype=np.int64))
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def build_bpe(
    path: str | None = None,
    train_path: str | None = None,
    valid_path: str | None = None,
    test_path: str | None = None,
    seq_len: int = 128,
    valid_frac: float = 0.05,
    test_frac: float = 0.05,
    tokenizer: str = "gpt2",
    bpe_dir: str | None = None,
    encoder_json: str | None = None,
    vocab_bpe: str | None = None,
    vocab_size: int = 4096,
    min_frequency: int = 2,
    doc_separator: str | None = None,
    eos: bool = True,
    text_field: str = "text",
    name: str | None = None,
) -> DataBundle:
    """The `bpe` data kind (see the module docstring)."""
    if tokenizer not in ("gpt2", "train"):
        raise DataError(f"bpe tokenizer must be 'gpt2' or 'train', got {tokenizer!r}")
    mode, files = resolve_splits(path, train_path, valid_path, test_path, valid_frac, test_frac, "bpe")
    if mode == "fractions":
        docs = {"all": read_documents(files["path"], text_field, doc_separator)}
    else:
        docs = {k: (read_documents(v, text_field, doc_separator) if v else []) for k, v in files.items()}
    if tokenizer == "gpt2":
        tok = gpt2_tokenizer(bpe_dir, encoder_json, vocab_bpe)
    else:
        # Train on training text only, so valid/test stay unseen. With one file, the split is on tokens,
        # which are unknown before training, so the tokenizer is fitted on the leading characters instead.
        if mode == "fractions":
            text_len = sum(len(d) for d in docs["all"])
            budget, train_docs = int(text_len * (1 - valid_frac - test_frac)), []
            for d in docs["all"]:
                if budget <= 0:
                    break
                train_docs.append(d[:budget])
                budget -= len(d)
        else:
            train_docs = docs["train"]
        tok = train_bpe_tokenizer(train_docs, vocab_size, min_frequency)
    if mode == "fractions":
        stream = _stream(tok, docs["all"], eos)
        a, b = split_by_fractions(len(stream), valid_frac, test_frac)
        streams = {"train": stream[:a], "valid": stream[a:b], "test": stream[b:]}
    else:
        streams = {k: _stream(tok, v, eos) for k, v in docs.items()}
    src = files.get("path") or files["train"]
    return bundle_from_streams(
        streams,
        seq_len=seq_len,
        tokenizer=tok,
        src=src,
        label=name or f"{Path(src).name.split('.')[0]}-{tok.name}",
        unit="tokens",
        eos_id=tok.eos_id if eos else None,
        meta={"files": files, "tokens": {k: len(v) for k, v in streams.items()}, "tokenizer": tok.name},
    )
