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
    """Any interactive question (transformers' trust_remote_code prompt) fails the test instead of waiting: the
    question is answered with an error (which transformers swallows) and recorded."""
    asked = []

    def refuse(*a, **k):
        asked.append(str(a[0] if a else "")[:200])
        raise EOFError

    monkeypatch.setattr(builtins, "input", refuse)
    yield
    assert not asked, f"stopped at an interactive prompt: {asked[0]}"


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
    tok = tf.AutoTokenizer.from_pretrained(str(out), trust_remote_code=True)  # config.json has remote code
    assert len(tok) == V + 1 and max(tok.get_vocab().values()) == V  # one token added: the mask, at V
    assert tok.eos_token == "[SEP]" and tok.eos_token_id == vocab.index("[SEP]")
    assert tok.pad_token_id == vocab.index("[PAD]") and tok.unk_token_id == vocab.index("[UNK]")
    meta = json.loads((out / "config.json").read_text())
    assert tok.mask_token_id == meta["mask_id"] == V
    assert tok.convert_ids_to_tokens(vocab.index("[MASK]")) == "[MASK]"  # BERT's own [MASK] is a clean token
    # the exported tokenizer.json is still the run's: data prepared from the export is the run's data
    assert (out / "tokenizer.json").read_bytes() == (run / "tokenizer.json").read_bytes()


def test_a_byte_level_bpe_export_names_its_mask_token(tmp_path):
    """Before: a BPE export named <|endoftext|> only: AutoTokenizer had no mask token for the model's [MASK] = V."""
    with torch.random.fork_rng(devices=[]):
        run = _train(_shards(tmp_path, "bpe:300"), tmp_path / "run")
    V = tcsm.from_pretrained(run).cfg.vocab_size
    out = tcsm.export(run, tmp_path / "hf")
    tok = tf.AutoTokenizer.from_pretrained(str(out), trust_remote_code=True)
    assert tok.mask_token == "[MASK]" and tok.mask_token_id == V and len(tok) == V + 1
    assert tok.eos_token == "<|endoftext|>" and tok.eos_token_id < V
    assert tok.decode(tok("the lazy dog")["input_ids"]) == "the lazy dog"


TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}the {{ m['content'] }} .{% elif m['role'] == "
            "'assistant' %} a {{ m['content'] }} .{% endif %}{% endfor %}{% if add_generation_prompt %} a{% endif %}")
FT = ["train.progress=false", "train.tensorboard=false", "train.batch_size=4", "train.device=cpu", "train.threads=1",
      "eval.num_t=2", "sample.num=0", "objective.eval_num_t=2", "data.valid_frac=0.25", "train.eval_examples=4"]


def test_an_instruction_runs_chat_template_is_saved_with_the_run_and_its_export(bert_run, tmp_path):
    """Before: the template was read at training time and kept nowhere, so the export could not be prompted."""
    run, vocab = bert_run
    words = WORDS.split()
    chats = [{"messages": [{"role": "user", "content": f"{a} fox"}, {"role": "assistant", "content": f"{b} dog"}]}
             for a in words[:6] for b in words[6:10]]  # fmt: skip
    (tmp_path / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in chats))
    (tmp_path / "chat.jinja").write_text(TEMPLATE)
    argv = ["finetune", "sft", "--from", str(run), "--data", str(tmp_path / "chats.jsonl"), "--chat-template",
            str(tmp_path / "chat.jinja"), "--steps", "1", "-o", str(tmp_path / "sft"), *FT]  # fmt: skip
    assert main(argv) == 0
    assert (tmp_path / "sft" / "chat_template.jinja").read_text() == TEMPLATE
    out = tcsm.export(tmp_path / "sft", tmp_path / "hf")
    tok = tf.AutoTokenizer.from_pretrained(str(out), trust_remote_code=True)  # config.json has remote code
    prompt = tok.apply_chat_template([{"role": "user", "content": "cat fox"}], tokenize=False, add_generation_prompt=True)
    assert prompt == "the cat fox . a"
    assert tok.eos_token == "[SEP]" and tok.mask_token_id == len(vocab)
    # the run directory is itself a tokenizer folder with the run's EOS: `tcsm prepare --tokenizer RUN` ends
    # documents as the run's data did
    from tcsm.data.tokenizer_spec import resolve

    assert resolve(str(tmp_path / "sft")).eos_id == vocab.index("[SEP]")


