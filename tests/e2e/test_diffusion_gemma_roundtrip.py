"""A DiffusionGemma directory through tcsm and out again: `tcsm train model.name=diffusion_gemma` on the uniform block
path (its canvas is the path's block), `tcsm export`, and transformers' own `DiffusionGemmaForBlockDiffusion` loading
the export without tcsm's code or remote code, with tcsm's logits and a running `generate()`; one-line errors for what
does not fit."""

from __future__ import annotations

import json

import pytest
import torch
from diffusion_gemma_helpers import tiny_hf
from train_helpers import restore_torch_threads  # noqa: F401

import tcsm
from tcsm.cli import main

tf = pytest.importorskip("transformers")
if not hasattr(tf, "DiffusionGemmaForBlockDiffusion"):
    pytest.skip("this transformers has no DiffusionGemma", allow_module_level=True)

V, K, L = 8, 4, 16
RUN = ["data.kind=synthetic", f"data.vocab_size={V}", f"data.seq_len={L}", "data.num_train=64", "data.num_valid=16",
       "data.num_test=16", "train.batch_size=4", "train.device=cpu", "train.precision=fp32", "train.eval_every=2",
       "train.eval_examples=4", "train.sample_every=0", "sample.num=0", "train.save_every=2", "train.steps=2",
       "path.source=uniform", "model.name=diffusion_gemma"]  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("dg") / "model"
    tiny_hf(V=V, k=K, window=3).save_pretrained(d)
    return d


def test_train_export_and_transformers_loads_it_as_its_own(model_dir, tmp_path):
    run, out = tmp_path / "run", tmp_path / "export"
    assert main(["train", "-o", str(run), *RUN, f"path.block_length={K}", f"model.name_or_path={model_dir}"]) == 0
    assert main(["export", str(run), "-o", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "diffusion_gemma" and "auto_map" not in config
    hf = tf.DiffusionGemmaForBlockDiffusion.from_pretrained(out, trust_remote_code=False).eval()
    ours, again = tcsm.from_pretrained(run), tcsm.from_pretrained(out)
    g = torch.Generator().manual_seed(0)
    x1, xt = torch.randint(0, V, (2, L), generator=g), torch.randint(0, V, (2, L), generator=g)
    with torch.no_grad():
        logits = ours(xt, None, x1=x1)
        torch.testing.assert_close(again(xt, None, x1=x1), logits, atol=0, rtol=0)
        for b in range(1, L // K):
            own = hf(input_ids=x1[:, : b * K], decoder_input_ids=xt[:, b * K : (b + 1) * K]).logits
            torch.testing.assert_close(own, logits[:, b * K : (b + 1) * K], atol=1e-5, rtol=0)
        seqs = hf.generate(x1[:, :K], max_new_tokens=2 * K, max_denoising_steps=3).sequences
    assert seqs.shape == (2, 3 * K) and torch.equal(seqs[:, :K], x1[:, :K])
    # tcsm sample on the export with the model's own sampler
    assert main(["sample", str(out), "--method", "native", "--steps", "2", "-n", "2", "--format", "jsonl",
                 "-o", str(tmp_path / "s.jsonl"), "--no-progress"]) == 0  # fmt: skip
    rows = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(len(r["tokens"]) == L and r["method"] == "native" for r in rows)


def test_the_models_own_directory_loads_and_samples_as_it_is(model_dir, tmp_path):
    """tcsm.from_pretrained / tcsm sample read a DiffusionGemma directory as transformers wrote it: its own weights
    (logits of the model's own forward), its canvas as the block."""
    model = tcsm.from_pretrained(model_dir)
    hf = tf.DiffusionGemmaForBlockDiffusion.from_pretrained(model_dir).eval()
    g = torch.Generator().manual_seed(1)
    x1, xt = torch.randint(0, V, (2, 2 * K), generator=g), torch.randint(0, V, (2, 2 * K), generator=g)
    with torch.no_grad():
        own = hf(input_ids=x1[:, :K], decoder_input_ids=xt[:, K:]).logits
        torch.testing.assert_close(model(xt, None, x1=x1)[:, K:], own, atol=1e-5, rtol=0)
    assert model.block_length == K
    out = tmp_path / "s.jsonl"
    assert main(["sample", str(model_dir), "--method", "native", "--steps", "2", "-n", "3", "--length", str(3 * K),
                 "--format", "jsonl", "-o", str(out), "--no-progress"]) == 0  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(len(r["tokens"]) == 3 * K and r["step"] == 0 for r in rows)


@pytest.mark.parametrize(
    "extra,message",
    [
        ([], f"set path.block_length={K}"),
        (["path.block_length=2"], f"path.block_length=2 but the DiffusionGemma model's canvas_length is {K}"),
        ([f"path.block_length={K}", "data.vocab_size=6"], f"vocabulary of {V} tokens but the data has 6"),
        ([f"path.block_length={K}", "path.source=masked"], "uniform-source model"),
    ],
)
def test_one_line_errors(model_dir, tmp_path, capsys, extra, message):
    assert main(["train", "-o", str(tmp_path / "run"), *RUN, f"model.name_or_path={model_dir}", *extra]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and len(err) == 1


def test_a_directory_of_another_model_is_named(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    assert main(["train", "-o", str(tmp_path / "run"), *RUN, f"path.block_length={K}",
                 f"model.name_or_path={tmp_path / 'm'}"]) != 0  # fmt: skip
    assert "'bert' model, not a DiffusionGemma checkpoint" in capsys.readouterr().err
