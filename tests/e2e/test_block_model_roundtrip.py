"""A block diffusion run leaves and comes back: trained on a block path, its checkpoint rebuilds the block model
(block_length from the run's path), `tcsm export` + `from_pretrained` give its logits bit for bit, transformers with
the exported modeling code gives them within 1e-5 (fp32) and its generate() decodes block by block; a full-sequence
run's weights start a block run (`train.init_from`); a path that does not match the model is refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import restore_torch_threads, tiny  # noqa: F401

import tcsm
from tcsm.builders.config import load_config
from tcsm.builders.loading import load_checkpoint
from tcsm.cli.train import train
from tcsm.core.errors import CheckpointError
from tcsm.models.blocks import BlockDenoiser
from tcsm.train import Trainer

RUNS = {
    "masked": ("path.source=masked", "model.time_conditioning=false"),
    "uniform_timed": ("path.source=uniform", "model.time_conditioning=true"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("blocks")
    out = {}
    with torch.random.fork_rng(devices=[]):
        for name, extra in RUNS.items():
            cfg = load_config("synthetic", tiny("train.steps=4", "train.eval_every=4", "sample.num=0",
                                                "path.block_length=4", *extra))  # fmt: skip
            train(cfg, root / name, log=lambda s: None)
            out[name] = root / name
        cfg = load_config("synthetic", tiny("train.steps=2", "train.eval_every=2", "sample.num=0"))
        train(cfg, root / "full", log=lambda s: None)
        out["full"] = root / "full"
    return out


def _inputs(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    V, S = model.cfg.vocab_size, model.cfg.num_states
    x1 = torch.randint(0, V, (3, 16), generator=g)
    return torch.randint(0, S, (3, 16), generator=g), torch.rand(3, 4, generator=g).repeat_interleave(4, 1), x1


@pytest.mark.parametrize("name", list(RUNS))
def test_checkpoint_export_and_transformers_give_the_runs_logits(runs, tmp_path, name):
    ck = load_checkpoint(runs[name])
    model = ck.model
    assert isinstance(model, BlockDenoiser) and model.block_length == 4 and ck.config.path.block_length == 4
    xt, t, x1 = _inputs(model)
    with torch.no_grad():
        want = model(xt, t, x1=x1)
        out = tcsm.export(runs[name], tmp_path / "hf")
        meta = json.loads((out / "config.json").read_text())
        assert meta["denoiser"]["block_length"] == 4
        assert "clean_ids=x_1" in (out / "README.md").read_text()
        back = tcsm.from_pretrained(out)
        assert isinstance(back, BlockDenoiser) and torch.equal(back(xt, t, x1=x1), want)
        transformers = pytest.importorskip("transformers")
        hf = transformers.AutoModelForMaskedLM.from_pretrained(str(out), trust_remote_code=True).eval()
        torch.testing.assert_close(hf(input_ids=xt, timesteps=t, clean_ids=x1).logits, want, atol=1e-5, rtol=0)
        with pytest.raises(ValueError, match="needs the clean sequence"):
            hf(input_ids=xt, timesteps=t)
        if name == "masked":
            g = torch.Generator().manual_seed(0)
            prompt = torch.randint(0, model.cfg.vocab_size, (2, 5), generator=g)
            drawn = hf.generate(input_ids=prompt, max_new_tokens=9, steps=4, generator=g)
            assert drawn.shape == (2, 16) and torch.equal(drawn[:, :5], prompt)
            assert ((drawn >= 0) & (drawn < model.cfg.vocab_size)).all()


def test_a_full_sequence_run_starts_a_block_run(runs):
    full = load_checkpoint(runs["full"]).model
    cfg = load_config("synthetic", tiny("train.steps=1", "path.block_length=16", f"train.init_from={runs['full']}"))
    trainer = Trainer.from_config(cfg, None, log=lambda s: None)
    model = trainer.model.eval()
    assert isinstance(model, BlockDenoiser)
    xt, t, x1 = _inputs(full)
    with torch.no_grad():  # one block of L: the full-sequence denoiser itself
        torch.testing.assert_close(model(xt, t[:, 0], x1=x1), full(xt, t[:, 0]), atol=1e-5, rtol=0)


def test_a_path_that_does_not_fit_the_model_is_refused(runs):
    with pytest.raises(CheckpointError, match="path.block_length is 4 in the checkpoint but None"):
        load_checkpoint(runs["masked"], overrides=["path.block_length=null"])
    with pytest.raises(CheckpointError, match="path.block_length is None in the checkpoint but 8"):
        load_checkpoint(runs["full"], overrides=["path.block_length=8"])


def test_a_frozen_denoiser_needs_the_runs_block_length(runs):
    from types import SimpleNamespace

    from tcsm.builders.frozen import load_frozen
    from tcsm.paths import make_path

    V = int(load_checkpoint(runs["masked"]).data_info["vocab_size"])
    for run, k, theirs in (("masked", None, "block_length=4"), ("full", 4, "full-sequence"), ("masked", 8, "block_length=4")):
        ctx = SimpleNamespace(device="cpu", vocab_size=V, seq_len=16, data=None, path=make_path("masked", V, block_length=k))
        with pytest.raises(CheckpointError, match=f"is a {theirs} denoiser"):
            load_frozen(runs[run], ctx, role="reference.path")
    ctx = SimpleNamespace(device="cpu", vocab_size=V, seq_len=16, data=None, path=make_path("masked", V, block_length=4))
    assert isinstance(load_frozen(runs["masked"], ctx, role="reference.path").model, BlockDenoiser)
