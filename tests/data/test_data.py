"""Data sources, tokenizers and batching. Nothing here touches the network (downloads use file:// URLs)."""

import gzip
import hashlib
import itertools
import json
import math
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from tcsm.data import (
    DataBundle,
    DataError,
    EpochBatches,
    MarkovChainSource,
    build_data,
    gpt2_tokenizer,
)
from tcsm.data import text8 as text8_mod

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
TEXT8_PREFIX = SHARED / "text8" / "text8_prefix.txt.gz"
GPT2_DIR = SHARED / "gpt2_bpe"


# --- synthetic source -------------------------------------------------------------------------------------


def test_markov_entropy_equals_exact_enumeration():
    """Identity: H(p₁) = H(π) + (L−1)·h equals −Σ_x p(x) log p(x) over all V^L sequences (V=3, L=3)."""
    src = MarkovChainSource(vocab_size=3, seq_len=3, concentration=0.5, seed=3)
    xs = torch.tensor(list(itertools.product(range(3), repeat=3)))
    logp = src.log_prob(xs)
    assert math.isclose(logp.exp().sum().item(), 1.0, abs_tol=1e-12)
    exact = -(logp.exp() * logp).sum().item()
    assert math.isclose(src.sequence_entropy(), exact, rel_tol=1e-10)
    # stationarity: every position has marginal π
    p = logp.exp()
    for pos in range(3):
        marg = torch.zeros(3, dtype=torch.float64).index_add_(0, xs[:, pos], p)
        assert np.allclose(marg.numpy(), src.pi, atol=1e-12)


def test_markov_entropy_matches_empirical_estimate():
    bundle = build_data({"kind": "synthetic", "num_train": 20_000, "num_valid": 10, "num_test": 10})
    nll = -bundle.source.log_prob(bundle.train.long())  # Monte Carlo estimate of H(p₁)
    mean, se = nll.mean().item(), nll.std().item() / math.sqrt(nll.numel())
    h = bundle.source.sequence_entropy()
    assert abs(mean - h) < 4 * se
    assert math.isclose(bundle.nats_per_token_floor, h / bundle.seq_len)
    # the floor is meaningfully below log V (the quickstart has something to learn)
    assert bundle.nats_per_token_floor < 0.8 * math.log(bundle.vocab_size)


def test_synthetic_is_deterministic_and_splits_differ():
    cfg = {"kind": "synthetic", "num_train": 100, "num_valid": 50, "num_test": 50, "seed": 7}
    a, b = build_data(cfg), build_data(cfg)
    assert torch.equal(a.train, b.train) and torch.equal(a.test, b.test)
    assert not torch.equal(a.valid, a.test)
    assert a.train.dtype == torch.uint8 and a.train.shape == (100, 32)
    c = build_data(cfg, seed=8)
    assert not torch.equal(a.train, c.train)
    assert a.decode(a.encode("abc")) == "abc"
    assert a.get_batch("train", torch.tensor([0, 1])).dtype == torch.long


def test_synthetic_errors():
    with pytest.raises(DataError, match="vocab_size"):
        build_data({"kind": "synthetic", "vocab_size": 1})
    with pytest.raises(DataError, match="concentration"):
        build_data({"kind": "synthetic", "concentration": 0})
    with pytest.raises(DataError, match="unknown key"):
        build_data({"kind": "synthetic", "vocab": 8})
    with pytest.raises(DataError, match="data kind"):
        build_data({"kind": "nope"})


