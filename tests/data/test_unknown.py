"""Text a tokenizer lacks (data/unknown.py): found by its offsets, counted over a records file, warned in one line
(how many, the share, examples) and refused above `data.max_unknown`."""

from __future__ import annotations

import json
import warnings

import pytest

pytest.importorskip("tokenizers")

from llada_helpers import save_word_tokenizer

from tcsm.data import DataError, tokenizer_spec
from tcsm.data.sft import build_sft
from tcsm.data.unknown import UnknownTally, unknown_spans, warn_unknown_prompt

VOCAB = ["<eos>", "<unk>", "the", "cat", "sat", "on", "mat", "a"]


@pytest.fixture
def tok_dir(tmp_path):
    save_word_tokenizer(tmp_path, VOCAB, "<unk>", {"eos_token": "<eos>", "unk_token": "<unk>"})
    return tmp_path


def test_unknown_spans_names_the_words_read_as_unk(tok_dir):
    tok = tokenizer_spec.resolve(str(tok_dir / "tokenizer.json"))
    assert unknown_spans(tok, "the cat sat") == (3, [])
    assert unknown_spans(tok, "the dog sat on the rug") == (6, ["dog", "rug"])
    assert tok.encode("the dog")[1] == VOCAB.index("<unk>")  # what the tally catches: silent today


def test_tally_warns_below_the_share_and_refuses_above(tok_dir):
    tok = tokenizer_spec.resolve(str(tok_dir / "tokenizer.json"))
    tally = UnknownTally()
    for text in ["the cat sat on the mat"] * 9 + ["the dog sat"]:
        tally.add(tok, text)
    assert (tally.unknown, tally.tokens, tally.examples) == (1, 57, ["dog"])
    with pytest.warns(UserWarning, match=r"1 of 57 tokens \(1\.75%\) .*'<unk>' \(e\.g\. 'dog'\)"):
        tally.check(tok, "sft data", 0.05)
    with pytest.raises(DataError, match=r"1 of 57 tokens .*more than data\.max_unknown=0\.01"):
        tally.check(tok, "sft data", 0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        UnknownTally().check(tok, "sft data", 0.0)  # nothing unknown: silent


def test_a_prompt_with_unknown_words_is_warned(tok_dir):
    tok = tokenizer_spec.resolve(str(tok_dir / "tokenizer.json"))
    with pytest.warns(UserWarning, match=r"the prompt: 2 of 4 tokens \(50\.00%\).*'Once', 'upon'"):
        warn_unknown_prompt(tok, "Once upon the mat")


def test_sft_records_with_unknown_words_are_counted_and_refused_above_max_unknown(tok_dir, tmp_path):
    recs = tmp_path / "recs.jsonl"
    rows = [{"prompt": "the cat", "completion": " sat on the mat"}] * 19 + [{"prompt": "the dog", "completion": " sat"}]
    recs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenizer = {"kind": "tokenizer", "path": str(tok_dir), "seq_len": 8}
    with pytest.raises(DataError, match=r"sft data .*1 of 117 tokens \(0\.85%\).*'dog'.*data\.max_unknown=0\.005"):
        build_sft(str(recs), tokenizer=tokenizer, max_unknown=0.005)
    with pytest.warns(UserWarning, match=r"1 of 117 tokens"):
        data = build_sft(str(recs), tokenizer=tokenizer)  # the default share (1%) lets it through, said once
    assert data.vocab_size == len(VOCAB)

