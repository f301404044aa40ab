"""DDP: `torchrun --nproc_per_node 2 -m tcsm.cli train` (gloo on CPU) ends with the same weights as one process
with the same global batch and seed, because every micro-batch draws its noise from (seed, step, index)."""

from __future__ import annotations

import sys

import pytest
from train_helpers import ROOT, assert_same_weights, cli_env, final_weights, restore_torch_threads, tiny  # noqa: F401

from tcsm.builders.config import load_config
from tcsm.core.errors import ConfigError
from tcsm.train.distributed import DistEnv
from tcsm.train.trainer import Trainer

pytestmark = pytest.mark.slow

ARGS = tiny(
    "train.steps=4", "train.micro_batch=2", "train.eval_every=0", "train.sample_every=0", "sample.num=0"
)


def _torchrun(nproc: int, out, timeout=240):
    import subprocess

    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "tcsm.cli",
        "train",
        "-o",
        str(out),
        *ARGS,
    ]
    return subprocess.run(
        cmd, check=False, capture_output=True, text=True, env=cli_env(), cwd=ROOT, timeout=timeout
    )


def test_two_processes_match_one_process(tmp_path):
    two = _torchrun(2, tmp_path / "ddp")
    assert two.returncode == 0, two.stderr[-2000:]
    assert "2 process(es), 4 micro-batch(es) of 2" in two.stdout
    Trainer.from_config(load_config("synthetic", ARGS), tmp_path / "single", log=lambda s: None).fit()
    # Summation order differs (DDP adds per-rank partial sums), so equality holds to float rounding, which
    # Adam's normalisation can lift to ~1e-5 on near-zero gradients — far below what a different noise draw does.
    for which in ("model", "ema"):
        assert_same_weights(
            final_weights(tmp_path / "ddp", which), final_weights(tmp_path / "single", which), 5e-5
        )
    Trainer.from_config(load_config("synthetic", ARGS + ["train.micro_batch=4"]), tmp_path / "other", log=lambda s: None
    ).fit()
    a, b = final_weights(tmp_path / "ddp"), final_weights(tmp_path / "other")
    assert max((a[k] - b[k]).abs().max().item() for k in a) > 1e-3


def test_micro_batches_must_divide_among_processes(tmp_path):
    cfg = load_config("synthetic", tiny("train.micro_batch=8"))  # one micro-batch of 8 for 2 processes
    env = DistEnv(rank=0, world_size=2)
    with pytest.raises(ConfigError, match="cannot be shared by 2"):
        Trainer.from_config(cfg, None, env=env)
