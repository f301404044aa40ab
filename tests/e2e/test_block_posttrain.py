"""Post-training a block-diffusion model (MATH.md §9) through the same recipes as any denoiser: reward fine-tuning
(N^1 and N^full, on-policy through the cached block sampler) and SFT, on a tiny block run trained here."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import restore_torch_threads, tiny  # noqa: F401

from tcsm.builders.loading import load_checkpoint
from tcsm.cli import main
from tcsm.models.kinds import kind_of

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = " ".join(["the old man sang a song.", "a good day, said the cat.", "she was happy."] * 60)
QUIET = ("train.device=cpu", "train.threads=1", "train.progress=false", "train.tensorboard=false",
         "train.eval_every=0", "train.sample_every=0", "sample.num=0", "sample.steps=2")  # fmt: skip


@pytest.fixture(scope="module")
def block_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("blocks")
    (root / "book.txt").write_text(TEXT)
    argv = ["train", "-o", str(root / "run"), *tiny("data.kind=text", f"data.path={root / 'book.txt'}",
            "data.seq_len=24", "model.max_len=24", "path.block_length=8", "train.steps=2", *QUIET, synthetic=False)]  # fmt: skip
    torch.manual_seed(0)
    assert main(argv) == 0
    return root


def _is_block_run(run) -> bool:
    ckpt = load_checkpoint(run)
    return kind_of(ckpt.model).blocks and ckpt.build_path().block_length == 8


@pytest.mark.parametrize("extra", [["--neighbourhood", "n1"], ["--neighbourhood", "full", "-B", "2"],
                                   ["--neighbourhood", "n1", "--xt-source", "model"]])  # fmt: skip
def test_reward_finetuning_runs_on_a_block_model(block_run, tmp_path, capsys, monkeypatch, extra):
    (tmp_path / "block_reward.py").write_text("def spaces(x):\n    return (x == 0).float().sum(-1)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "ft"
    rc = main(["finetune", "reward", "--from", str(block_run / "run"), "--reward", "python:block_reward:spaces", *extra,
               "--steps", "2", "--eval-samples", "2", "-o", str(out), "train.batch_size=4", *QUIET])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    assert json.loads((out / "reward_eval.json").read_text())["num_samples"] == 2
    assert _is_block_run(out)


def test_sft_runs_on_a_block_model(block_run, tmp_path, capsys):
    records = [{"prompt": "the old man", "completion": " sang a song."}, {"prompt": "she was", "completion": " happy."}]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records * 8))
    out = tmp_path / "sft"
    rc = main(["finetune", "sft", "--from", str(block_run / "run"), "--data", str(tmp_path / "sft.jsonl"),
               "--steps", "2", "-o", str(out), "data.pad=.", "data.valid_frac=0.25", "train.batch_size=4", *QUIET])  # fmt: skip
    assert rc == 0, capsys.readouterr().err
    assert _is_block_run(out)
