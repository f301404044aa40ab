"""Tokenizers named by a short spec, as `tcsm prepare --tokenizer SPEC` and the `hf` data kind take them.

    char                   the sorted characters of the corpus (found by a first pass), "\\n" ends a document
    gpt2[:DIR]             GPT-2's byte-level BPE from local encoder.json + vocab.bpe (DIR, default $TCSM_GPT2_BPE)
    bpe:N                  a byte-level BPE of N tokens trained on the training documents (tcsm.data.bpe)
    PATH/tokenizer.json    any Hugging Face `tokenizers` file (Llama, Qwen, BERT, a run's own tokenizer.json)
    PATH/                  a Hugging Face tokenizer directory: its tokenizer.json, else `transformers` converts it

Every tokenizer but `char` becomes a Hugging Face `tokenizers.Tokenizer` (a `BPETokenizer` wrapper), so one file,
tokenizer.json, stores it beside the shards and in a run; `identity` is the sha256 of that file's text (of the
character string for `char`), which is how shards and runs tell whether they share token ids.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tcsm.data.base import CharTokenizer, DataError
from tcsm.data.bpe import EOS_TOKEN, BPETokenizer, _tokenizers, gpt2_tokenizer, train_bpe_tokenizer

__all__ = ["EOS_CANDIDATES", "CharDocTokenizer", "identity", "load_saved", "needs_training", "resolve", "save"]

#: special tokens that end a document, in the order they are looked for when a tokenizer names no EOS
EOS_CANDIDATES = (EOS_TOKEN, "<|end_of_text|>", "<|im_end|>", "</s>", "<eos>", "[SEP]", "<|eot_id|>")

CHAR_EOS = "\n"


class CharDocTokenizer(CharTokenizer):
    """A character tokenizer whose end-of-document symbol is the newline (added to the vocabulary)."""

    def __init__(self, chars: str):
        chars = "".join(sorted(set(chars) | {CHAR_EOS}))
        super().__init__(chars)
        self.eos_id = self._index[CHAR_EOS]
        self.pad_id = self.eos_id
        self.name = "char"

    def encode_batch(self, texts: list[str]) -> list:
        fix = "prepare again: the vocabulary is taken from the whole corpus"
        return [self.encode_array(t, what="a document", fix=fix) for t in texts]


def needs_training(spec: str) -> bool:
    """True when the tokenizer is made from the corpus (char, bpe:N): `tcsm prepare` then reads it twice."""
    return spec == "char" or spec.startswith("bpe:")


def _bpe_size(spec: str) -> int:
    try:
        return int(spec.split(":", 1)[1])
    except ValueError:
        raise DataError(f"tokenizer spec {spec!r}: write bpe:N with N the vocabulary size, e.g. bpe:4096") from None


def _with_eos(tok: BPETokenizer, eos: str | None, where: str) -> BPETokenizer:
    """Set eos_id / pad_id from `eos` (a token), the tokenizer's config, or the usual special tokens."""
    names = [eos] if eos else []
    config = Path(where) / "tokenizer_config.json" if Path(where).is_dir() else None
    if not eos and config is not None and config.is_file():
        try:
            value = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
        except (OSError, json.JSONDecodeError):
            value = None
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str):
            names.append(value)
    names += [] if eos else list(EOS_CANDIDATES)
    tok.eos_id = next((tok.hf.token_to_id(n) for n in names if tok.hf.token_to_id(n) is not None), None)
    if eos and tok.eos_id is None:
        raise DataError(f"tokenizer {where} has no token {eos!r} to end documents with; check --eos")
    pad = next((tok.hf.token_to_id(n) for n in ("<pad>", "[PAD]", "<|pad|>") if tok.hf.token_to_id(n) is not None), None)
    tok.pad_id = pad if pad is not None else tok.eos_id
    return tok


def _from_file(path: Path, name: str) -> BPETokenizer:
    tk = _tokenizers()
    try:
        hf = tk.Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001  (tokenizers raises a bare Exception on a file it cannot parse)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"tokenizer file {path} does not parse as a Hugging Face tokenizer.json: {first}") from None
    return BPETokenizer(hf, name)


