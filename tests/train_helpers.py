"""Shared by the trainer / checkpoint / CLI / distributed tests: a tiny run that trains in about a second."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

# 2 layers × width 32 on 16-token synthetic sequences; fp32 so that comparisons can be exact.
TINY = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "model.cond_dim=16",
    "model.max_len=16",
    "data.seq_len=16",
    "data.num_train=256",
    "data.num_valid=32",
    "data.num_test=32",
    "train.batch_size=8",
    "train.precision=fp32",
    "train.device=cpu",
    "train.threads=1",  # tiny matmuls: extra threads only add synchronisation (and suffer on a busy machine)
    "train.progress=false",
    "train.tensorboard=false",
    "train.log_every=1",
    "train.eval_examples=16",
    "eval.num_t=2",
    "eval.batch_size=32",
    "sample.num=2",
    "sample.steps=4",
    "optim.warmup=2",
    "optim.lr=3e-3",
]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def restore_torch_threads():
    """Runs set torch's process-wide thread count (train.threads); give the next test back the default."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


SYNTHETIC_ONLY = ("data.num_train", "data.num_valid", "data.num_test")


def tiny(*extra: str, synthetic: bool = True) -> list[str]:
    """TINY plus `extra`; synthetic=False leaves out the keys only the synthetic data kind has."""
    base = TINY if synthetic else [o for o in TINY if not o.startswith(SYNTHETIC_ONLY)]
    return base + list(extra)


def train_addition_run(run: Path) -> Path:
    """A 1-step run on 2-digit addition at `run` (a task run: its rows carry their prompts; its options are not the
    task's defaults), trained from seed 0."""
    from tcsm.cli import main

    argv = ["train", "-o", str(run), "data.kind=task", "data.task=addition", "data.options.digits=2",
            "data.num_train=64", "data.num_valid=8", "data.num_test=8", "model.d_model=16", "model.n_layers=1",
            "model.n_heads=2", "model.cond_dim=8", "model.max_len=10", "train.steps=1", "train.batch_size=4",
            "train.eval_every=0", "train.sample_every=0", "sample.num=0", "train.device=cpu", "train.threads=1",
            "train.progress=false", "train.tensorboard=false"]  # fmt: skip
    torch.manual_seed(0)
    assert main(argv) == 0
    return run


def final_weights(run_dir: Path, which: str = "model") -> dict[str, torch.Tensor]:
    ckpt_root = Path(run_dir) / "checkpoints"
    name = (ckpt_root / "latest").read_text().strip()
    return load_file(str(ckpt_root / name / f"{which}.safetensors"))


def assert_same_weights(a: dict, b: dict, atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for k, x in a.items():
        if atol == 0.0:
            assert torch.equal(x, b[k]), f"{k} differs by {(x - b[k]).abs().max().item()}"
        else:
            torch.testing.assert_close(x, b[k], atol=atol, rtol=0, msg=lambda m, k=k: f"{k}: {m}")


def cli_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("TCSM_TRACEBACK", None)
    return env


def run_cli(*args: str, cwd=None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tcsm.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=cwd,
        timeout=timeout,
    )
