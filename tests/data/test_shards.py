"""`tcsm prepare` and the `shards` / `hf` data kinds: every input kind and tokenizer kind on tiny local files,
exact round trips, atomic preparation, exact resume from shards, and the bad inputs of issue 22."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from train_helpers import assert_same_weights, final_weights, restore_torch_threads, tiny  # noqa: F401

from tcsm.cli import main
from tcsm.data import DataError, EpochBatches, build_data
from tcsm.data.prepare import prepare
from tcsm.data.shards import TokenRows, read_index

# ../shared/data beside the checkout (or beside the folder of worktrees that holds it)
_ROOT = Path(__file__).resolve().parents[2]
GPT2_DIR = next((p for p in (_ROOT.parent / "shared", _ROOT.parent.parent / "shared") if p.is_dir()), _ROOT) / "data" / "gpt2_bpe"
needs_gpt2 = pytest.mark.skipif(not GPT2_DIR.is_dir(), reason="../shared/data/gpt2_bpe not present")

DOCS = [f"document {i}: the quick brown fox {'jumps ' * (i % 5)}over the lazy dog." for i in range(60)]


def _stream(directory: Path, split: str = "train") -> np.ndarray:
    index = read_index(directory)
    parts = [np.fromfile(directory / s["file"], dtype=index["dtype"]) for s in index["splits"][split]["shards"]]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _docs_of(directory: Path, tok) -> list[str]:
    """Every document of every split, decoded from the shards (EOS-packed)."""
    eos = read_index(directory)["eos_id"]
    out = []
    for split in ("train", "valid", "test"):
        ids = _stream(directory, split).tolist()
        while ids:
            end = ids.index(eos)
            out.append(tok.decode(ids[:end]))
            ids = ids[end + 1 :]
    return out


def _tokenizer(directory: Path):
    return build_data({"kind": "shards", "path": str(directory), "seq_len": 4}).tokenizer


# --------------------------------------------------------------------------------------------------- inputs


def _write_inputs(root: Path) -> dict[str, list[str]]:
    """One file of each kind; returns the documents each holds."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "a.txt").write_text(DOCS[0], encoding="utf-8")
    with gzip.open(root / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.write("<|sep|>".join(DOCS[1:4]))
    (root / "c.jsonl").write_text("".join(json.dumps({"body": d}) + "\n" for d in DOCS[4:8]), encoding="utf-8")
    with gzip.open(root / "d.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"body": d}) + "\n" for d in DOCS[8:10])
    return {"a.txt": DOCS[:1], "b.txt.gz": DOCS[1:4], "c.jsonl": DOCS[4:8], "d.jsonl.gz": DOCS[8:10]}


def test_files_globs_and_folders_give_every_document_exactly_once(tmp_path):
    expected = _write_inputs(tmp_path / "in")
    common = {"text_field": "body", "doc_separator": "<|sep|>", "progress": False, "valid_fraction": 0.2,
              "test_fraction": 0.2}  # fmt: skip
    index = prepare([str(tmp_path / "in")], tmp_path / "dir", "char", **common)
    assert index["documents"] == 10 and index["tokenizer"]["kind"] == "char"
    tok = _tokenizer(tmp_path / "dir")
    assert sorted(_docs_of(tmp_path / "dir", tok)) == sorted(DOCS[:10])
    assert sum(s["documents"] for s in index["splits"].values()) == 10
    # a glob and explicit files read the same documents
    prepare([str(tmp_path / "in" / "*.jsonl*"), str(tmp_path / "in" / "a.txt")], tmp_path / "glob", "char", **common)
    got = sorted(_docs_of(tmp_path / "glob", _tokenizer(tmp_path / "glob")))
    assert got == sorted(expected["c.jsonl"] + expected["d.jsonl.gz"] + expected["a.txt"])


def test_parquet_and_datasets_folders(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    datasets = pytest.importorskip("datasets")
    pq.write_table(pa.table({"text": DOCS[:20], "n": list(range(20))}), tmp_path / "p.parquet")
    datasets.Dataset.from_dict({"text": DOCS[20:30]}).save_to_disk(str(tmp_path / "ds"))
    prepare([str(tmp_path / "p.parquet"), str(tmp_path / "ds")], tmp_path / "out", "char", progress=False)
    assert sorted(_docs_of(tmp_path / "out", _tokenizer(tmp_path / "out"))) == sorted(DOCS[:30])
    # the hf data kind reads the same inputs whole, with the same document split
    bundle = build_data({"kind": "hf", "path": str(tmp_path / "ds"), "tokenizer": "char", "seq_len": 8})
    assert bundle.train.shape[1] == 8 and bundle.meta["documents"]["train"] >= 5
    from_parquet = build_data({"kind": "hf", "path": str(tmp_path / "p.parquet"), "tokenizer": "char", "seq_len": 8})
    assert sum(from_parquet.meta["documents"].values()) == 20
    text = bundle.decode(bundle.train.reshape(-1))
    assert DOCS[20][:20] in text or any(d[:20] in text for d in DOCS[20:30])
    (tmp_path / "t.txt").write_text("plain text")
    with pytest.raises(DataError, match="datasets folder or Parquet"):
        build_data({"kind": "hf", "path": str(tmp_path / "t.txt")})


# --------------------------------------------------------------------------------------------------- tokenizers


@needs_gpt2
@pytest.mark.slow  # spawns two worker processes
def test_gpt2_ids_are_gpt2s_and_workers_do_not_change_the_shards(tmp_path):
    (tmp_path / "in").mkdir()
    for i in range(0, 60, 10):
        (tmp_path / "in" / f"{i}.txt").write_text("\n\n".join(DOCS[i : i + 10]), encoding="utf-8")
    spec = f"gpt2:{GPT2_DIR}"
    one = prepare([str(tmp_path / "in")], tmp_path / "w1", spec, doc_separator="\n\n", progress=False)
    two = prepare([str(tmp_path / "in")], tmp_path / "w2", spec, doc_separator="\n\n", progress=False, workers=2)
    assert one["splits"] == two["splits"] and one["eos_id"] == 50256 and one["dtype"] == "<u2"
    tok = _tokenizer(tmp_path / "w1")
    assert tok.encode("Hello world") == [15496, 995]
    assert sorted(_docs_of(tmp_path / "w1", tok)) == sorted(DOCS)


def test_trained_bpe_tokenizer_json_and_tokenizer_folders(tmp_path):
    pytest.importorskip("tokenizers")
    (tmp_path / "c.txt").write_text("\n".join(DOCS), encoding="utf-8")
    a = prepare([str(tmp_path / "c.txt")], tmp_path / "bpe", "bpe:300", doc_separator="\n", progress=False)
    assert a["vocab_size"] <= 300 and a["eos_id"] is not None
    saved = tmp_path / "bpe" / "tokenizer" / "tokenizer.json"
    # the same tokenizer as a tokenizer.json file, and as a folder with a config that names its EOS
    b = prepare([str(tmp_path / "c.txt")], tmp_path / "file", str(saved), doc_separator="\n", progress=False)
    assert b["tokenizer"]["identity"] == a["tokenizer"]["identity"] and b["splits"] == a["splits"]
    (tmp_path / "tokdir").mkdir()
    (tmp_path / "tokdir" / "tokenizer.json").write_bytes(saved.read_bytes())
    (tmp_path / "tokdir" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    c = prepare([str(tmp_path / "c.txt")], tmp_path / "folder", str(tmp_path / "tokdir"), doc_separator="\n",
                progress=False)  # fmt: skip
    assert c["splits"] == a["splits"]
    assert sorted(_docs_of(tmp_path / "folder", _tokenizer(tmp_path / "folder"))) == sorted(DOCS)


def test_a_bert_folder_without_tokenizer_json_is_converted_and_ends_documents_with_sep(tmp_path):
    transformers = pytest.importorskip("transformers")
    words = sorted({w for d in DOCS for w in d.replace(":", " :").replace(".", " .").split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    transformers.BertTokenizer(str(tmp_path / "vocab.txt")).save_pretrained(str(tmp_path / "bert"))
    (tmp_path / "bert" / "tokenizer.json").unlink()  # a folder in the older format: vocab.txt and a config
    (tmp_path / "bert" / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (tmp_path / "c.txt").write_text("\n".join(DOCS[:10]), encoding="utf-8")
    index = prepare([str(tmp_path / "c.txt")], tmp_path / "out", str(tmp_path / "bert"), doc_separator="\n",
                    progress=False, valid_fraction=0, test_fraction=0)  # fmt: skip
    assert index["eos_id"] == vocab.index("[SEP]") and index["vocab_size"] == len(vocab)
    assert (tmp_path / "out" / "tokenizer" / "tokenizer.json").is_file()
    ids = _stream(tmp_path / "out").tolist()
    assert ids.count(index["eos_id"]) == 10 and vocab.index("[UNK]") not in ids


def test_pad_packing_stores_one_row_per_document(tmp_path):
    (tmp_path / "c.txt").write_text("\n".join(DOCS[:12]), encoding="utf-8")
    prepare([str(tmp_path / "c.txt")], tmp_path / "out", "char", doc_separator="\n", packing="pad", seq_len=40,
            valid_fraction=0, test_fraction=0, progress=False)  # fmt: skip
    bundle = build_data({"kind": "shards", "path": str(tmp_path / "out"), "seq_len": None})
    assert tuple(bundle.train.shape) == (12, 40)
    rows = sorted(bundle.decode(r).rstrip("\n") for r in bundle.train[:])
    assert rows == sorted(d[:40].rstrip("\n") for d in DOCS[:12])
    with pytest.raises(DataError, match="padded to 40"):
        build_data({"kind": "shards", "path": str(tmp_path / "out"), "seq_len": 16})


# --------------------------------------------------------------------------------------------------- reading


def _corpus(tmp_path, **kw) -> Path:
    (tmp_path / "c.txt").write_text("\n".join(DOCS), encoding="utf-8")
    out = tmp_path / "shards"
    prepare([str(tmp_path / "c.txt")], out, "char", doc_separator="\n", progress=False, **kw)
    return out


def test_rows_are_memory_mapped_windows_of_the_stream(tmp_path):
    out = _corpus(tmp_path, shard_tokens=700)  # several train shards
    stream_parts = [np.fromfile(out / s["file"], dtype="<u2") for s in read_index(out)["splits"]["train"]["shards"]]
    assert len(stream_parts) > 2
    for windows in ("chunks", "random"):
        bundle = build_data({"kind": "shards", "path": str(out), "seq_len": 16, "windows": windows, "seed": 3})
        rows = bundle.train
        assert isinstance(rows, TokenRows) and all(isinstance(a, np.memmap) for a in rows.arrays)
        got = rows[torch.arange(len(rows))]
        assert got.dtype == torch.long and got.shape == (len(rows), 16)
        k = 0
        offsets = []
        for part, n in zip(stream_parts, rows.counts):
            for j in range(n):
                text = "".join(map(chr, got[k].tolist()))  # compare token ids as a string
                start = "".join(map(chr, part.tolist())).find(text, j * 16)
                offsets.append(start - j * 16)
                k += 1
        assert all(0 <= o < 16 for o in offsets)
        assert (set(offsets) == {0}) == (windows == "chunks")
        again = build_data({"kind": "shards", "path": str(out), "seq_len": 16, "windows": windows, "seed": 3})
        assert torch.equal(again.train[torch.arange(len(rows))], got)
    # held-out splits are ordinary tensors of aligned chunks
    assert isinstance(bundle.valid, torch.Tensor) and bundle.valid.dim() == 2


def test_ranks_read_disjoint_rows_that_together_are_the_global_batch(tmp_path):
    bundle = build_data({"kind": "shards", "path": str(_corpus(tmp_path)), "seq_len": 16})
    ranks = [EpochBatches(len(bundle.train), 8, seed=1, rank=r, world_size=2) for r in range(2)]
    whole = EpochBatches(len(bundle.train), 8, seed=1)
    for _ in range(5):
        a, b = (next(r) for r in ranks)
        assert not set(a.tolist()) & set(b.tolist())
        assert torch.equal(torch.cat([a, b]), next(whole))


SHARDS_TINY = ("data.kind=shards", "data.windows=random", "train.eval_every=0", "train.sample_every=0")


def _train_args(out, run, *extra):
    return ["train", "-o", str(run), *tiny(*SHARDS_TINY, f"data.path={out}", *extra, synthetic=False)]


def test_exact_resume_from_shards_and_the_run_keeps_checksum_and_tokenizer(tmp_path):
    out = _corpus(tmp_path)
    assert main(_train_args(out, tmp_path / "full", "train.steps=6", "train.save_every=3")) == 0
    assert main(_train_args(out, tmp_path / "part", "train.steps=3", "train.save_every=3")) == 0
    assert main([*_train_args(out, tmp_path / "part", "train.steps=6", "train.save_every=3"), "--resume"]) == 0
    for which in ("model", "ema"):
        assert_same_weights(final_weights(tmp_path / "full", which), final_weights(tmp_path / "part", which))
    state = json.loads((tmp_path / "full" / "checkpoints" / "step_00000006" / "state.json").read_text())["state"]
    info = state["data_info"]
    assert info["index_checksum"] == build_data({"kind": "shards", "path": str(out)}).meta["index_checksum"]
    assert info["tokenizer_identity"] == read_index(out)["tokenizer"]["identity"]


# --------------------------------------------------------------------------------------------------- atomicity


def test_an_interrupted_prepare_leaves_no_index_and_a_rerun_starts_clean(tmp_path, monkeypatch):
    from tcsm.data import prepare as prep

    (tmp_path / "c.txt").write_text("\n".join(DOCS), encoding="utf-8")
    real = prep._ShardWriter.write

    def interrupted(self, ids, whole_rows=0):
        real(self, ids, whole_rows)
        raise KeyboardInterrupt

    monkeypatch.setattr(prep._ShardWriter, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        prepare([str(tmp_path / "c.txt")], tmp_path / "out", "char", doc_separator="\n", progress=False)
    monkeypatch.undo()
    assert not (tmp_path / "out" / "index.json").exists()
    with pytest.raises(DataError, match="holds no index.json"):
        build_data({"kind": "shards", "path": str(tmp_path / "out")})
    (tmp_path / "out" / ".prepare-999999").mkdir()  # what a killed run leaves
    (tmp_path / "out" / ".prepare-999999" / "train-00000.bin").write_bytes(b"12")
    prepare([str(tmp_path / "c.txt")], tmp_path / "out", "char", doc_separator="\n", progress=False)
    assert min(p.name for p in (tmp_path / "out").iterdir()) == "index.json"
    assert not list((tmp_path / "out").glob(".prepare-*"))
    with pytest.raises(DataError, match="--overwrite"):
        prepare([str(tmp_path / "c.txt")], tmp_path / "out", "char", progress=False)
    again = prepare([str(tmp_path / "c.txt")], tmp_path / "out", "char", progress=False, overwrite=True)
    assert again["documents"] == 1 and not (tmp_path / "out" / "valid-00000.bin").exists()


# --------------------------------------------------------------------------------------------------- end to end


def test_sample_and_eval_decode_with_the_tokenizer_stored_with_the_run(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    (tmp_path / "c.txt").write_text("\n".join(DOCS * 3), encoding="utf-8")
    prepare([str(tmp_path / "c.txt")], tmp_path / "sh", "bpe:300", doc_separator="\n", progress=False,
            valid_fraction=0.3, test_fraction=0)  # fmt: skip
    run = tmp_path / "run"
    assert main(_train_args(tmp_path / "sh", run, "train.steps=2", "train.save_every=2")) == 0
    assert (run / "tokenizer.json").is_file()
    assert main(["eval", str(run), "--json", "--max-examples", "4"]) == 0
    tok = build_data({"kind": "shards", "path": str(tmp_path / "sh")}).tokenizer
    import shutil

    shutil.rmtree(tmp_path / "sh")  # sampling needs only the run
    capsys.readouterr()
    assert main(["sample", str(run), "-n", "2", "--steps", "4", "--format", "jsonl"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    from tcsm.data.base import readable_text

    assert len(rows) == 2 and all(r["text"] == readable_text(tok, r["tokens"]) for r in rows)  # specials not shown


# --------------------------------------------------------------------------------------------------- bad inputs


def _error(capsys, argv) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


def _prep(capsys, inputs, out, *extra) -> str:
    return _error(capsys, ["prepare", *map(str, inputs), "-o", str(out), "--tokenizer", "char", "--no-progress", *extra])


def test_bad_inputs_get_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "empty.txt").write_text("   \n")
    assert "holds no text" in _prep(capsys, [tmp_path / "empty.txt"], tmp_path / "o1")
    (tmp_path / "blob.txt").write_bytes(b"ab\x00\x01\x02" * 100)
    assert "looks binary" in _prep(capsys, [tmp_path / "blob.txt"], tmp_path / "o2")
    (tmp_path / "x.jsonl").write_text(json.dumps({"content": "hi"}) + "\n")
    assert "no string field 'text'" in _prep(capsys, [tmp_path / "x.jsonl"], tmp_path / "o3")
    assert "matches no file" in _prep(capsys, [tmp_path / "nothing*.txt"], tmp_path / "o4")
    (tmp_path / "tok.json").write_text('{"version": "1.0", "model": 3}')
    err = _error(capsys, ["prepare", str(tmp_path / "x.jsonl"), "-o", str(tmp_path / "o5"), "--tokenizer",
                          str(tmp_path / "tok.json")])  # fmt: skip
    assert "does not parse" in err
    for path in ("o1", "o2", "o3", "o5"):
        assert not (tmp_path / path / "index.json").exists()


def test_damaged_shards_and_another_tokenizer_are_refused(tmp_path, capsys):
    out = _corpus(tmp_path)
    run = tmp_path / "run"
    assert main(_train_args(out, run, "train.steps=2", "train.save_every=2")) == 0
    shard = out / "train-00000.bin"
    good = shard.read_bytes()
    shard.write_bytes(good[:-2])
    assert "truncated" in _error(capsys, _train_args(out, tmp_path / "r2", "train.steps=1"))
    shard.write_bytes(good[:10] + bytes([good[10] ^ 1]) + good[11:])
    assert "sha256" in _error(capsys, _train_args(out, tmp_path / "r3", "train.steps=1"))
    shard.write_bytes(good)
    # the same text with another character set: other token ids
    (tmp_path / "d.txt").write_text("\n".join(DOCS) + "\n~", encoding="utf-8")
    prepare([str(tmp_path / "d.txt")], tmp_path / "other", "char", doc_separator="\n", progress=False)
    err = _error(capsys, _train_args(tmp_path / "other", tmp_path / "r4", "train.steps=1", f"train.init_from={run}"))
    assert "tokenizer" in err
    err = _error(capsys, ["eval", str(run), f"data.path={tmp_path / 'other'}"])
    assert "tokenizer" in err or "vocabulary" in err
    err = _error(capsys, [*_train_args(tmp_path / "other", run, "train.steps=4"), "--resume"])
    assert "tokenizer" in err or "vocabulary" in err
    # the same folder prepared again from other text: the run's index checksum no longer matches
    (tmp_path / "c.txt").write_text("\n".join(reversed(DOCS)), encoding="utf-8")
    prepare([str(tmp_path / "c.txt")], out, "char", doc_separator="\n", progress=False, overwrite=True)
    assert "index sha256" in _error(capsys, [*_train_args(out, run, "train.steps=4"), "--resume"])
