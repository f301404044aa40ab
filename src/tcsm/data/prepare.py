"""`prepare`: tokenise a corpus once into memory-mappable token shards (what `tcsm prepare` runs).

Documents are read in a fixed order (`tcsm.data.inputs`) and sent in batches to `workers` processes that encode
them; the results come back in order, so the shards do not depend on the number of workers. Each document goes to
train, valid or test by a hash of its text (`split_of`): held out by document, independent of order and workers,
and duplicates land in the same split. Packing: `eos` concatenates documents, each followed by the EOS token (the
GPT-2 / OpenWebText convention); `pad` stores one row of `seq_len` tokens per document, cut or padded.

Nothing is written into the output folder until the end: shards and the tokenizer go to `DIR/.prepare-<pid>/`,
are moved in when complete, and `index.json` is renamed in last. An interrupted run leaves no index (training
refuses the folder) and the next run deletes the leftovers and starts again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from tcsm.core.progress import WorkProgress
from tcsm.data import tokenizer_spec
from tcsm.data.base import DataError
from tcsm.data.inputs import Source, documents, expand_inputs
from tcsm.data.shards import FORMAT, INDEX, SPLITS, token_dtype

__all__ = ["prepare", "split_of"]

#: documents longer than this are encoded in pieces cut at line ends (one document, one EOS)
PIECE_CHARS = 1 << 20
#: characters per batch sent to a worker
BATCH_CHARS = 1 << 20


def split_of(text: str, valid_fraction: float, test_fraction: float) -> int:
    """0 (train), 1 (valid) or 2 (test) from a 64-bit hash of the document's first piece."""
    u = int.from_bytes(hashlib.blake2b(text[:PIECE_CHARS].encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")
    u /= 2.0**64
    return 1 if u < valid_fraction else 2 if u < valid_fraction + test_fraction else 0


def _pieces(doc: str) -> Iterator[tuple[str, bool]]:
    """(piece, is_last) of a document, cut at a newline near every PIECE_CHARS characters."""
    start = 0
    while len(doc) - start > PIECE_CHARS:
        cut = doc.rfind("\n", start + PIECE_CHARS // 2, start + PIECE_CHARS)
        cut = start + PIECE_CHARS if cut < 0 else cut + 1
        yield doc[start:cut], False
        start = cut
    yield doc[start:], True


# ----------------------------------------------------------------------------------------------- workers

_TOK = None
_SETTINGS: dict = {}


def _init_worker(tok_dir: str, entry: dict, settings: dict) -> None:
    global _TOK, _SETTINGS
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker: the pool is the parallelism
    _TOK = tokenizer_spec.load_saved(Path(tok_dir), entry)
    _SETTINGS = settings


def _encode(batch: list[tuple[str, int, bool]]) -> list[tuple[np.ndarray, int]]:
    """Per split: (token array in the shard dtype, documents finished)."""
    tok, s = _TOK, _SETTINGS
    dtype, eos, pad = np.dtype(s["dtype"]), s["eos_id"], s["pad_id"]
    encoded = tok.encode_batch([text for text, _, _ in batch])
    parts: list[list[np.ndarray]] = [[], [], []]
    docs = [0, 0, 0]
    for ids, (_, split, last) in zip(encoded, batch):
        ids = np.asarray(ids, dtype=dtype)
        if s["packing"] == "pad":
            row = np.full(s["seq_len"], pad, dtype=dtype)
            ids = ids[: s["seq_len"]]
            row[: len(ids)] = ids
            ids = row
        parts[split].append(ids)
        if last:
            docs[split] += 1
            if s["packing"] == "eos" and eos is not None:
                parts[split].append(np.asarray([eos], dtype=dtype))
    return [(np.concatenate(p) if p else np.zeros(0, dtype), d) for p, d in zip(parts, docs)]


# ----------------------------------------------------------------------------------------------- writing


class _ShardWriter:
    """Append tokens of one split to files of at most `shard_tokens` tokens, hashing as it goes."""

    def __init__(self, directory: Path, split: str, dtype: np.dtype, shard_tokens: int):
        self.directory, self.split, self.dtype, self.limit = directory, split, dtype, int(shard_tokens)
        self.shards: list[dict] = []
        self.documents = 0
        self._file = None

    def _open(self) -> None:
        name = f"{self.split}-{len(self.shards):05d}.bin"
        self._file = open(self.directory / name, "wb")  # noqa: SIM115  (open across write calls)
        self._hash, self._tokens, self._name = hashlib.sha256(), 0, name

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self.shards.append({"file": self._name, "tokens": self._tokens, "sha256": self._hash.hexdigest()})
            self._file = None

    def write(self, ids: np.ndarray, whole_rows: int = 0) -> None:
        """Append ids; with whole_rows=L a shard boundary never cuts a row of L tokens."""
        while ids.size:
            if self._file is None:
                self._open()
            room = self.limit - self._tokens
            if whole_rows:
                room = max(room // whole_rows, 1) * whole_rows
            part, ids = ids[:room], ids[room:]
            data = part.astype(self.dtype.newbyteorder("<"), copy=False).tobytes()
            self._file.write(data)
            self._hash.update(data)
            self._tokens += part.size
            if self._tokens >= self.limit:
                self._close()

    def finish(self) -> dict:
        self._close()
        return {"documents": self.documents, "tokens": sum(s["tokens"] for s in self.shards), "shards": self.shards}


# ----------------------------------------------------------------------------------------------- folder


def _check_output(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise DataError(f"output {out} exists and is not a folder")
    if not out.exists():
        return
    if (out / INDEX).is_file() and not overwrite:
        raise DataError(f"{out} already holds prepared shards; pass --overwrite to replace them")
    ours = {INDEX, "tokenizer"}
    strangers = [
        p.name
        for p in out.iterdir()
        if not (p.name in ours or p.name.startswith(".prepare-") or (p.suffix == ".bin" and p.stem.split("-")[0] in SPLITS))
    ]
    if strangers:
        raise DataError(f"output folder {out} holds other files ({strangers[:3]}); choose an empty or new folder")


def _commit(tmp: Path, out: Path, index: dict) -> None:
    """Move the finished shards and tokenizer into `out` and rename the index in last."""
    old = out / INDEX
    if old.exists():
        old.unlink()  # from here until the new index lands, the folder is refused by training
    keep = {s["file"] for split in SPLITS for s in index["splits"][split]["shards"]}
    for p in out.iterdir():
        if p.suffix == ".bin" and p.name not in keep:
            p.unlink()
    for name in keep:
        os.replace(tmp / name, out / name)
    if (out / "tokenizer").exists():
        shutil.rmtree(out / "tokenizer")
    os.replace(tmp / "tokenizer", out / "tokenizer")
    with open(tmp / INDEX, "w", encoding="utf-8") as f:
        json.dump(index, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp / INDEX, out / INDEX)
    shutil.rmtree(tmp, ignore_errors=True)


def _text_size(src: Source) -> int:
    """Rough uncompressed size of a source, for the progress bar's ETA (gzip stores it, mod 4 GiB, at its end)."""
    p = src.path
    if p.is_dir():
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
    size = p.stat().st_size
    if p.name.endswith(".gz") and size >= 4:
        with open(p, "rb") as f:
            f.seek(-4, 2)
            isize = struct.unpack("<I", f.read(4))[0]
        return isize if isize >= size else 4 * size
    return size


def _batches(docs: Iterator[str], fractions: tuple[float, float]) -> Iterator[tuple[list, int]]:
    """([(piece, split, is_last)], characters) batches of about BATCH_CHARS characters."""
    batch, chars = [], 0
    for doc in docs:
        split = split_of(doc, *fractions)
        for piece, last in _pieces(doc):
            batch.append((piece, split, last))
            chars += len(piece)
            if chars >= BATCH_CHARS:
                yield batch, chars
                batch, chars = [], 0
    if batch:
        yield batch, chars


def prepare(
    inputs: list[str],
    out: str | Path,
    tokenizer: str,
    *,
    workers: int = 1,
    valid_fraction: float = 0.005,
    test_fraction: float = 0.005,
    packing: str = "eos",
    seq_len: int | None = None,
    text_field: str | None = None,
    doc_separator: str | None = None,
    eos: str | None = None,
    shard_tokens: int = 1 << 28,
    overwrite: bool = False,
    progress: bool = True,
    command: str | None = None,
) -> dict:
    """Tokenise `inputs` with `tokenizer` (a spec, tcsm.data.tokenizer_spec) into shards in `out`; returns the
    index it wrote. `text_field` (default "text") and `doc_separator` apply to some input kinds only: naming one
    that no input has is a DataError, like `seq_len` without `packing="pad"`."""

    started = time.perf_counter()
    if packing not in ("eos", "pad"):
        raise DataError(f"packing must be 'eos' or 'pad', got {packing!r}")
    if packing == "pad" and not (seq_len and seq_len > 0):
        raise DataError("packing 'pad' stores one row per document: give its length with --seq-len")
    if packing != "pad" and seq_len is not None:
        raise DataError(
            f"--seq-len {seq_len} is the row length of --packing pad; with --packing {packing} documents are "
            "concatenated and the row length is chosen at training time (data.seq_len): drop --seq-len or add "
            "--packing pad"
        )
    for name, f in (("valid fraction", valid_fraction), ("test fraction", test_fraction)):
        if not 0.0 <= f < 1.0:
            raise DataError(f"the {name} must be in [0, 1), got {f}")
    if valid_fraction + test_fraction >= 1.0:
        raise DataError("the valid and test fractions must leave documents to train on (sum < 1)")
    if workers < 1:
        raise DataError(f"--workers must be at least 1, got {workers}")
    if shard_tokens < 1:
        raise DataError(f"shard size must be at least 1 token, got {shard_tokens}")
    out = Path(out).expanduser()
    sources = expand_inputs(inputs)
    if doc_separator is not None and not any(s.kind == "text" for s in sources):
        raise DataError(
            f"--doc-separator splits text files, but the inputs are {sorted({s.kind for s in sources})} files, whose "
            "documents are their lines or rows; drop --doc-separator"
        )
    if text_field is not None and not any(s.kind != "text" for s in sources):
        raise DataError(
            f"--text-field {text_field} names the field of JSONL / Parquet / datasets inputs, but every input is a "
            "text file (one document per file, or per --doc-separator); drop --text-field"
        )
    text_field = "text" if text_field is None else text_field
    if doc_separator == "":
        raise DataError("--doc-separator is empty; give the string that separates documents (e.g. '\\n\\n')")
    _check_output(out, overwrite)
    fractions = (valid_fraction, test_fraction)

    def read():
        return documents(sources, text_field, doc_separator)

    if tokenizer == "char":
        chars: set[str] = set()
        for d in read():
            chars.update(d)
        tok = tokenizer_spec.resolve(tokenizer, chars="".join(chars))
    elif tokenizer.startswith("bpe:"):
        tok = tokenizer_spec.resolve(tokenizer, eos=eos, train_docs=(d for d in read() if split_of(d, *fractions) == 0))
    else:
        tok = tokenizer_spec.resolve(tokenizer, eos=eos)
    if int(tok.vocab_size) < 2:
        raise DataError(f"tokenizer {tokenizer!r} has a vocabulary of {tok.vocab_size} token(s); shards need at least "
                        "2 (is its vocabulary empty?)")  # fmt: skip
    if packing == "eos" and tok.eos_id is None:
        raise DataError(
            f"tokenizer {tokenizer!r} has no end-of-document token; name one with --eos TOKEN or use --packing pad"
        )

    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(".prepare-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = out / f".prepare-{os.getpid()}"
    tmp.mkdir()
    entry = tokenizer_spec.save(tok, tmp / "tokenizer")
    dtype = token_dtype(tok.vocab_size)
    settings = {"dtype": dtype.str, "eos_id": tok.eos_id, "pad_id": tok.pad_id, "packing": packing, "seq_len": seq_len}
    writers = [_ShardWriter(tmp, s, dtype, shard_tokens) for s in SPLITS]
    total = sum(_text_size(s) for s in sources)
    bar = WorkProgress(total, "prepare", "chars", enabled=progress)
    pool = None
    try:
        batches = (b for b, _ in _sized(_batches(read(), fractions), bar))
        if workers > 1:
            import multiprocessing as mp

            pool = mp.get_context("spawn").Pool(workers, _init_worker, (str(tmp / "tokenizer"), entry, settings))
            results = _windowed(pool, batches, 2 * workers)
        else:
            _init_worker(str(tmp / "tokenizer"), entry, settings)
            results = map(_encode, batches)
        docs = tokens = 0
        t0 = time.perf_counter()
        for parts in results:
            for w, (ids, n) in zip(writers, parts):
                w.write(ids, whole_rows=seq_len if packing == "pad" else 0)
                w.documents += n
                docs, tokens = docs + n, tokens + ids.size
            rate = max(time.perf_counter() - t0, 1e-9)
            bar.postfix(docs_per_s=f"{docs / rate:.0f}", tok_per_s=f"{tokens / rate:.3g}")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        bar.close()
    splits = dict(zip(SPLITS, (w.finish() for w in writers)))
    if splits["train"]["tokens"] == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DataError("no document went to the training split; lower the valid/test fractions or add text")
    index = {
        "format": FORMAT,
        "version": 1,
        "tokenizer": {"spec": tokenizer, **entry},
        "vocab_size": int(tok.vocab_size),
        "eos_id": tok.eos_id,
        "dtype": dtype.str,
        "packing": packing,
        "seq_len": seq_len if packing == "pad" else None,
        "valid_fraction": valid_fraction,
        "test_fraction": test_fraction,
        "text_field": text_field,
        "doc_separator": doc_separator,
        "inputs": [os.path.abspath(s.path) for s in sources],
        "documents": sum(s["documents"] for s in splits.values()),
        "tokens": sum(s["tokens"] for s in splits.values()),
        "splits": splits,
        "command": command,
        "seconds": round(time.perf_counter() - started, 3),
        "workers": workers,
    }
    _commit(tmp, out, index)
    return index


def _windowed(pool, batches, window: int):
    """Results of _encode over `batches`, in order, with at most `window` batches in flight (Pool.imap would read
    the whole corpus into its task queue ahead of the workers)."""
    from collections import deque

    pending: deque = deque()
    for batch in batches:
        pending.append(pool.apply_async(_encode, (batch,)))
        if len(pending) >= window:
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


def _sized(batches, bar):
    for batch, chars in batches:
        bar.update(chars)
        yield batch, chars
