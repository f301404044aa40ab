"""The end-of-run samples of `tcsm finetune rl` and `tcsm finetune reward` on a task run are completions of
held-out prompts (the test split's), never of training prompts nor unconditional draws."""

from __future__ import annotations

import json

import pytest
import torch
from train_helpers import restore_torch_threads, train_addition_run  # noqa: F401

from tcsm.builders.loading import load_checkpoint
from tcsm.cli import main
from tcsm.data.prompted import held_out_prompts

pytestmark = pytest.mark.usefixtures("one_thread")

QUIET = ["--steps", "1", "train.batch_size=2", "train.device=cpu", "train.threads=1", "train.progress=false",
         "train.tensorboard=false", "sample.steps=2", "sample.num=3"]  # fmt: skip


@pytest.fixture(scope="module")
def addition_run(tmp_path_factory):
    return train_addition_run(tmp_path_factory.mktemp("addition") / "add")


def _prompts(data, split: str) -> set[str]:
    batch = data.split(split).to_batch()
    return {data.decode(row[m]) for row, m in zip(batch.x1.long(), batch.cond_mask)}


def test_held_out_prompts_pin_the_test_rows_prompts(addition_run):
    data = load_checkpoint(addition_run).build_data()
    fixed, values = held_out_prompts(data, 10, data.seq_len)  # more samples than test rows: cycled
    batch = data.split("test").to_batch()
    assert torch.equal(fixed[:8], batch.cond_mask.bool()) and torch.equal(fixed[8:], fixed[:2])
    assert torch.equal(values[:8][fixed[:8]], batch.x1.long()[fixed[:8]])
    assert held_out_prompts(data, 3, data.seq_len + 1) is None  # another length: nothing to pin


@pytest.mark.parametrize("recipe", ["rl", "reward"])
def test_end_of_run_samples_complete_held_out_prompts(addition_run, tmp_path, recipe):
    extra = ["-G", "2", "--eval-prompts", "0"] if recipe == "rl" else ["-B", "2", "--eval-samples", "0",
                                                                      "target.sample_steps=2"]  # fmt: skip
    out = tmp_path / recipe
    assert main(["finetune", recipe, "--from", str(addition_run), "--reward", "task:addition", "-o", str(out),
                 *extra, *QUIET]) == 0  # fmt: skip
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    texts = rows[-1]["samples"]
    data = load_checkpoint(addition_run).build_data()
    held_out, train = _prompts(data, "test"), _prompts(data, "train")
    prompt_len = len(next(iter(held_out)))
    assert len(texts) == 3 and all(t[:prompt_len] in held_out for t in texts), texts
    assert not any(t[:prompt_len] in train - held_out for t in texts)