def _from_dir(path: Path) -> BPETokenizer:
    if (path / "tokenizer.json").is_file():
        return _from_file(path / "tokenizer.json", path.name)
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise DataError(
            f"{path} has no tokenizer.json; converting another tokenizer format needs `transformers` "
            "(pip install 'tcsm[hf]')"
        ) from None
    try:
        slow = AutoTokenizer.from_pretrained(str(path), local_files_only=True, use_fast=True,
                                             trust_remote_code=False)  # never a prompt; custom code is refused
    except Exception as e:  # noqa: BLE001  (transformers raises many types for a folder it cannot read)
        raise DataError(f"cannot load a tokenizer from {path}: {' '.join(str(e).split())[:200]}") from None
    backend = getattr(slow, "backend_tokenizer", None)
    if backend is None:
        raise DataError(f"the tokenizer in {path} has no fast (tokenizers) version; save it with tokenizer.json")
    return BPETokenizer(backend, path.name)


def resolve(spec: str, *, eos: str | None = None, train_docs=None, chars: str | None = None):
    """The tokenizer a spec names. `char` needs `chars` (the corpus characters), `bpe:N` needs `train_docs` (an
    iterable of training documents); the others read only local files."""
    if spec == "char":
        if not chars:
            raise DataError("the corpus holds no characters to build a character vocabulary from")
        return CharDocTokenizer(chars)
    if spec == "gpt2" or spec.startswith("gpt2:"):
        where = spec[5:] or os.environ.get("TCSM_GPT2_BPE")
        if not where:
            raise DataError("tokenizer gpt2 needs its files: --tokenizer gpt2:DIR (encoder.json, vocab.bpe) or TCSM_GPT2_BPE")
        return _with_eos(gpt2_tokenizer(bpe_dir=where), eos, where)
    if spec.startswith("bpe:"):
        size = _bpe_size(spec)
        tok = train_bpe_tokenizer(train_docs if train_docs is not None else [], size, min_frequency=2)
        return _with_eos(tok, eos, spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        return _with_eos(_from_dir(path), eos, str(path))
    if path.is_file():
        return _with_eos(_from_file(path, path.stem), eos, str(path.parent))
    raise DataError(
        f"tokenizer {spec!r} is not char, gpt2[:DIR], bpe:N, nor an existing tokenizer.json or tokenizer directory"
    )


def identity(tok) -> str:
    """sha256 of what defines the token ids: the tokenizer.json text, or the character string."""
    if isinstance(tok, CharTokenizer):
        return hashlib.sha256(tok.chars.encode("utf-8")).hexdigest()
    return hashlib.sha256(tok.hf.to_str().encode("utf-8")).hexdigest()


def save(tok, directory: Path) -> dict:
    """Write the tokenizer into `directory` (tokenizer.json or chars.json); returns its index entry."""
    directory.mkdir(parents=True, exist_ok=True)
    entry = {"identity": identity(tok), "eos_id": tok.eos_id, "pad_id": getattr(tok, "pad_id", None)}
    if isinstance(tok, CharTokenizer):
        (directory / "chars.json").write_text(json.dumps({"chars": tok.chars}), encoding="utf-8")
        return {"kind": "char", "file": "chars.json", **entry}
    (directory / "tokenizer.json").write_text(tok.hf.to_str(), encoding="utf-8")
    return {"kind": "hf", "file": "tokenizer.json", "name": tok.name, **entry}


def load_saved(directory: Path, entry: dict):
    """The tokenizer `save` wrote, checked against its recorded identity."""
    path = directory / entry["file"]
    if not path.is_file():
        raise DataError(f"tokenizer file missing: {path}; prepare the shards again")
    if entry["kind"] == "char":
        try:
            tok = CharDocTokenizer(json.loads(path.read_text(encoding="utf-8"))["chars"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise DataError(f"{path} is not a character vocabulary written by tcsm prepare") from None
    else:
        tok = _from_file(path, entry.get("name", "saved"))
    tok.eos_id, tok.pad_id = entry.get("eos_id"), entry.get("pad_id")
    if identity(tok) != entry["identity"]:
        raise DataError(f"tokenizer {path} was changed after the shards were made (checksum differs); prepare again")
    return tok
