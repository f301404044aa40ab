"""A Hugging Face dLLM directory as a run's source: the paths a run stores are absolute, so the run works from any
directory."""

from __future__ import annotations

import pytest
import torch
from diffusion_gemma_helpers import WORDS, write_dgemma_dir
from train_helpers import restore_torch_threads  # noqa: F401

from tcsm.cli import main

tf = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
if not hasattr(tf, "DiffusionGemmaForBlockDiffusion"):
    pytest.skip("this transformers has no DiffusionGemma", allow_module_level=True)

QUIET = ["train.device=cpu", "train.threads=1", "train.progress=false", "train.tensorboard=false",
         "train.eval_every=0", "train.sample_every=0", "sample.num=0", "train.batch_size=4"]  # fmt: skip


def test_a_run_made_with_relative_paths_samples_from_any_directory(tmp_path, monkeypatch, capsys):
    write_dgemma_dir(tmp_path / "dgemma")
    stories = [" ".join(WORDS[(i * 5 + j * 3) % len(WORDS)] for j in range(5 + i % 6)) for i in range(40)]
    (tmp_path / "stories.txt").write_text("\n".join(stories))
    monkeypatch.chdir(tmp_path)
    assert main(["prepare", "stories.txt", "-o", "dg-shards", "--tokenizer", "dgemma/tokenizer.json",
                 "--doc-separator", "\\n", "--val-fraction", "0.2", "--test-fraction", "0"]) == 0  # fmt: skip
    assert main(["train", "-o", "runs/dgemma", "model.name=diffusion_gemma", "model.name_or_path=dgemma",
                 "path.source=uniform", "path.block_length=4", "data.kind=shards", "data.path=dg-shards",
                 "data.seq_len=8", "train.steps=0", *QUIET]) == 0  # fmt: skip
    capsys.readouterr()
    monkeypatch.chdir("/")
    with torch.random.fork_rng(devices=[]):
        code = main(["sample", str(tmp_path / "runs" / "dgemma"), "-n", "1", "--steps", "2", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    saved = (tmp_path / "runs" / "dgemma" / "config.yaml").read_text()
    assert f"name_or_path: {tmp_path / 'dgemma'}" in saved
