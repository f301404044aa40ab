"""builders/export_tokenizer.py: an export's tokenizer files. A character run's vocabulary becomes a `tokenizers`
file with [MASK] = V, a BPE run's file is copied with its real special tokens named (the mask under a name its
vocabulary lacks), the run's chat template travels, and config.json's special ids are read back from the files."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from tcsm.builders.export_tokenizer import MASK_NAMES, char_tokenizer_json, special_ids, write_tokenizer
from tcsm.data.tokenizer_spec import EOS_TOKEN

tokenizers = pytest.importorskip("tokenizers")


def _ck(directory, V, chars=None, data=None):
    info = {"vocab_size": V, **({"chars": chars} if chars else {})}
    return SimpleNamespace(data_info=info, directory=directory, build_data=lambda: data)


def _word_level(path, vocab):
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(path))


def test_a_character_vocabulary_encodes_each_character_as_its_id():
    tok = tokenizers.Tokenizer.from_str(json.dumps(char_tokenizer_json("ab c", mask=True)))
    assert tok.encode("c ab", add_special_tokens=False).ids == [3, 2, 0, 1]
    assert tok.token_to_id("[MASK]") == 4 and tok.decode([0, 3, 1]) == "acb"
    plain = tokenizers.Tokenizer.from_str(json.dumps(char_tokenizer_json("ab", mask=False)))
    assert plain.token_to_id("[MASK]") is None and plain.get_vocab_size() == 2


def test_a_character_run_writes_its_vocabulary_and_chat_template(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    run.mkdir(), out.mkdir()
    (run / "chat_template.jinja").write_text("{{ messages }}")
    assert write_tokenizer(out, _ck(run, 3, chars="xyz"), run, mask=True) == []
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config == {"tokenizer_class": "PreTrainedTokenizerFast", "mask_token": "[MASK]",
                      "chat_template": "{{ messages }}"}  # fmt: skip
    assert (out / "chat_template.jinja").read_text() == "{{ messages }}"
    assert json.loads((out / "tokenizer.json").read_text())["model"]["vocab"] == {"x": 0, "y": 1, "z": 2}
    assert special_ids(out) == {}  # a character run names no end-of-text token


def test_a_bpe_runs_file_is_copied_with_its_special_tokens_named(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    run.mkdir(), out.mkdir()
    _word_level(run / "tokenizer.json", {"a": 0, "b": 1, EOS_TOKEN: 2, "[MASK]": 3})
    assert write_tokenizer(out, _ck(run, 4), run, mask=True) == []
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["eos_token"] == config["pad_token"] == EOS_TOKEN  # pads with its end of text
    assert config["mask_token"] == MASK_NAMES[1]  # its own "[MASK]" is a clean token < V
    assert (out / "tokenizer.json").read_bytes() == (run / "tokenizer.json").read_bytes()
    assert special_ids(out) == {"eos_token_id": 2, "pad_token_id": 2}


def test_a_vocabulary_of_another_size_leaves_the_mask_unnamed_with_a_note(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    run.mkdir(), out.mkdir()
    _word_level(run / "tokenizer.json", {"a": 0, "b": 1})
    (note,) = write_tokenizer(out, _ck(run, 5), run, mask=True)
    assert note == "the tokenizer has 2 tokens for V = 5: its mask token (id 5) is not named"
    assert "mask_token" not in json.loads((out / "tokenizer_config.json").read_text())


def test_token_id_data_exports_no_tokenizer_and_says_so(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (note,) = write_tokenizer(out, _ck(None, 4, data=SimpleNamespace(tokenizer=None)), None, mask=False)
    assert note.startswith("the run's data has no text tokenizer") and list(out.iterdir()) == []
    assert special_ids(out) == {}
