"""Any text file as a character-level corpus (the `text` data kind), and the file/split plumbing it shares
with the `bpe` kind.

Files: plain text, .gz, a single-file .zip, or JSON lines (.jsonl / .jsonl.gz) whose `text_field` of every
line is one document. Splits come either from one `path` cut by `valid_frac` / `test_frac` (first part train,
then valid, then test — contiguous, so no text leaks across splits) or from separate `train_path`,
`valid_path` and (optional) `test_path` files.

Character vocabulary: the sorted set of characters of the whole corpus (every split), or `vocab` (a string)
given explicitly. The symbol inventory is not a learned statistic, so taking it from all splits leaks nothing a
model could fit, while a training-split vocabulary would refuse ordinary files (a final newline, a rare accent
that only occurs in the test part); characters the training split lacks simply get little probability. With an
explicit `vocab`, characters outside it raise a DataError that names the `data.oov` option (`oov="error"`, the
default), or are deleted (`oov="drop"`; the number dropped per split is recorded in `meta`).
"""

from __future__ import annotations

from pathlib import Path

from tcsm.data.base import (
    CharTokenizer,
    DataBundle,
    DataError,
    bundle_from_streams,
    jsonl_objects,
    read_text,
    split_by_fractions,
)

__all__ = ["build_text", "read_documents", "resolve_splits"]


def _is_jsonl(path: Path) -> bool:
    return path.name.endswith(".jsonl") or path.name.endswith(".jsonl.gz")


def read_documents(path: str | Path, text_field: str = "text", doc_separator: str | None = None) -> list[str]:
    """Documents of a file: one per JSON line (its `text_field`), else the text split on `doc_separator`."""
    p = Path(path).expanduser()
    if not _is_jsonl(p):
        text = read_text(p)
        docs = text.split(doc_separator) if doc_separator else [text]
        return [d for d in docs if d]
    if not p.exists():
        raise DataError(f"text file not found: {p}")
    docs = []
    for n, obj in jsonl_objects(p):
        if obj is jsonl_objects.BAD:
            raise DataError(f"{p}:{n}: not valid JSON")
        if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
            raise DataError(f"{p}:{n}: expected an object with a string field {text_field!r}")
        docs.append(obj[text_field])
    if not docs:
        raise DataError(f"no documents in {p}")
    return docs


def tokenized_splits(mode: str, files: dict, tokenize, valid_frac: float, test_frac: float, seed: int = 0):
    """({"train", "valid", "test"} rows, records truncated) of record files resolved by `resolve_splits`:
    `tokenize(path or None) -> (rows, truncated)` reads one file (None: an empty split) into sliceable rows; one
    file is shuffled with `seed` and split by fractions, separate files are the splits."""
    import torch

    if mode == "fractions":
        rows, truncated = tokenize(files["path"])
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(int(seed)))
        a, b = split_by_fractions(len(rows), valid_frac, test_frac)
        return {"train": rows[order[:a]], "valid": rows[order[a:b]], "test": rows[order[b:]]}, truncated
    splits, truncated = {}, 0
    for split, f in files.items():
        splits[split], cut = tokenize(f)
        truncated += cut
    return splits, truncated


def resolve_splits(
    path, train_path, valid_path, test_path, valid_frac: float, test_frac: float, kind: str
) -> tuple[str, dict[str, str | None]]:
    """Validate the split options; returns ("fractions", {"path"}) or ("files", {train, valid, test})."""
    if path is not None and (train_path or valid_path or test_path):
        raise DataError(
            f"{kind} data: give either `path` (split by fractions) or train/valid/test paths, not both"
        )
    if path is not None:
        split_by_fractions(100, valid_frac, test_frac)  # validates the fractions early
        return "fractions", {"path": path}
    if train_path is None or valid_path is None:
        raise DataError(f"{kind} data needs `path`, or at least `train_path` and `valid_path`")
    return "files", {"train": train_path, "valid": valid_path, "test": test_path}


def _join(path, text_field) -> str:
    return "\n".join(read_documents(path, text_field)) if _is_jsonl(Path(path)) else read_text(path)


def _drop_oov(text: str, vocab: set[str]) -> tuple[str, int]:
    kept = "".join(c for c in text if c in vocab)
    return kept, len(text) - len(kept)


def build_text(
    path: str | None = None,
    train_path: str | None = None,
    valid_path: str | None = None,
    test_path: str | None = None,
    seq_len: int = 256,
    valid_frac: float = 0.05,
    test_frac: float = 0.05,
    vocab: str | None = None,
    oov: str = "error",
    text_field: str = "text",
    name: str | None = None,
) -> DataBundle:
    """The `text` data kind: a character-level corpus in seq_len chunks."""
    if oov not in ("error", "drop"):
        raise DataError(f"oov must be 'error' or 'drop', got {oov!r}")
    mode, files = resolve_splits(path, train_path, valid_path, test_path, valid_frac, test_frac, "text")
    if mode == "fractions":
        text = _join(files["path"], text_field)
        a, b = split_by_fractions(len(text), valid_frac, test_frac)
        texts = {"train": text[:a], "valid": text[a:b], "test": text[b:]}
    else:
        texts = {k: (_join(v, text_field) if v else "") for k, v in files.items()}
    chars = vocab if vocab is not None else "".join(sorted(set().union(*map(set, texts.values()))))
    tok = CharTokenizer(chars)
    dropped = {}
    if oov == "drop":
        for split in ("train", "valid", "test"):
            texts[split], dropped[split] = _drop_oov(texts[split], set(chars))
    src = files.get("path") or files["train"]
    fix = "add them to data.vocab, or set data.oov=drop to delete them"
    streams = {s: tok.encode_array(t, what=f"the {s} split of {src}", fix=fix) for s, t in texts.items()}
    return bundle_from_streams(
        streams,
        seq_len=seq_len,
        tokenizer=tok,
        src=src,
        label=name,
        unit="characters",
        meta={"files": files, "chars": {s: len(t) for s, t in texts.items()}, "dropped_oov": dropped},
    )
