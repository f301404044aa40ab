"""`tcsm prepare` says what it did (issue 34, item 6): a non-ASCII --doc-separator splits, a CRLF file splits on a
blank line as its LF copy does, a UTF-8 byte-order mark is not a character of the corpus, options that do not
apply are one-line errors, and a corpus that leaves no validation or test documents is a warning when it is
prepared and when a run trains on it."""

from __future__ import annotations

import json

import pytest
from train_helpers import restore_torch_threads, tiny  # noqa: F401

from tcsm.cli import main
from tcsm.data import build_data
from tcsm.data.shards import read_index

pytestmark = pytest.mark.usefixtures("one_thread")

DOCS = [f"doc {i}: the quick brown fox\njumps over the lazy dog {i % 7}." for i in range(40)]


def _prepare(capsys, *argv):
    rc = main(["prepare", *map(str, argv), "--tokenizer", "char", "--no-progress"])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _chars(out) -> str:
    return build_data({"kind": "shards", "path": str(out), "seq_len": 8}).tokenizer.chars


def test_a_non_ascii_separator_splits_documents(tmp_path, capsys):
    (tmp_path / "c.txt").write_text("§".join(DOCS), encoding="utf-8")
    rc, _, err = _prepare(capsys, tmp_path / "c.txt", "-o", tmp_path / "out", "--doc-separator", "§")
    assert rc == 0, err
    assert read_index(tmp_path / "out")["documents"] == len(DOCS)
    assert "§" not in _chars(tmp_path / "out")


def test_a_crlf_file_splits_on_a_blank_line_like_its_lf_copy(tmp_path, capsys):
    lf = "\n\n".join(DOCS)
    (tmp_path / "lf.txt").write_text(lf, encoding="utf-8")
    (tmp_path / "crlf.txt").write_bytes(lf.replace("\n", "\r\n").encode("utf-8"))
    for name in ("lf", "crlf"):
        rc, _, err = _prepare(capsys, tmp_path / f"{name}.txt", "-o", tmp_path / name, "--doc-separator", "\\n\\n")
        assert rc == 0, err
    assert read_index(tmp_path / "crlf")["documents"] == len(DOCS)
    assert "\r" not in _chars(tmp_path / "crlf")
    for split in ("train", "valid", "test"):
        a, b = (read_index(tmp_path / n)["splits"][split] for n in ("lf", "crlf"))
        assert [s["sha256"] for s in a["shards"]] == [s["sha256"] for s in b["shards"]]


def test_a_byte_order_mark_is_not_a_character_of_the_corpus(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_bytes("\ufeff".encode() + "\n\n".join(DOCS[:20]).encode("utf-8"))
    (tmp_path / "in" / "b.jsonl").write_bytes(
        "\ufeff".encode() + "".join(json.dumps({"text": d}) + "\n" for d in DOCS[20:]).encode("utf-8")
    )
    rc, _, err = _prepare(capsys, tmp_path / "in", "-o", tmp_path / "out", "--doc-separator", "\\n\\n")
    assert rc == 0, err
    assert "\ufeff" not in _chars(tmp_path / "out")
    assert read_index(tmp_path / "out")["documents"] == len(DOCS)


@pytest.mark.parametrize(
    "extra,words",
    [(["--seq-len", "64"], "--packing pad"), (["--doc-separator", "\\n"], "--doc-separator"),
     (["--text-field", "body"], "--text-field")],
)
def test_options_that_do_not_apply_are_one_line_errors(tmp_path, capsys, extra, words):
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS), encoding="utf-8")
    (tmp_path / "c.txt").write_text("\n".join(DOCS), encoding="utf-8")
    given = tmp_path / ("c.txt" if "--text-field" in extra else "c.jsonl")
    rc, _, err = _prepare(capsys, given, "-o", tmp_path / "out", *extra)
    assert rc != 0 and len(err.strip().splitlines()) == 1 and words in err, err
    assert not (tmp_path / "out" / "index.json").exists()


def test_no_held_out_documents_is_a_warning_when_prepared_and_when_trained(tmp_path, capsys):
    (tmp_path / "c.txt").write_text("\n".join(DOCS * 3), encoding="utf-8")
    rc, _, err = _prepare(capsys, tmp_path / "c.txt", "-o", tmp_path / "out", "--doc-separator", "\\n",
                          "--val-fraction", "0", "--test-fraction", "0")  # fmt: skip
    assert rc == 0, err
    assert "warning: no document was held out for valid" in err and "trains without validation" in err
    assert "warning: no document was held out for test" in err
    argv = ["train", "-o", str(tmp_path / "run"), *tiny("data.kind=shards", f"data.path={tmp_path / 'out'}",
            "train.steps=1", "train.eval_every=0", "train.sample_every=0", "sample.num=0", synthetic=False)]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr()
    text = out.out + out.err
    assert "warning: the data has no validation rows" in text and "trains without validation" in text
