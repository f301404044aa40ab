"""What the prompted-record data kinds share — `pairs` (prompt, chosen, rejected) and `sft` (prompt, completion):
the run's tokenizer rebuilt from the source run's data section, the splits, the padding token, the rows (prompt,
responses, padding after the response) with their prompt mask (`Batch.cond_mask`: never noised, never scored), and
the one-line errors; each kind only reads and tokenizes its own records (MATH.md §5.3 for pairs)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from tcsm.data.base import DataError, compact_dtype
from tcsm.data.build import build_data
from tcsm.data.text import resolve_splits, tokenized_splits
from tcsm.data.unknown import DEFAULT_MAX_UNKNOWN, UnknownTally

__all__ = [
    "PROMPTED_KINDS",
    "PromptedSource",
    "build_prompted",
    "encode",
    "held_out_prompts",
    "held_out_rows",
    "pad_prompt_rows",
    "prompted_source",
]

#: the data kinds of prompted records: a `tokenizer` section must name a text kind, not one of these
PROMPTED_KINDS = ("pairs", "sft")


def held_out_rows(data, num: int) -> tuple[Tensor, Tensor | None]:
    """(rows [n, L], their prompt mask [n, L] or None) of the first `num` held-out rows (test split, else valid);
    the mask where the rows carry their prompts (task, SFT and pair records: `Batch.cond_mask`)."""
    rows = data.split("test") if len(data.split("test")) else data.split("valid")
    if not hasattr(rows, "to_batch"):
        return getattr(rows, "x1", rows)[: int(num)].long(), None
    batch = rows[: int(num)].to_batch()
    return batch.x1.long(), None if batch.cond_mask is None else batch.cond_mask.bool()


def held_out_prompts(data, num: int, length: int) -> tuple[Tensor, Tensor] | None:
    """(fixed [num, length] bool, values [num, length]) pinning the prompts of the first held-out rows (cycled up to
    `num`), so that a run's samples complete prompts it never trained on; None when the data's rows carry no
    prompts, have another length, or hold no held-out row."""
    try:
        x1, cond = held_out_rows(data, num)
    except (DataError, AttributeError, TypeError):
        return None
    if cond is None or x1.shape[0] == 0 or x1.shape[1] != int(length) or not bool(cond.any()):
        return None
    idx = torch.arange(int(num)) % x1.shape[0]
    return cond[idx], torch.where(cond, x1, torch.zeros_like(x1))[idx]


def encode(tokenizer, text: str) -> list[int] | None:
    """The token ids of `text` ([] for empty text), or None if the tokenizer cannot encode it."""
    try:
        return list(tokenizer.encode(text)) if text else []
    except DataError:  # e.g. a character outside a character-level vocabulary
        return None


def _pad_id(tokenizer, base, pad: str | None) -> int | None:
    if pad is None:
        eos = getattr(base, "eos_id", None)
        return eos if eos is not None else getattr(tokenizer, "eos_id", None)
    ids = encode(tokenizer, pad)
    if ids is None or len(ids) != 1:
        raise DataError(
            f"data.pad must be text of exactly one token, got {pad!r} ({ids and len(ids)} tokens)"
        )
    return ids[0]


def pad_prompt_rows(
    rows, seq_len: int, pad_id: int | None, vocab_size: int, *, slots: int
) -> tuple[list[Tensor], Tensor]:
    """`rows` of (prompt ids, `slots` response ids) as one [N, seq_len] tensor per slot — prompt, response, then
    `pad_id` — in the compact dtype, and the prompt mask [N, seq_len]."""
    L = int(seq_len)
    dtype = compact_dtype(max(int(vocab_size), (pad_id or 0) + 1))
    outs = [torch.zeros(len(rows), L, dtype=dtype) for _ in range(slots)]
    mask = torch.zeros(len(rows), L, dtype=torch.bool)
    for k, (p, responses) in enumerate(rows):
        for out, resp in zip(outs, responses):
            out[k] = torch.tensor(p + resp + [pad_id] * (L - len(p) - len(resp)), dtype=dtype)
        mask[k, : len(p)] = True
    return outs, mask


def fit_prompt_rows(rows, seq_len: int, pad_id: int | None, vocab_size: int, *, slots: int, truncate: bool,
                    bad: Counter, where: str, record: str, part: str) -> tuple[list[Tensor], Tensor, int]:  # fmt: skip
    """`rows` of (line number, [prompt ids, `slots` response ids]) fitted to `seq_len` and padded
    (`pad_prompt_rows`): (a tensor per response slot, the prompt mask, the number of rows truncated). A row with an
    id list None (text outside the vocabulary) or that cannot be used is counted in `bad`; rows too long are a
    DataError naming the first unless `truncate` (then their responses are cut to fit). `record` / `part` name a
    row and a response in the messages ("pair" / "response")."""
    L = int(seq_len)
    kept, too_long, truncated = [], [], 0
    for n, ids in rows:
        if any(x is None for x in ids):
            bad["text outside the tokenizer's vocabulary"] += 1
            continue
        p, responses = ids[0], list(ids[1:])
        longest = len(p) + max(map(len, responses))
        if longest > L:
            if not truncate:
                too_long.append((n, longest))
                continue
            if len(p) >= L:
                bad[f"prompt leaves no room for a {part}"] += 1
                continue
            responses, truncated = [r[: L - len(p)] for r in responses], truncated + 1
            if len(responses) > 1 and all(r == responses[0] for r in responses[1:]):
                bad["identical after truncation"] += 1
                continue
        if len(p) + min(map(len, responses)) < L and pad_id is None:
            raise DataError(
                f"{where}:{n}: a {part} is shorter than the {L - len(p)} tokens after its prompt and the tokenizer "
                "has no end-of-text token to pad with; set data.pad to a one-token string"
            )
        kept.append((p, tuple(responses)))
    if too_long:
        n, longest = too_long[0]
        raise DataError(
            f"{len(too_long)} {record}(s) of {where} do not fit the model's {L} tokens (first: line {n}, {longest} "
            f"tokens with its prompt); shorten them, or set data.truncate=true (--truncate) to cut {part}s to fit"
        )
    outs, mask = pad_prompt_rows(kept, L, pad_id, vocab_size, slots=slots)
    return outs, mask, truncated


@dataclass
class PromptedSource:
    """The records' files and splits, and the source run's tokenizer, length and padding token."""

    kind: str
    mode: str
    files: dict
    base: object  # the source run's DataBundle (its tokenizer and ids)
    seq_len: int
    pad_id: int | None
    bad: Counter
    max_unknown: float = DEFAULT_MAX_UNKNOWN
    unknown: UnknownTally = field(default_factory=UnknownTally)

    @property
    def tokenizer(self):
        """The run's tokenizer, counting the text it lacks (`unknown`) of everything it encodes."""
        return _Counting(self.base.tokenizer, self.unknown)


