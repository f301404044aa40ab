"""The `hf` data kind: a small corpus read straight from a `datasets.save_to_disk` folder or Parquet files.

Everything is read and tokenised in memory at the start of a run (use `tcsm prepare` and `data.kind=shards` for
corpora that do not fit comfortably). Nothing is fetched from a hub: `path` is local. Documents are held out for
validation and test by the same text hash as `tcsm prepare` (tcsm.data.prepare.split_of) and packed with EOS.
Needs tcsm[datasets] (datasets, pyarrow).
"""

from __future__ import annotations

import numpy as np

from tcsm.data import tokenizer_spec
from tcsm.data.base import DataBundle, DataError, bundle_from_streams
from tcsm.data.build import DATA_KINDS
from tcsm.data.inputs import documents, expand_inputs
from tcsm.data.prepare import split_of

__all__ = ["build_hf"]


def build_hf(
    path: str,
    tokenizer: str = "char",
    seq_len: int = 128,
    valid_frac: float = 0.05,
    test_frac: float = 0.05,
    text_field: str = "text",
    eos: str | None = None,
    name: str | None = None,
) -> DataBundle:
    """A `datasets` folder or Parquet file(s) at `path`, tokenised with the spec `tokenizer` (see module doc)."""
    if not 0 <= valid_frac < 1 or not 0 <= test_frac < 1 or valid_frac + test_frac >= 1:
        raise DataError(f"valid_frac and test_frac must be in [0, 1) and sum below 1, got {valid_frac}, {test_frac}")
    if not path or path == "???":
        raise DataError("data.kind=hf needs data.path: a datasets.save_to_disk folder or Parquet file(s)")
    sources = expand_inputs([path])
    if not any(s.kind in ("datasets", "parquet") for s in sources):
        raise DataError(f"data.kind=hf reads a datasets folder or Parquet files; {path} holds neither")
    docs = list(documents(sources, text_field))
    splits = [split_of(d, valid_frac, test_frac) for d in docs]
    train_docs = [d for d, s in zip(docs, splits) if s == 0]
    if not train_docs:
        raise DataError(f"no document of {path} went to the training split; lower valid_frac / test_frac")
    tok = tokenizer_spec.resolve(tokenizer, eos=eos, train_docs=train_docs, chars="".join(set("".join(docs))))
    streams: dict[str, list] = {"train": [], "valid": [], "test": []}
    names = ("train", "valid", "test")
    for ids, s in zip(tok.encode_batch(docs), splits):
        streams[names[s]].append(np.asarray(ids, dtype=np.int64))
        if tok.eos_id is not None:
            streams[names[s]].append(np.asarray([tok.eos_id], dtype=np.int64))
    arrays = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in streams.items()}
    return bundle_from_streams(
        arrays,
        seq_len=seq_len,
        tokenizer=tok,
        src=path,
        label=name,
        unit="tokens",
        eos_id=tok.eos_id,
        meta={"tokenizer_identity": tokenizer_spec.identity(tok), "documents": {k: s for k, s in zip(names, [splits.count(i) for i in range(3)])}},
    )


DATA_KINDS["hf"] = build_hf
