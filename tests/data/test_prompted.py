"""The prompted-record kinds (`pairs`, `sft`) share one builder (data/prompted.py): their rows — prompt, response,
pad — and prompt masks are pinned here to the tensors the two separate builders produced before the merge."""

from __future__ import annotations

import json

import torch

from tcsm.data.pairs import build_pairs
from tcsm.data.sft import build_sft

T, F = True, False
PAIRS_CHOSEN = [[3, 4, 1, 5, 3, 4, 2, 2, 2, 2], [3, 1, 4, 1, 5, 2, 2, 2, 2, 2], [4, 3, 4, 5, 3, 4, 5, 3, 4, 5],
                [5, 3, 4, 2, 2, 2, 2, 2, 2, 2]]  # fmt: skip
PAIRS_REJECTED = [[3, 4, 1, 4, 5, 2, 2, 2, 2, 2], [5, 4, 3, 2, 2, 2, 2, 2, 2, 2], [4, 5, 2, 2, 2, 2, 2, 2, 2, 2],
                  [5, 3, 3, 2, 2, 2, 2, 2, 2, 2]]  # fmt: skip
PAIRS_PROMPT = [[T, T, T, F, F, F, F, F, F, F], [F] * 10, [T, F, F, F, F, F, F, F, F, F], [T, T, F, F, F, F, F, F, F, F]]
SFT_X1 = [[3, 4, 1, 5, 3, 4, 2, 2, 2, 2], [5, 3, 1, 4, 2, 2, 2, 2, 2, 2], [3, 4, 2, 2, 2, 2, 2, 2, 2, 2],
          [4, 5, 3, 0, 3, 5, 4, 1, 4, 3]]  # fmt: skip
SFT_PROMPT = [[T, T, T, F, F, F, F, F, F, F], [T, F, F, F, F, F, F, F, F, F], [T, F, F, F, F, F, F, F, F, F],
              [T, T, T, T, F, F, F, F, F, F]]  # fmt: skip


def _write(root, name, records):
    (root / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(root / name)


def _sources(tmp_path):
    (tmp_path / "text.txt").write_text("ab cab bca\nacb ba.\n" * 20)
    tok = {"kind": "text", "path": str(tmp_path / "text.txt"), "seq_len": 10, "valid_frac": 0.1}
    pairs = _write(tmp_path, "pairs.jsonl", [
        {"prompt": "ab ", "chosen": "cab", "rejected": "bc"}, {"prompt": "", "chosen": "a b c", "rejected": "cba"},
        {"prompt": "ca", "chosen": "b", "rejected": "a"}, {"prompt": "b", "chosen": "abcabcabcabc", "rejected": "c"},
    ])  # fmt: skip
    sft = _write(tmp_path, "sft.jsonl", [
        {"prompt": "ab ", "completion": "cab"}, {"prompt": "c", "completion": "a b"},
        {"prompt": "bca\n", "completion": "acb ba.acb"}, {"prompt": "a", "completion": "b"},
    ])  # fmt: skip
    return tok, pairs, sft


def _same(t, values, dtype):
    assert t.dtype == dtype
    assert torch.equal(t, torch.tensor(values, dtype=dtype))


def test_pairs_rows_are_unchanged(tmp_path):
    tok, pairs, _ = _sources(tmp_path)
    b = build_pairs(path=pairs, tokenizer=tok, pad=".", truncate=True, valid_frac=0.0)
    _same(b.train.chosen, PAIRS_CHOSEN, torch.uint8)
    _same(b.train.rejected, PAIRS_REJECTED, torch.uint8)
    _same(b.train.prompt_mask, PAIRS_PROMPT, torch.bool)
    assert (b.meta["truncated"], b.meta["pad_id"]) == (1, 2)


def test_sft_rows_are_unchanged(tmp_path):
    tok, _, sft = _sources(tmp_path)
    b = build_sft(path=sft, tokenizer=tok, pad=".", truncate=True, valid_frac=0.0)
    _same(b.train.x1, SFT_X1, torch.uint8)
    _same(b.train.prompt_mask, SFT_PROMPT, torch.bool)
    assert (b.meta["truncated"], b.meta["pad_id"]) == (1, 2)