# --------------------------------------------------------------------------------------------------- item 5


def _hf_model(root: Path, name: str, config, auto, tokenizer_dir: Path) -> Path:
    """A tiny random HF model saved with the tokenizer of `tokenizer_dir` (what a downloaded model folder holds)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        auto.from_config(config).save_pretrained(root / name)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (root / name / f).write_bytes((tokenizer_dir / f).read_bytes())
    return root / name


def _hf_args(shards: Path, model_dir: Path, *extra: str) -> list[str]:
    base = [o for o in tiny(*SHARDS, f"data.path={shards}", "train.steps=1", synthetic=False) if not o.startswith("model.")]
    return [*base, "model.name=hf_denoiser", f"model.name_or_path={model_dir}", *extra]


def test_a_padded_causal_lm_needs_no_id_map_and_its_own_mask_token_starts_mask(bert_run, tmp_path):
    """A GPT-2 whose embedding matrix is padded beyond its tokenizer (50,304 rows for 50,257 tokens): before, refused
    for its size unless every id was listed by hand; and [MASK] started at the mean embedding although the
    tokenizer has a mask token."""
    from tcsm.builders.config import load_config
    from tcsm.train import Trainer

    run, vocab = bert_run
    V, shards = len(vocab), run.parent / "shards"
    cfg = tf.GPT2Config(vocab_size=V + 12, n_positions=16, n_embd=32, n_layer=1, n_head=2, bos_token_id=2,
                        eos_token_id=3, architectures=["GPT2LMHeadModel"])  # fmt: skip
    gpt2 = _hf_model(tmp_path, "gpt2", cfg, tf.AutoModelForCausalLM, run.parent / "bert-tok")
    # the model's own mask token starts [MASK] (checked with a hand-written id map too, which old code accepted)
    for extra in ([f"model.token_ids={list(range(V))}"], []):
        model = Trainer.from_config(load_config(overrides=_hf_args(shards, gpt2, *extra)), None, log=lambda s: None).model
        emb = model.hf.get_input_embeddings().weight
        assert torch.equal(model.mask_embed.detach(), emb[vocab.index("[MASK]")].detach())
    assert torch.equal(model.token_ids, torch.arange(V))  # no id map needed
    assert main(["train", "-o", str(tmp_path / "run"), *_hf_args(shards, gpt2)]) == 0
    # its export is a training start too: the architecture is the export's base_model/, the weights its own
    out = tcsm.export(tmp_path / "run", tmp_path / "hf")
    start = [o for o in _hf_args(shards, gpt2) if not o.startswith("model.")] + [f"train.init_from={out}"]
    model = Trainer.from_config(load_config(overrides=start), None, log=lambda s: None).model.eval()
    x, t = torch.randint(0, V + 1, (2, 12)), torch.rand(2)
    with torch.no_grad():
        assert torch.equal(model(x, t), tcsm.from_pretrained(out)(x, t))
    hf = tf.AutoModelForMaskedLM.from_pretrained(str(out), trust_remote_code=True).eval()
    assert hf.generate(num_samples=2, steps=3).shape == (2, 12)  # the adapted model's export generates too


def test_a_permuted_tokenizer_of_the_same_size_is_refused(bert_run, tmp_path, capsys):
    """The data's tokenizer must be the model's by content: the same tokens under other ids were accepted before,
    because only the sizes were compared."""
    run, vocab = bert_run
    V = len(vocab)
    words = vocab[len(SPECIALS):]
    other = _bert_tokenizer(tmp_path, SPECIALS + words[::-1])
    (tmp_path / "c.txt").write_text("\n".join(DOCS), encoding="utf-8")
    prepare([str(tmp_path / "c.txt")], tmp_path / "shards", str(other), doc_separator="\n", progress=False,
            valid_fraction=0.2, test_fraction=0)  # fmt: skip
    cfg = tf.BertConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                        max_position_embeddings=16, architectures=["BertForMaskedLM"])  # fmt: skip
    bert = _hf_model(tmp_path, "bert", cfg, tf.AutoModelForMaskedLM, run.parent / "bert-tok")
    capsys.readouterr()
    assert main(["train", "-o", str(tmp_path / "run"), *_hf_args(tmp_path / "shards", bert)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "another tokenizer than" in err and "tcsm prepare --tokenizer" in err
    # the model's own tokenizer is accepted
    assert main(["train", "-o", str(tmp_path / "ok"), *_hf_args(run.parent / "shards", bert)]) == 0


def test_no_tokenizer_or_model_load_stops_at_a_trust_remote_code_prompt(tmp_path, capsys):
    """An export is a folder with custom code (config.json's auto_map): before, `tcsm prepare --tokenizer DIR` of
    such a folder without tokenizer.json and `model.name=hf_denoiser model.name_or_path=DIR` asked transformers'
    "Do you wish to run the custom code? [y/N]" (waiting 15 s on a terminal); now they are one-line errors."""
    from tcsm.builders.config import load_config
    from tcsm.cli.train import train

    with torch.random.fork_rng(devices=[]):
        train(load_config("synthetic", tiny("train.steps=1", "train.eval_every=0", "sample.num=0")), tmp_path / "run",
              log=lambda s: None)  # fmt: skip
    out = tcsm.export(tmp_path / "run", tmp_path / "hf")
    (out / "tokenizer.json").unlink()  # a tokenizer folder in another format: transformers would convert it
    (tmp_path / "c.txt").write_text("\n".join(DOCS))
    capsys.readouterr()
    assert main(["prepare", str(tmp_path / "c.txt"), "-o", str(tmp_path / "sh"), "--tokenizer", str(out),
                 "--no-progress"]) == 2  # fmt: skip
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    # any model folder with custom code (here the export without its tcsm section) is one line, not a question
    meta = json.loads((out / "config.json").read_text())
    del meta["tcsm"]
    (out / "config.json").write_text(json.dumps(meta))
    argv = ["train", "-o", str(tmp_path / "r2"), *tiny("train.steps=1", "model.name=hf_denoiser", f"model.name_or_path={out}")]
    argv = [a for a in argv if not a.startswith(("model.d_model", "model.n_", "model.cond_dim", "model.max_len"))]
    assert main(argv) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    # and an export named as the pretrained model is pointed to train.init_from
    full = tcsm.export(tmp_path / "run", tmp_path / "hf2")
    argv = [a.replace(str(out), str(full)) for a in argv]
    assert main(argv) == 2
    assert f"train.init_from={full}" in capsys.readouterr().err


def test_an_export_transformers_cannot_load_says_so_when_written(tmp_path, capsys):
    """An LM (an AR / MLM teacher) has no Hugging Face modeling code: before, its export was written
    with a transformers card and nothing said that AutoModel would fail on it."""
    keys = [o for o in tiny("train.steps=1", "train.eval_every=0", "sample.num=0")
            if not o.startswith(("model.cond_dim", "eval.num_t"))]  # fmt: skip
    assert main(["train", "-o", str(tmp_path / "run"), "model.name=causal", "model.preset=tiny",
                 "objective.name=lm", *keys]) == 0  # fmt: skip
    capsys.readouterr()
    tcsm.export(tmp_path / "run", tmp_path / "hf")
    notes = capsys.readouterr().err.strip().splitlines()
    assert len(notes) == 1 and "transformers cannot load this export" in notes[0]
    notes = []
    tcsm.export(tmp_path / "run", tmp_path / "hf", overwrite=True, log=notes.append)  # or to the caller's logger
    assert len(notes) == 1 and not capsys.readouterr().err


def test_init_from_an_export_or_run_takes_its_architecture(tmp_path):
    """Before: the model was built from the preset (the synthetic one: 64 wide, no time conditioning) and the
    time-conditioned export's weights were refused unless every model key was repeated by hand."""
    from tcsm.builders.config import load_config
    from tcsm.builders.loading import load_checkpoint
    from tcsm.cli.train import train
    from tcsm.train import Trainer

    with torch.random.fork_rng(devices=[]):
        train(load_config("synthetic", tiny("train.steps=1", "train.eval_every=0", "sample.num=0",
                                            "model.time_conditioning=true")), tmp_path / "run", log=lambda s: None)  # fmt: skip
    out = tcsm.export(tmp_path / "run", tmp_path / "hf")
    want = load_checkpoint(tmp_path / "run").model
    g = torch.Generator().manual_seed(0)
    xt, t = torch.randint(0, 9, (2, 16), generator=g), torch.rand(2, generator=g)
    no_model_keys = [o for o in tiny("train.steps=1") if not o.startswith("model.")]
    for source in (out, tmp_path / "run"):
        cfg = load_config("synthetic", [*no_model_keys, f"train.init_from={source}"])
        assert cfg.model.time_conditioning is True and cfg.model.d_model == 32
        model = Trainer.from_config(cfg, None, log=lambda s: None).model.eval()
        with torch.no_grad():
            assert torch.equal(model(xt, t), want(xt, t))
    # a model key given on the command line still wins (and a wrong one is named when the weights are loaded)
    cfg = load_config("synthetic", [*no_model_keys, f"train.init_from={out}", "model.dropout=0.1"])
    assert cfg.model.dropout == 0.1 and cfg.model.time_conditioning is True


def test_the_exported_model_generates_with_the_runs_sampler_and_stops_at_eos(bert_run, tmp_path):
    """Before: the exported class had no generate(); a transformers user had to write a diffusion sampler."""
    run, vocab = bert_run
    V, eos = len(vocab), vocab.index("[SEP]")
    out = tcsm.export(run, tmp_path / "hf")
    meta = json.loads((out / "config.json").read_text())
    assert meta["eos_token_id"] == eos and meta["sampling"]["steps"] == 4  # tiny runs sample in 4 steps
    model = tf.AutoModelForMaskedLM.from_pretrained(str(out), trust_remote_code=True).eval()
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    g = torch.Generator().manual_seed(0)
    x = model.generate(num_samples=3, generator=g)
    assert x.shape == (3, 12) and int(x.max()) < V and len(calls) <= 4  # the run's length and steps
    pad = meta["pad_token_id"]
    assert pad == vocab.index("[PAD]")
    for row in x.tolist():  # after the first end of text, only padding
        if eos in row:
            assert set(row[row.index(eos) + 1 :]) <= {pad}
    prompt = torch.tensor([[vocab.index("the"), vocab.index("cat")]] * 2)
    y = model.generate(prompt, max_new_tokens=6, steps=6, method="confidence", generator=g)
    assert y.shape == (2, 8) and torch.equal(y[:, :2], prompt)
    # a model that always says end of text: decoding stops once every row's end is revealed, long before K steps
    with torch.no_grad():
        model.head.bias[eos] += 60.0
    calls.clear()
    z = model.generate(num_samples=2, steps=32, generator=torch.Generator().manual_seed(1))
    assert (z[:, 0] == eos).all() and (z[:, 1:] == pad).all() and len(calls) < 32, len(calls)


def test_samples_do_not_print_special_tokens_as_text(bert_run, capsys):
    """Before: `tcsm sample` printed "[SEP]", "[PAD]", "[CLS]" (and GPT-2's "<|endoftext|>") inside the text."""
    run, vocab = bert_run
    capsys.readouterr()
    assert main(["sample", str(run), "-n", "4", "--steps", "4", "--seed", "0", "--format", "jsonl"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    specials = {vocab.index(s) for s in SPECIALS}
    assert any(specials & set(r["tokens"]) for r in rows)  # the samples hold special tokens ...
    assert not any(s in r["text"] for r in rows for s in SPECIALS)  # ... which the text does not show
    words = [w for r in rows for w in r["text"].split()]
    assert words and {w.strip(".") for w in words} - {""} <= set(vocab)  # WordPiece joins "." to its word
