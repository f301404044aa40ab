"""A Hugging Face round trip that is HF-clean (issue 34, items 3 and 5), on tiny local models and tokenizers: an
export's tokenizer names the run's real special tokens and a mask token at the model's [MASK] input; an instruction
run's chat template travels with the run and its export; nothing stops at a trust_remote_code prompt; an export
transformers cannot load says so; `train.init_from` takes the architecture of the run or export it starts from;
the exported model generates; a pretrained model's vocabulary must be the data tokenizer's own, padded embedding
matrices need no id map, a causal LM's own mask token starts [MASK]; samples do not print special tokens."""

from __future__ import annotations

import builtins
import json
from pathlib import Path

import pytest
import torch
from train_helpers import restore_torch_threads, tiny  # noqa: F401

import tcsm
from tcsm.cli import main
from tcsm.data.prepare import prepare

tf = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

WORDS = "the quick brown fox jumps over lazy dog and a cat sat on mat ."
DOCS = [f"the {a} fox jumps over the {b} dog ." for a in WORDS.split()[:6] for b in WORDS.split()[6:12]] * 2
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SHARDS = ("data.kind=shards", "data.windows=random", "train.eval_every=0", "train.sample_every=0", "data.seq_len=12",
          "model.max_len=12")  # fmt: skip


@pytest.fixture(autouse=True)
def no_prompt(monkeypatch):
    """Any interactive question (transformers' trust_remote_code prompt) fails the test instead of waiting."""

    def refuse(*a, **k):
        raise AssertionError(f"stopped at an interactive prompt: {a[0] if a else ''}"[:200])

    monkeypatch.setattr(builtins, "input", refuse)


def _bert_tokenizer(root: Path, vocab: list[str]) -> Path:
    (root / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tf.BertTokenizer(str(root / "vocab.txt")).save_pretrained(str(root / "bert-tok"))
    return root / "bert-tok"


def _shards(root: Path, tokenizer: str) -> Path:
    (root / "c.txt").write_text("\n".join(DOCS), encoding="utf-8")
    prepare([str(root / "c.txt")], root / "shards", tokenizer, doc_separator="\n", progress=False,
            valid_fraction=0.2, test_fraction=0)  # fmt: skip
    return root / "shards"


def _train(shards: Path, run: Path, *extra: str) -> Path:
    argv = ["train", "-o", str(run), *tiny(*SHARDS, f"data.path={shards}", "train.steps=2", *extra, synthetic=False)]
    assert main(argv) == 0
    return run


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("bert")
    vocab = SPECIALS + sorted(set(WORDS.split()))
    with torch.random.fork_rng(devices=[]):
        run = _train(_shards(root, str(_bert_tokenizer(root, vocab))), root / "run")
    return run, vocab


# --------------------------------------------------------------------------------------------------- item 3


def test_a_bert_vocabulary_export_names_its_real_special_tokens(bert_run, tmp_path):
    """Before: tokenizer_config.json claimed <|endoftext|> as EOS, which AutoTokenizer added at id V — the model's
    [MASK] input — and named no mask token."""
    run, vocab = bert_run
    V = len(vocab)
    out = tcsm.export(run, tmp_path / "hf")
    tok = tf.AutoTokenizer.from_pretrained(str(out))
    assert len(tok) == V + 1 and max(tok.get_vocab().values()) == V  # one token added: the mask, at V
    assert tok.eos_token == "[SEP]" and tok.eos_token_id == vocab.index("[SEP]")
    assert tok.pad_token_id == vocab.index("[PAD]") and tok.unk_token_id == vocab.index("[UNK]")
    meta = json.loads((out / "config.json").read_text())
    assert tok.mask_token_id == meta["mask_id"] == V
    assert tok.convert_ids_to_tokens(vocab.index("[MASK]")) == "[MASK]"  # BERT's own [MASK] is a clean token
    # the exported tokenizer.json is still the run's: data prepared from the export is the run's data
    assert (out / "tokenizer.json").read_bytes() == (run / "tokenizer.json").read_bytes()
