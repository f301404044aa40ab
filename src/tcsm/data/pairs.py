"""Preference pairs (the `pairs` data kind): JSON lines with `prompt`, `chosen` and `rejected` texts (MATH.md §5.3).

The field names are those of the common preference datasets and trainers (Anthropic HH in TRL's format,
UltraFeedback-binarized, ...); `prompt_field=null` reads files without prompts. Each record becomes one row of
`seq_len` tokens per side: `encode(prompt) + encode(response)`, padded after the response with the tokenizer's
end-of-text token (or `pad`), so the padding is part of the response the model scores, as in pre-training on
EOS-separated documents. The prompt positions are conditioning (`Batch.cond_mask`): never noised, never scored.

The tokenizer is the run's: `tokenizer` is the data section of the run the pairs are for (the pre-trained run's
`data`), built with `build_data` to reuse exactly its token ids; `seq_len` defaults to that section's length.

Records written by `tcsm pairs` also carry the sampled token ids (`prompt_ids`, `chosen_ids`, `rejected_ids`)
and the `tokenizer` they belong to (`tokenizer_signature`); with the same tokenizer those ids are used as they are,
since decoding sampled tokens and encoding the text again need not give them back (it can even be longer).

Bad records are counted by reason and reported (`PairsBundle.meta["bad_records"]`, `summary()`): unreadable
JSON, a missing or non-string field, an empty chosen or rejected text, chosen identical to rejected, text the
tokenizer cannot encode. A pair longer than `seq_len` is refused (DataError naming the first one) unless
`truncate=true`, which cuts the responses to fit and counts the pairs it cut (and, as bad records, those whose
prompt leaves no room or whose sides become identical). A file with no usable pair is a one-line DataError.

Splits: `path` with `valid_frac` / `test_frac` of the usable pairs (after a seeded shuffle, so a sorted file still
gives a representative held-out set), or `train_path` / `valid_path` [/ `test_path`].
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar

import torch
from torch import Tensor

from tcsm.core.batch import Batch
from tcsm.data.base import DataError, RowsBundle, TensorRows, jsonl_objects
from tcsm.data.build import DATA_KINDS
from tcsm.data.prompted import build_prompted, encode, fit_prompt_rows, prompted_source
from tcsm.data.unknown import DEFAULT_MAX_UNKNOWN

__all__ = ["PairRows", "PairsBundle", "build_pairs", "read_pair_records", "tokenize_pairs", "tokenizer_signature"]


@dataclass(frozen=True)
class PairRows(TensorRows):
    """Tokenised pairs of one split: chosen and rejected ids [N, L] (compact dtype) sharing a prompt mask [N, L]."""

    chosen: Tensor
    rejected: Tensor
    prompt_mask: Tensor

    def to_batch(self, device=None) -> Batch:
        """Batch(x1=chosen, rejected=rejected, cond_mask=prompt positions) as LongTensors on `device`."""
        return Batch(
            x1=self.chosen.to(device=device, dtype=torch.long),
            rejected=self.rejected.to(device=device, dtype=torch.long),
            cond_mask=self.prompt_mask.to(device=device),
        )


@dataclass
class PairsBundle(RowsBundle):
    """Train / valid / test `PairRows` and their tokenizer: batches are preference `Batch`es (chosen = x1, rejected,
    prompt = cond_mask)."""

    record: ClassVar[str] = "pair"
    train: PairRows
    valid: PairRows
    test: PairRows

    def summary(self) -> str:
        ids = self.meta.get("stored_token_ids", 0)
        return self.describe_rows("pairs") + (f"; {ids} with their stored token ids" if ids else "")


# --------------------------------------------------------------------------------------------------- reading


def read_pair_records(
    path: str | Path, fields: tuple[str | None, str, str], bad: Counter, signature: str | None = None
) -> list[tuple[int, str, str, str, tuple | None]]:
    """(line number, prompt, chosen, rejected, stored ids) of every well-formed record; the others are counted in
    `bad`. Stored ids are the record's `prompt_ids` / `chosen_ids` / `rejected_ids` when its `tokenizer` equals
    `signature` (`tokenizer_signature` of the run's data), else None (the texts are tokenized)."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise DataError(f"preference pairs {str(p)!r} is a directory; give the JSONL file `tcsm pairs` wrote")
    if not p.is_file():
        raise DataError(f"preference pairs file not found: {p}")
    prompt_key, chosen_key, rejected_key = fields
    records = []
    for n, obj in jsonl_objects(p):
        if obj is jsonl_objects.BAD:
            bad["unreadable JSON"] += 1
            continue
        if not isinstance(obj, dict):
            bad["not a JSON object"] += 1
            continue
        keys = [k for k in (prompt_key, chosen_key, rejected_key) if k is not None]
        if any(k not in obj for k in keys):
            bad["missing field"] += 1
            continue
        wrong = [k for k in keys if not isinstance(obj[k], str)]
        if wrong:  # present, but a number, a list, null ...: say so, not "missing"
            bad[f"non-string {wrong[0]!r} field"] += 1
            continue
        prompt = obj[prompt_key] if prompt_key is not None else ""
        chosen, rejected = obj[chosen_key], obj[rejected_key]
        if not chosen.strip() or not rejected.strip():
            bad["empty text"] += 1
        elif chosen == rejected:
            bad["identical chosen and rejected"] += 1
        else:
            records.append((n, prompt, chosen, rejected, _stored_ids(obj, signature, prompt_key)))
    return records


def _stored_ids(obj: dict, signature: str | None, prompt_key: str | None) -> tuple | None:
    if signature is None or obj.get("tokenizer") != signature:
        return None
    ids = [obj.get(k) for k in ("prompt_ids", "chosen_ids", "rejected_ids")]
    if prompt_key is None:
        ids[0] = []
    ok = all(isinstance(x, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in x) for x in ids)
    return tuple(ids) if ok else None


def tokenizer_signature(bundle) -> str:
    """What identifies the token ids of a data bundle: its text data's label and vocabulary size. `tcsm pairs`
    stores it with the sampled ids, so that pairs re-read with the same tokenizer keep the exact sampled tokens."""
    return f"{bundle.meta.get('tokenizer_data') or bundle.label}/V={bundle.vocab_size}"


def tokenize_pairs(
    records, tokenizer, seq_len: int, *, truncate: bool, pad_id: int | None, bad: Counter, where: str
) -> tuple[PairRows, int]:
    """Rows of `records` (see `read_pair_records`) and the number truncated; records that cannot be used are
    counted in `bad`. Stored ids are used as they are (decode → encode need not give back sampled tokens, and may
    be longer). Too-long pairs raise DataError unless `truncate` (then responses are cut to fit)."""
    V = int(getattr(tokenizer, "vocab_size", 0))
    rows = []
    for n, prompt, chosen, rejected, stored in records:
        if stored is not None and all(0 <= i < V for x in stored for i in x):
            rows.append((n, list(stored)))
        else:
            rows.append((n, [encode(tokenizer, s) for s in (prompt, chosen, rejected)]))
    (chosen, rejected), mask, truncated = fit_prompt_rows(
        rows, seq_len, pad_id, V, slots=2, truncate=truncate, bad=bad, where=where, record="pair", part="response"
    )
    return PairRows(chosen, rejected, mask), truncated


# --------------------------------------------------------------------------------------------------- the kind


def build_pairs(
    path: str | None = None,
    train_path: str | None = None,
    valid_path: str | None = None,
    test_path: str | None = None,
    tokenizer: dict | None = None,
    seq_len: int | None = None,
    truncate: Annotated[bool, "cut responses that do not fit the model's length (default: refuse such pairs)"] = False,
    pad: str | None = None,
    prompt_field: str | None = "prompt",
    chosen_field: str = "chosen",
    rejected_field: str = "rejected",
    max_unknown: Annotated[float, "share of the pairs' tokens that may be text the tokenizer lacks (read as its "
                           "unknown token; warned, refused above)"] = DEFAULT_MAX_UNKNOWN,
    valid_frac: float = 0.1,
    test_frac: float = 0.0,
    seed: int = 0,
    name: str | None = None,
) -> PairsBundle:
    """The `pairs` data kind (see the module docstring)."""
    source = prompted_source(
        "pairs", tokenizer, for_what="the run the pairs are for", command="tcsm finetune preference --from RUN",
        path=path, train_path=train_path, valid_path=valid_path, test_path=test_path, seq_len=seq_len, pad=pad,
        valid_frac=valid_frac, test_frac=test_frac, min_len=2, max_unknown=max_unknown,
    )  # fmt: skip
    signature = tokenizer_signature(source.base)
    fields = (prompt_field, chosen_field, rejected_field)
    opts = {"truncate": bool(truncate), "pad_id": source.pad_id, "bad": source.bad}
    stored = 0

    def tokenize(f):
        nonlocal stored
        records = [] if f is None else read_pair_records(f, fields, source.bad, signature)
        stored += sum(r[4] is not None for r in records)
        return tokenize_pairs(records, source.tokenizer, source.seq_len, where=f or "", **opts)

    needs = ", ".join(repr(k) for k in fields if k)
    bundle = build_prompted(
        source, PairsBundle, tokenize, valid_frac=valid_frac, test_frac=test_frac, seed=seed, name=name,
        empty="no usable preference pair in {src} ({reasons}); each JSON line needs " + needs
        + " as non-empty, different texts",
    )  # fmt: skip
    bundle.meta["stored_token_ids"] = stored
    return bundle


DATA_KINDS["pairs"] = build_pairs
