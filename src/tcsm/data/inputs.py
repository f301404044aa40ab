"""The documents of a corpus given as files, globs and folders (what `tcsm prepare` and the `hf` kind read).

    .txt / .text / other text   the whole file is one document, or pieces between `doc_separator` (UTF-8, a
                                leading byte-order mark dropped, CRLF and CR line ends read as LF)
    .gz                         the same, gzip-compressed
    .jsonl / .jsonl.gz          one document per line: its `text_field`
    .parquet                    one document per row: column `text_field` (needs pyarrow: tcsm[datasets])
    a `save_to_disk` folder     one document per row of its `text_field` (needs datasets: tcsm[datasets])
    any other folder            every file above inside it, recursively, in sorted order

Files are read lazily, in a fixed (sorted) order, so a corpus is never held in memory and two reads give the same
documents in the same order. What cannot be read is a DataError naming the file: a missing path, a glob that
matches nothing, a binary file, a JSON line without the text field, an input that holds no document at all.
"""

from __future__ import annotations

import glob
import gzip
from collections.abc import Iterator
from pathlib import Path

from tcsm.data.base import DataError, jsonl_objects, not_utf8

__all__ = ["Source", "documents", "expand_inputs"]

_TEXT_SUFFIXES = {".txt", ".text", ".md", ".raw", ".tokens", ".csv", ".tsv", ".rst", ""}


class Source:
    """One readable input: `kind` is text | jsonl | parquet | datasets."""

    def __init__(self, path: Path, kind: str):
        self.path, self.kind = path, kind

    def __repr__(self) -> str:
        return f"Source({str(self.path)!r}, {self.kind!r})"


def _is_datasets_dir(p: Path) -> bool:
    return p.is_dir() and ((p / "dataset_info.json").is_file() or (p / "dataset_dict.json").is_file())


def _kind_of(p: Path) -> str | None:
    name = p.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    stem_suffix = Path(name[:-3]).suffix if name.endswith(".gz") else p.suffix.lower()
    return "text" if stem_suffix in _TEXT_SUFFIXES else None


def _walk(d: Path) -> list[Source]:
    if _is_datasets_dir(d):
        return [Source(d, "datasets")]
    out = []
    for p in sorted(d.iterdir()):
        if p.name.startswith("."):
            continue
        if p.is_dir():
            out += _walk(p)
        elif _kind_of(p) is not None:
            out.append(Source(p, _kind_of(p)))
    return out


def expand_inputs(inputs: list[str] | str) -> list[Source]:
    """Sources of files, globs and folders, in the order given (each glob and folder sorted)."""
    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    if not inputs:
        raise DataError("no input given: name files, globs or folders of text")
    out: list[Source] = []
    for item in inputs:
        p = Path(item).expanduser()
        if any(c in item for c in "*?["):
            matches = sorted(glob.glob(str(p), recursive=True))
            if not matches:
                raise DataError(f"input {item!r} matches no file")
            for m in matches:
                mp = Path(m)
                out += _walk(mp) if mp.is_dir() else [Source(mp, _kind_of(mp) or "text")]
        elif p.is_dir():
            found = _walk(p)
            if not found:
                raise DataError(f"input folder {p} holds no .txt, .gz, .jsonl(.gz) or .parquet file")
            out += found
        elif p.is_file():
            out.append(Source(p, _kind_of(p) or "text"))
        else:
            raise DataError(f"input not found: {p}")
    return out


def _read_text_file(p: Path) -> str:
    opener = gzip.open if p.name.endswith(".gz") else open
    try:
        with opener(p, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as e:
        raise DataError(f"cannot read {p}: {type(e).__name__}: {e}") from None
    wide = not_utf8(p, raw[:4096])
    if wide:  # UTF-16 holds NUL bytes too, but it is text
        raise DataError(wide)
    if b"\x00" in raw[:65536]:
        raise DataError(f"{p} looks binary (it holds NUL bytes), not text; give text, .jsonl or .parquet files")
    try:
        text = raw.decode("utf-8-sig")  # a byte-order mark marks the encoding; it is no character of the corpus
    except UnicodeDecodeError as e:
        raise DataError(f"{p} is not UTF-8 text (byte {e.start}); convert it or leave it out") from None
    # universal newlines, as Python's text mode reads them: a CRLF (or CR) file has the same documents, the same
    # blank lines for a '\n\n' separator and the same characters as its LF copy
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def _jsonl_docs(p: Path, text_field: str) -> Iterator[str]:
    for n, obj in jsonl_objects(p):
        if obj is jsonl_objects.BAD:
            raise DataError(f"{p}:{n}: not valid JSON")
        if not isinstance(obj, dict) or not isinstance(obj.get(text_field), str):
            have = sorted(obj)[:8] if isinstance(obj, dict) else type(obj).__name__
            raise DataError(f"{p}:{n}: no string field {text_field!r} (found {have}); set the text field option")
        yield obj[text_field]


def _column_error(p: Path, text_field: str, names) -> DataError:
    return DataError(f"{p} has no column {text_field!r} (columns: {list(names)[:8]}); set the text field option")


def _parquet_docs(p: Path, text_field: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError("Parquet input needs pyarrow: pip install 'tcsm[datasets]'") from None
    try:
        f = pq.ParquetFile(str(p))
    except Exception as e:  # noqa: BLE001  (pyarrow raises ArrowInvalid and OSError subclasses)
        raise DataError(f"cannot read Parquet file {p}: {' '.join(str(e).split())[:200]}") from None
    if text_field not in f.schema_arrow.names:
        raise _column_error(p, text_field, f.schema_arrow.names)
    for batch in f.iter_batches(columns=[text_field], batch_size=1024):
        for value in batch.column(0).to_pylist():
            if isinstance(value, str):
                yield value


def _datasets_docs(p: Path, text_field: str) -> Iterator[str]:
    try:
        import datasets
    except ImportError:
        raise DataError("a `datasets` folder as input needs datasets: pip install 'tcsm[datasets]'") from None
    try:
        ds = datasets.load_from_disk(str(p))
    except Exception as e:  # noqa: BLE001  (datasets raises many types for a folder it cannot read)
        raise DataError(f"cannot load the datasets folder {p}: {' '.join(str(e).split())[:200]}") from None
    parts = [ds[k] for k in sorted(ds)] if isinstance(ds, datasets.DatasetDict) else [ds]
    for part in parts:
        if text_field not in part.column_names:
            raise _column_error(p, text_field, part.column_names)
        column = part.select_columns([text_field]).with_format("arrow")
        for start in range(0, len(column), 1024):
            for value in column[start : start + 1024][text_field].to_pylist():
                if isinstance(value, str):
                    yield value


def documents(sources: list[Source], text_field: str = "text", doc_separator: str | None = None) -> Iterator[str]:
    """Every non-empty document of the sources, in order; DataError if there is none at all."""
    count = 0
    for src in sources:
        if src.kind == "text":
            text = _read_text_file(src.path)
            docs = text.split(doc_separator) if doc_separator else [text]
        elif src.kind == "jsonl":
            docs = _jsonl_docs(src.path, text_field)
        elif src.kind == "parquet":
            docs = _parquet_docs(src.path, text_field)
        else:
            docs = _datasets_docs(src.path, text_field)
        for d in docs:
            if d and d.strip():
                count += 1
                yield d
    if count == 0:
        names = ", ".join(str(s.path) for s in sources[:3])
        raise DataError(f"the input holds no text (no non-empty document in {names}{'…' if len(sources) > 3 else ''})")


def describe(sources: list[Source]) -> list[str]:
    return [str(s.path) for s in sources]