class _Counting:
    """A tokenizer whose `encode` adds each text's unknown tokens to a tally (tcsm.data.unknown)."""

    def __init__(self, tokenizer, tally: UnknownTally):
        self._tokenizer, self._tally = tokenizer, tally

    def encode(self, text: str):
        ids = self._tokenizer.encode(text)
        self._tally.add(self._tokenizer, text)
        return ids

    def __getattr__(self, name):
        return getattr(self._tokenizer, name)


def prompted_source(kind: str, tokenizer: dict | None, *, for_what: str, command: str, path, train_path, valid_path,
                    test_path, seq_len, pad, valid_frac, test_frac, min_len: int = 1,
                    max_unknown: float = DEFAULT_MAX_UNKNOWN) -> PromptedSource:  # fmt: skip
    """Check the `tokenizer` section (a text kind's data section), resolve the splits and rebuild the tokenizer."""
    if not isinstance(tokenizer, dict) or "kind" not in tokenizer:
        raise DataError(
            f"{kind} data needs `tokenizer`: the data section (with its `kind`) of {for_what}; `{command}` sets it"
        )
    if tokenizer["kind"] in PROMPTED_KINDS:
        raise DataError(f"{kind} data: `tokenizer` must name a text data section, not another {' / '.join(PROMPTED_KINDS)} section")
    mode, files = resolve_splits(path, train_path, valid_path, test_path, valid_frac, test_frac, kind)
    base = build_data(tokenizer)
    L = int(seq_len if seq_len is not None else base.seq_len)
    if L < min_len:
        raise DataError(f"{kind} data: seq_len must be >= {min_len}, got {L}")
    if not 0 <= float(max_unknown) <= 1:
        raise DataError(f"data.max_unknown must be a share in [0, 1], got {max_unknown}")
    return PromptedSource(kind, mode, files, base, L, _pad_id(base.tokenizer, base, pad), Counter(), float(max_unknown))


def build_prompted(source: PromptedSource, bundle_type, tokenize_file: Callable, *, valid_frac, test_frac, seed,
                   name, empty: str, meta: dict | None = None):  # fmt: skip
    """The bundle of `source`'s records: `tokenize_file(file or None)` → (rows, number truncated) per split file;
    a DataError naming the reasons when no record is usable (`empty`: what a JSON line needs)."""
    splits, truncated = tokenized_splits(source.mode, source.files, tokenize_file, valid_frac, test_frac, seed)
    src = source.files["path"] if source.mode == "fractions" else source.files["train"]
    source.unknown.check(source.base.tokenizer, f"{source.kind} data {src}", source.max_unknown)
    if sum(len(s) for s in splits.values()) == 0:
        reasons = ", ".join(f"{n} {why}" for why, n in source.bad.items()) or "the file holds no records"
        raise DataError(f"{empty.format(src=src, reasons=reasons)}")
    base = source.base
    return bundle_type(
        name=name or f"{Path(src).name.split('.')[0]}-{source.kind}",
        vocab_size=int(base.vocab_size),
        seq_len=source.seq_len,
        tokenizer=base.tokenizer,
        eos_id=getattr(base, "eos_id", None),
        meta={"files": source.files, "bad_records": dict(source.bad), "truncated": truncated, "pad_id": source.pad_id,
              "tokenizer_data": base.label, **(meta or {})},
        **splits,
    )
