"""A denoiser started from a pretrained Hugging Face model (`model.name=hf_denoiser`), on tiny random BERT / GPT-2 /
Llama models built offline: at step 0 it is the pretrained model (the masked LM exactly; the causal LM exactly when
its attention stays causal, which checks the AR shift), time conditioning starts as a no-op, a causal LM's attention
becomes bidirectional, and such a model trains with a TCSM objective, post-trains (DRE strategy i) and exports."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from train_helpers import restore_torch_threads, tiny  # noqa: F401

import tcsm
from tcsm.builders.config import load_config
from tcsm.builders.loading import load_checkpoint
from tcsm.cli import main
from tcsm.cli.train import train
from tcsm.models.hf import HFCausalLM, HFMaskedLM
from tcsm.models.hf_denoiser import HFDenoiser

tf = pytest.importorskip("transformers")

HF_VOCAB, MASK, BOS = 40, 3, 1
TOKEN_IDS = list(range(10, 18))  # the synthetic data's 8 tokens as HF ids


def _bert():
    return tf.BertConfig(vocab_size=HF_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, max_position_embeddings=40, architectures=["BertForMaskedLM"])  # fmt: skip


def _gpt2():
    return tf.GPT2Config(vocab_size=HF_VOCAB, n_positions=40, n_embd=32, n_layer=2, n_head=2, bos_token_id=BOS,
                         eos_token_id=2, architectures=["GPT2LMHeadModel"])  # fmt: skip


def _llama():
    return tf.LlamaConfig(vocab_size=HF_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=40, bos_token_id=BOS,
                          eos_token_id=2, architectures=["LlamaForCausalLM"])  # fmt: skip


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    out = {}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for name, cfg, auto in (("bert", _bert(), tf.AutoModelForMaskedLM), ("gpt2", _gpt2(), tf.AutoModelForCausalLM),
                                ("llama", _llama(), tf.AutoModelForCausalLM)):  # fmt: skip
            auto.from_config(cfg).save_pretrained(root / name)
            out[name] = root / name
    return out


def _xt(V=8, masked=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V + int(masked), (3, 12), generator=g)
    return x, torch.rand(3, generator=g)


@pytest.mark.parametrize("timed", [False, True])
def test_mlm_denoiser_is_the_pretrained_mlm_at_step_0(hf_dirs, timed):
    hf = tf.AutoModelForMaskedLM.from_pretrained(hf_dirs["bert"]).eval()
    den = HFDenoiser(hf, TOKEN_IDS, kind="mlm", num_states=9, special_token_id=MASK, time_conditioning=timed).eval()
    ref = HFMaskedLM(hf, TOKEN_IDS, MASK)
    xt, t = _xt()
    with torch.no_grad():
        assert torch.equal(den(xt, t), ref(xt))


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_causal_denoiser_keeps_the_ar_model_and_then_sees_both_ways(hf_dirs, arch):
    hf = tf.AutoModelForCausalLM.from_pretrained(hf_dirs[arch]).eval()
    x, t = _xt(masked=False)
    with torch.no_grad():
        ar = HFCausalLM(hf, TOKEN_IDS, BOS)(x)
        # attention kept causal: logits at j are the AR model's p(x^j | x^{<j}), i.e. the shift is right
        keep = HFDenoiser(hf, TOKEN_IDS, kind="causal", num_states=9, bidirectional=False).eval()
        torch.testing.assert_close(keep(x), ar, atol=1e-5, rtol=0)
        both = HFDenoiser(hf, TOKEN_IDS, kind="causal", num_states=9, time_conditioning=True).eval()
        y = x.clone()
        y[:, -1] = (y[:, -1] + 1) % 8
        assert (both(x, t)[:, 0] - both(y, t)[:, 0]).abs().max() > 1e-6  # position 0 now sees the last token
        plain = HFDenoiser(hf, TOKEN_IDS, kind="causal", num_states=9).eval()
        assert torch.equal(both(x, t), plain(x))  # the zero-initialised time path is a no-op at step 0


def _hf_run(hf_dir, *extra):
    base = [o for o in tiny("data.seq_len=12") if not o.startswith("model.")]
    return [*base, "model.name=hf_denoiser", f"model.name_or_path={hf_dir}", f"model.token_ids={TOKEN_IDS}", *extra]


def test_pretrained_denoiser_trains_post_trains_and_exports(hf_dirs, tmp_path):
    gpt2 = shutil.copytree(hf_dirs["gpt2"], tmp_path / "gpt2")
    with torch.random.fork_rng(devices=[]):
        cfg = load_config("synthetic", _hf_run(gpt2, "model.time_conditioning=true", "train.steps=4",
                                               "train.eval_every=4", "sample.num=0"))  # fmt: skip
        train(cfg, tmp_path / "run", log=lambda s: None)
    rows = [json.loads(r) for r in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(r.get("kind") == "valid" for r in rows)
    loaded = load_checkpoint(tmp_path / "run").model
    pretrained = tf.AutoModelForCausalLM.from_pretrained(gpt2).state_dict()
    moved = loaded.hf.state_dict()
    assert any(not torch.equal(moved[k], pretrained[k]) for k in pretrained if k in moved)
    # post-training: DRE strategy (i) from the run
    rc = main(["finetune", "dre", "--from", str(tmp_path / "run"), "-o", str(tmp_path / "dre"), "--strategy", "i",
               "--loss", "bce", "--steps", "2", "--eval-examples", "4", "train.progress=false", "train.tensorboard=false",
               "train.batch_size=8", "train.device=cpu", "train.threads=1", "eval.num_t=2", "sample.num=0"])  # fmt: skip
    assert rc == 0
    # export: tcsm.from_pretrained is exact, the training start too
    out = tcsm.export(tmp_path / "dre", tmp_path / "hf")
    want = load_checkpoint(tmp_path / "dre").model
    x, t = _xt()
    assert (out / "base_model" / "config.json").is_file()
    with torch.no_grad():
        want_logits = want(x, t)
        shutil.rmtree(gpt2)  # the export carries the architecture it needs
        assert torch.equal(tcsm.from_pretrained(out)(x, t), want_logits)
        hf = tf.AutoModelForMaskedLM.from_pretrained(str(out), trust_remote_code=True).eval()
        torch.testing.assert_close(hf(input_ids=x, timesteps=t).logits, want_logits, atol=1e-5, rtol=0)


def test_a_causal_lm_with_another_vocabulary_is_one_line(hf_dirs, tmp_path, capsys):
    argv = ["train", "--config", "synthetic", "-o", str(tmp_path / "r"), "model.name=hf_denoiser",
            f"model.name_or_path={hf_dirs['llama']}", *_hf_run(hf_dirs["llama"], "train.steps=1")[:-3]]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "has a vocabulary of 40 tokens but the data has 8" in err
