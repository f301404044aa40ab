"""The `tokenizer` data kind: a Hugging Face directory's tokenizer and a length, no text (the data of a run imported
from the directory); reading a split from it is one line naming the data to give."""

from __future__ import annotations

import pytest

pytest.importorskip("tokenizers")

from llada_helpers import write_tokenizer

from tcsm.data import DataError, build_data


def test_the_tokenizer_kind_has_the_directory_tokenizer_and_no_rows(tmp_path):
    vocab = write_tokenizer(tmp_path)
    data = build_data({"kind": "tokenizer", "path": str(tmp_path), "seq_len": 6})
    assert (data.vocab_size, data.seq_len, data.eos_id) == (len(vocab), 6, vocab.index("<|eot|>"))
    assert data.train.shape == (0, 6)
    assert data.decode(data.encode("the cat sat")) == "the cat sat"
    with pytest.raises(DataError, match=r"no text to read a valid split from; .*--data FILE.*data\.kind=shards.*tcsm prepare"):
        data.split("valid")


def test_the_tokenizer_kind_refuses_a_bad_length_or_a_missing_tokenizer(tmp_path):
    with pytest.raises(DataError, match="seq_len must be >= 1"):
        build_data({"kind": "tokenizer", "path": str(tmp_path), "seq_len": 0})
    with pytest.raises(DataError, match="nor an existing tokenizer.json or tokenizer directory"):
        build_data({"kind": "tokenizer", "path": str(tmp_path / "nothing")})
