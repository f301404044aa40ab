"""A new sampler and a new RL estimator are each one class plus its registration through the public registry
(`tcsm.sampling.registry.register_sampler`, `tcsm.posttrain.rl.estimators.ESTIMATORS.register`): their settings
become `tcsm sample` flags and `objective:` keys by themselves, and the command line runs them (DESIGN.md "Where a new
part goes")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from train_helpers import restore_torch_threads, tiny  # noqa: F401

from tcsm.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

PLUGIN = textwrap.dedent('''
    from dataclasses import dataclass, field

    import torch

    from tcsm.sampling.common import CallCount
    from tcsm.sampling.registry import Sampler, SamplerSettings, register_sampler


    @dataclass(frozen=True)
    class FillSettings(SamplerSettings):
        fill_token: int = field(default=0, metadata={"help": "the token every free position gets"})


    @register_sampler
    class Fill(Sampler):
        name = "fill"
        help = "every free position set to one token"
        settings_type = FillSettings

        def __call__(self, model, path, num, length, *, fixed=None, values=None, device=None, **kw):
            x = torch.full((num, length), self.settings.fill_token, dtype=torch.long, device=device)
            return (x if fixed is None else torch.where(fixed, values, x)), CallCount("fill", 0)


    from tcsm.posttrain.rl.estimators import ESTIMATORS, OneStepEstimate


    @dataclass(frozen=True)
    class ScaledSettings:
        prompt_mask_prob: float = field(default=0.15, metadata={"help": "prompt tokens masked"})
        scale: float = field(default=0.5, metadata={"help": "factor of the one-step estimate"})


    @ESTIMATORS.register
    class ScaledOneStep(OneStepEstimate):
        name = "scaled_one_step"
        help = "d1's estimate, scaled"
        settings_type = ScaledSettings

        def __init__(self, path, prompt_mask_prob=0.15, scale=0.5):
            super().__init__(path, prompt_mask_prob)
            self.scale = float(scale)

        def __call__(self, *args, **kwargs):
            with open("scaled_one_step.calls", "a") as f:  # the test reads that the run called it
                f.write("1")
            return self.scale * super().__call__(*args, **kwargs)
''')


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    root = tmp_path_factory.mktemp("parts")
    (root / "toy_parts.py").write_text(PLUGIN)
    (root / "toy_rewards.py").write_text("def last_even(x):\n    return (x[:, -1] % 2 == 0).float()\n")
    argv = ["train", "-o", str(root / "pre"), *tiny("data.seq_len=6", "model.max_len=6", "data.vocab_size=4",
            "train.steps=2", "train.eval_every=0", "train.sample_every=0", "sample.num=0")]  # fmt: skip
    torch.manual_seed(0)
    assert main(argv) == 0
    return root


def _tcsm(root, *argv):
    """The command line in a process that imports the plugin module first (as a user's `plugins:` module)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    code = "import sys, toy_parts; from tcsm.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *map(str, argv)], cwd=root, env=env, capture_output=True, check=False,
                          text=True, timeout=600)  # fmt: skip


def test_a_new_sampler_is_a_method_with_its_own_flag(parts):
    done = _tcsm(parts, "sample", parts / "pre", "--method", "fill", "--fill-token", 3, "-n", 2, "--format", "jsonl",
                 "--no-progress")  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(rows) == 2 and all(set(r["tokens"]) == {3} and r["method"] == "fill" for r in rows)
    shown = _tcsm(parts, "sample", "--help").stdout
    assert "--fill-token" in shown and "fill" in shown


def test_a_new_rl_estimator_is_a_choice_with_its_own_keys(parts):
    out = parts / "rl"
    done = _tcsm(parts, "finetune", "rl", "--from", parts / "pre", "--reward", "python:toy_rewards:last_even", "-G", 3,
                 "--estimator", "scaled_one_step", "objective.scale=0.25", "--steps", 1, "-o", out,
                 "--eval-prompts", 0, "objective.prompt_len=2", "train.batch_size=2", "train.device=cpu",
                 "train.threads=1", "train.progress=false", "train.tensorboard=false", "sample.steps=2",
                 "sample.num=0")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (parts / "scaled_one_step.calls").read_text().count("1") >= 1  # trained through the new estimator
    config = (out / "config.yaml").read_text()
    assert "estimator: scaled_one_step" in config and "scale: 0.25" in config
    assert "scaled_one_step" in _tcsm(parts, "finetune", "rl", "--help").stdout