# --- text8 ------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not TEXT8_PREFIX.exists(), reason="shared text8 prefix not available")
def test_text8_prefix_split_sizes_and_label():
    b = build_data({"kind": "text8", "split": "prefix", "path": str(TEXT8_PREFIX)})
    n = 12_549_840
    chars = b.meta["chars"]
    assert (chars["train"], chars["valid"], chars["test"]) == (n - 2 * 627_492, 627_492, 627_492)
    assert b.train.shape == ((n - 2 * 627_492) // 256, 256)
    assert b.valid.shape == (627_492 // 256, 256) and b.test.shape == b.valid.shape
    assert b.label == "text8-prefix" and b.vocab_size == 27 and b.train.dtype == torch.uint8
    assert b.decode(b.train[0, :9]) == " anarchis"  # text8 starts " anarchism originated"


def _fake_text8(n):
    rng = np.random.default_rng(0)
    return "".join(np.array(list(text8_mod.ALPHABET))[rng.integers(0, 27, n)])


@pytest.fixture
def small_text8(monkeypatch):
    """Shrink 'full text8' to 4,000 characters so the standard-split code paths run in milliseconds."""
    text = _fake_text8(4000)
    monkeypatch.setattr(text8_mod, "TEXT8_NUM_CHARS", 4000)
    monkeypatch.setattr(text8_mod, "TEXT8_SHA1", hashlib.sha1(text.encode()).hexdigest())
    return text


def test_text8_readers_zip_txt_gz(tmp_path, small_text8):
    txt = tmp_path / "text8"
    txt.write_text(small_text8)
    gz = tmp_path / "text8.gz"
    with gzip.open(gz, "wt") as f:
        f.write(small_text8)
    zp = tmp_path / "text8.zip"
    with zipfile.ZipFile(zp, "w") as z:
        z.writestr("text8", small_text8)
    bundles = [build_data({"kind": "text8", "path": str(p), "seq_len": 40}) for p in (txt, gz, zp)]
    for b in bundles:
        assert b.label == "text8"
        assert (b.train.shape[0], b.valid.shape[0], b.test.shape[0]) == (90, 5, 5)  # 3600/200/200 chars
        assert torch.equal(b.train, bundles[0].train)
    assert bundles[0].decode(bundles[0].test.flatten()) == small_text8[-200:]


def test_text8_rejects_wrong_size_alphabet_and_checksum(tmp_path, small_text8):
    short = tmp_path / "short.txt"
    short.write_text(small_text8[:-1])
    with pytest.raises(DataError, match="split: prefix"):
        build_data({"kind": "text8", "path": str(short)})
    bad = tmp_path / "bad.txt"
    bad.write_text(small_text8[:-1] + "X")
    with pytest.raises(DataError, match="'X'"):
        build_data({"kind": "text8", "path": str(bad)})
    other = tmp_path / "other.txt"
    other.write_text(small_text8[::-1])
    with pytest.raises(DataError, match="SHA-1"):
        build_data({"kind": "text8", "path": str(other)})
    build_data({"kind": "text8", "path": str(other), "verify": False, "seq_len": 40})
    with pytest.raises(DataError, match="needs `path`"):
        build_data({"kind": "text8", "split": "prefix"})
    with pytest.raises(DataError, match="not found"):
        build_data({"kind": "text8", "path": str(tmp_path / "missing.zip")})
    corrupt = tmp_path / "corrupt.zip"
    corrupt.write_bytes(b"not a zip")
    with pytest.raises(DataError, match="corrupt.zip"):
        build_data({"kind": "text8", "path": str(corrupt)})


def test_text8_download_path_with_local_url(tmp_path, small_text8, monkeypatch):
    served = tmp_path / "served" / "text8.zip"
    served.parent.mkdir()
    with zipfile.ZipFile(served, "w") as z:
        z.writestr("text8", small_text8)
    url = served.as_uri()  # file:// — urllib fetches it like a remote file, with no network
    cache = tmp_path / "cache"

    # bad checksum: DataError, and nothing (not even a partial file) is left in the cache
    monkeypatch.setattr(text8_mod, "TEXT8_ZIP_SHA1", "0" * 40)
    with pytest.raises(DataError, match="checksum mismatch"):
        build_data({"kind": "text8", "cache_dir": str(cache), "url": url})
    assert not any(cache.iterdir())

    monkeypatch.setattr(text8_mod, "TEXT8_ZIP_SHA1", hashlib.sha1(served.read_bytes()).hexdigest())
    b = build_data({"kind": "text8", "cache_dir": str(cache), "url": url, "seq_len": 40})
    assert (cache / "text8.zip").exists() and b.train.shape == (90, 40)
    served.unlink()  # a second build reads the cache and does not fetch again
    assert torch.equal(
        build_data({"kind": "text8", "cache_dir": str(cache), "url": url, "seq_len": 40}).train, b.train
    )

    with pytest.raises(DataError, match="download"):
        build_data(
            {"kind": "text8", "cache_dir": str(tmp_path / "c2"), "url": (tmp_path / "nothing").as_uri()}
        )


# --- character corpora ------------------------------------------------------------------------------------


def test_char_corpus_and_out_of_vocab(tmp_path):
    text = "hello world, this is a tiny corpus. " * 20
    p = tmp_path / "c.txt"
    p.write_text(text)
    b = build_data({"kind": "text", "path": str(p), "seq_len": 16, "valid_frac": 0.1, "test_frac": 0.1})
    assert b.vocab_size == len(set(text)) and b.tokenizer.chars == "".join(sorted(set(text)))
    assert b.train.shape[1] == 16 and b.valid.shape[0] >= 1
    assert b.decode(b.train[0]) == text[:16]
    # separate files: valid has a character the training split never saw; the vocabulary is the whole corpus's
    tr, va = tmp_path / "tr.txt", tmp_path / "va.txt"
    tr.write_text("abcabcabcabc" * 10)
    va.write_text("abcabcabcabd" * 10)
    b = build_data({"kind": "text", "train_path": str(tr), "valid_path": str(va), "seq_len": 8})
    assert b.tokenizer.chars == "abcd" and b.decode(b.valid[0]) == "abcabcab"
    # an explicit vocabulary refuses other characters, naming the option that drops them
    with pytest.raises(DataError, match="'d'.*data.oov=drop"):
        build_data({"kind": "text", "train_path": str(tr), "valid_path": str(va), "seq_len": 8, "vocab": "abc"})
    b = build_data(
        {"kind": "text", "train_path": str(tr), "valid_path": str(va), "seq_len": 8, "vocab": "abc", "oov": "drop"}
    )
    assert b.meta["dropped_oov"] == {"train": 0, "valid": 10, "test": 0} and b.test.shape[0] == 0


def test_char_corpus_errors(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(DataError, match="empty"):
        build_data({"kind": "text", "path": str(empty)})
    p = tmp_path / "c.txt"
    p.write_text("abc" * 100)
    with pytest.raises(DataError, match="valid_frac"):
        build_data({"kind": "text", "path": str(p), "valid_frac": 0.6, "test_frac": 0.5})
    with pytest.raises(DataError, match="less than one chunk"):
        build_data({"kind": "text", "path": str(p), "seq_len": 1000})
    with pytest.raises(DataError, match="not both"):
        build_data({"kind": "text", "path": str(p), "train_path": str(p)})
    bad_gz = tmp_path / "bad.txt.gz"
    bad_gz.write_bytes(b"not gzip")
    with pytest.raises(DataError, match="cannot read"):
        build_data({"kind": "text", "path": str(bad_gz)})


# --- BPE --------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not GPT2_DIR.exists(), reason="shared GPT-2 BPE files not available")
def test_gpt2_bpe_ids_match_gpt2(tmp_path):
    pytest.importorskip("tokenizers")
    tok = gpt2_tokenizer(str(GPT2_DIR))
    assert tok.vocab_size == 50257 and tok.eos_id == 50256
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(" Hello world") == [18435, 995]
    assert tok.encode("Hello world<|endoftext|>") == [15496, 995, 50256]
    s = "Unicode ünïcode and   spaces\n\nok"
    assert tok.decode(tok.encode(s)) == s
    # a corpus: every document is followed by EOS, int32 storage
    p = tmp_path / "docs.txt"
    p.write_text("<|endoftext|>".join(["Hello world"] * 40))
    b = build_data(
        {
            "kind": "bpe",
            "path": str(p),
            "bpe_dir": str(GPT2_DIR),
            "seq_len": 6,
            "doc_separator": "<|endoftext|>",
        }
    )
    assert b.train.dtype == torch.int32 and b.eos_id == 50256
    assert b.train[0].tolist() == [15496, 995, 50256, 15496, 995, 50256]


def test_trained_bpe(tmp_path):
    pytest.importorskip("tokenizers")
    p = tmp_path / "docs.jsonl"
    words = ["the cat sat on the mat", "a dog ran in the park", "the bird sang a song"]
    p.write_text("\n".join(json.dumps({"text": words[i % 3]}) for i in range(300)))
    cfg = {"kind": "bpe", "path": str(p), "tokenizer": "train", "vocab_size": 300, "seq_len": 8}
    a, b = build_data(cfg), build_data(cfg)
    assert a.vocab_size <= 300 and torch.equal(a.train, b.train)  # deterministic
    assert a.decode(a.encode("the cat sat")) == "the cat sat"
    assert a.eos_id is not None and (a.train == a.eos_id).any()
    with pytest.raises(DataError, match="vocab_size"):
        build_data({**cfg, "vocab_size": 100})


# --- batching ---------------------------------------------------------------------------------------------


def test_epoch_batches_deterministic_and_cover_epoch():
    a, b = EpochBatches(103, 10, seed=5), EpochBatches(103, 10, seed=5)
    first = [next(a) for _ in range(25)]
    assert all(torch.equal(x, next(b)) for x in first)
    epoch0 = torch.cat(first[:10])
    assert len(a) == 10 and epoch0.unique().numel() == 100  # no repeats within an epoch
    assert not torch.equal(torch.cat(first[10:20]), epoch0)  # a new order each epoch
    assert not torch.equal(next(EpochBatches(103, 10, seed=6)), first[0])


def test_epoch_batches_resume_exactly():
    ref = EpochBatches(50, 8, seed=1)
    expected = [next(ref) for _ in range(20)]
    run = EpochBatches(50, 8, seed=1)
    for _ in range(9):
        next(run)
    state = run.state_dict()
    resumed = EpochBatches(50, 8, seed=1)
    resumed.load_state_dict(state)
    assert resumed.step == 9
    assert all(torch.equal(next(resumed), e) for e in expected[9:])
    with pytest.raises(DataError, match="global_batch"):
        EpochBatches(50, 4, seed=1).load_state_dict(state)


def test_epoch_batches_ddp_sharding_equivalence():
    single = EpochBatches(64, 12, seed=3)
    ranks = [EpochBatches(64, 12, seed=3, rank=r, world_size=4) for r in range(4)]
    for _ in range(12):  # crosses epoch boundaries (5 batches per epoch)
        parts = [next(r) for r in ranks]
        assert all(p.numel() == 3 for p in parts)
        assert torch.equal(torch.cat(parts), next(single))
    # resuming a single-process state on 2 ranks continues the same global sequence
    two = [EpochBatches(64, 12, seed=3, rank=r, world_size=2) for r in range(2)]
    for r in two:
        r.load_state_dict(single.state_dict())
    assert torch.equal(torch.cat([next(r) for r in two]), next(single))
    with pytest.raises(DataError, match="multiple of the world size"):
        EpochBatches(64, 10, seed=0, rank=0, world_size=4)
    with pytest.raises(DataError, match="fewer than one global batch"):
        EpochBatches(5, 8)


def test_databundle_validates_shapes():
    x = torch.zeros(4, 8, dtype=torch.uint8)
    with pytest.raises(DataError, match="shape"):
        DataBundle("d", 2, 4, x, x, x, tokenizer=None)
