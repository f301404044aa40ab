"""A block diffusion run started from a local causal LM: `tcsm train model.name=hf_denoiser path.block_length=4`
trains the block denoiser, its checkpoint comes back as that block model (also from the LM's config alone),
`tcsm eval` gives its per-block bound, `tcsm sample` decodes it block by block with its KV cache (prompts pinned,
stopped at EOS), and `tcsm export` writes it for tcsm.from_pretrained
and for transformers (its modeling code runs the same two-stream pass; generate() decodes its blocks)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from train_helpers import restore_torch_threads, tiny  # noqa: F401

import tcsm
from tcsm.builders.loading import load_checkpoint
from tcsm.cli import main
from tcsm.models.hf_block import HFBlockDenoiser

tf = pytest.importorskip("transformers")

TOKEN_IDS = list(range(10, 18))  # the synthetic data's 8 tokens as HF ids


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfblock")
    cfg = tf.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, max_position_embeddings=40, bos_token_id=1, eos_token_id=2)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        tf.AutoModelForCausalLM.from_config(cfg).save_pretrained(root / "llama")
    shutil.copytree(root / "llama", root / "lm")  # kept whole (the first test removes the run's LM weights)
    base = [o for o in tiny("train.steps=3", "train.eval_every=3", "sample.num=0") if not o.startswith("model.")]
    argv = ["train", "--config", "synthetic", "-o", str(root / "run"), *base, "model.name=hf_denoiser",
            f"model.name_or_path={root / 'llama'}", f"model.token_ids={TOKEN_IDS}", "path.block_length=4"]  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        assert main(argv) == 0
        timed = ["path.source=uniform", "model.time_conditioning=true", "model.cond_dim=16"]
        assert main([*argv[:4], str(root / "uniform"), *argv[5:], *timed]) == 0
    return root


def test_the_checkpoint_is_the_block_model_and_moved_from_the_pretrained_one(run):
    model = load_checkpoint(run / "run").model
    assert isinstance(model, HFBlockDenoiser) and model.block_length == 4
    pretrained = tf.AutoModelForCausalLM.from_pretrained(run / "llama").state_dict()
    assert any(not torch.equal(model.hf.state_dict()[k], v) for k, v in pretrained.items())
    g = torch.Generator().manual_seed(0)
    x1 = torch.randint(0, 8, (2, 16), generator=g)
    xt = torch.where(torch.rand(2, 16, generator=g) < 0.5, 8, x1)
    with torch.no_grad():
        want = model(xt, None, x1=x1)
        (run / "llama" / "model.safetensors").unlink()  # the checkpoint holds every weight: the config suffices
        again = load_checkpoint(run / "run").model
        assert torch.equal(again(xt, None, x1=x1), want)


def test_eval_gives_the_per_block_bound(run, capsys):
    capsys.readouterr()
    assert main(["eval", str(run / "run"), "--json", "--num-t", "2", "--max-examples", "8", "--device", "cpu"]) == 0
    got = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert got["block_length"] == 4 and len(got["block_bpc"]) == 4  # bits per token of each of the 4 blocks
    assert abs(sum(got["block_bpc"]) / 4 - got["bpc"]) < 1e-4  # the bound is the sum of the blocks' bounds


def test_sample_decodes_block_by_block_with_prompts_and_eos(run, tmp_path):
    out = tmp_path / "s.jsonl"
    assert main(["sample", str(run / "run"), "-n", "4", "--steps", "2", "--seed", "1", "--format", "jsonl",
                 "--method", "confidence", "--prompt", "ab", "--max-new-tokens", "10", "--eos", "3", "-o", str(out),
                 "--no-progress"]) == 0  # fmt: skip
    rows = [json.loads(r) for r in out.read_text().splitlines()]
    assert len(rows) == 4
    for r in rows:
        assert r["method"] == "blocks+confidence" and r["block_length"] == 4  # the cached block sampler
        assert r["tokens"][:2] == [0, 1] and r["length"] <= 12 and all(0 <= y < 8 for y in r["tokens"])
        new = r["tokens"][2:]
        if 3 in new:  # stopped at its end of sequence: nothing but EOS after the first one
            assert set(new[new.index(3) :]) == {3}


@pytest.mark.parametrize("name", ["run", "uniform"])
def test_export_from_pretrained_and_transformers_give_the_runs_logits(run, tmp_path, name):
    """The masked run, and a uniform one with per-block time conditioning (its time path has moved from zero)."""
    model = load_checkpoint(run / name).model
    g = torch.Generator().manual_seed(2)
    x1 = torch.randint(0, 8, (3, 16), generator=g)
    xt = torch.where(torch.rand(3, 16, generator=g) < 0.5, model.num_states - 1, x1)
    t = torch.rand(3, 4, generator=g).repeat_interleave(4, 1)
    with torch.no_grad():
        want = model(xt, t, x1=x1)
        out = tcsm.export(run / name, tmp_path / "hf")
        assert json.loads((out / "config.json").read_text())["denoiser"]["block_length"] == 4
        back = tcsm.from_pretrained(out)
        assert isinstance(back, HFBlockDenoiser) and torch.equal(back(xt, t, x1=x1), want)
        hf = tf.AutoModelForMaskedLM.from_pretrained(str(out), trust_remote_code=True).eval()
        torch.testing.assert_close(hf(input_ids=xt, timesteps=t, clean_ids=x1).logits, want, atol=1e-5, rtol=0)
        with pytest.raises(ValueError, match="needs the clean sequence"):
            hf(input_ids=xt, timesteps=t)
        if name == "uniform":
            assert model.time_proj.weight.abs().max() > 0
            return
        prompt = x1[:2, :5]
        drawn = hf.generate(input_ids=prompt, max_new_tokens=11, steps=2, generator=torch.Generator().manual_seed(0))
        assert drawn.shape == (2, 16) and torch.equal(drawn[:, :5], prompt) and ((drawn >= 0) & (drawn < 8)).all()


def test_a_uniform_path_without_time_input_is_one_line(run, tmp_path, capsys):
    capsys.readouterr()
    base = [o for o in tiny("train.steps=1", "sample.num=0") if not o.startswith("model.")]
    argv = ["train", "--config", "synthetic", "-o", str(tmp_path / "r"), *base, "model.name=hf_denoiser",
            f"model.name_or_path={run / 'lm'}", f"model.token_ids={TOKEN_IDS}", "path.block_length=4",
            "path.source=uniform"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "set model.time_conditioning=true" in err
