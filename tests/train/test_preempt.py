"""SIGTERM (Slurm's and torchrun's stop) ends a run as Ctrl-C does, with a checkpoint of the last finished step: the
resume line, no lock left, exit 143; under torchrun on every rank."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_helpers import ROOT, cli_env, restore_torch_threads, tiny  # noqa: F401

from tcsm.storage.checkpoint import resolve_checkpoint

LOCK = ".tcsm-run.lock"
ARGS = tiny("train.eval_every=0", "train.sample_every=0", "sample.num=0", "train.steps=100000", "train.save_every=0")


def _start(cmd: list[str], out: Path, rows: int = 4) -> subprocess.Popen:
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env(), cwd=ROOT)
    deadline = time.time() + 180
    while time.time() < deadline and p.poll() is None:
        m = out / "metrics.jsonl"
        if m.exists() and len(m.read_text().splitlines()) >= rows:
            break
        time.sleep(0.1)
    assert p.poll() is None, p.communicate()[0][-3000:]
    return p


def _step_of(checkpoint: Path) -> int:
    return int("".join(ch for ch in checkpoint.name if ch.isdigit()))


def _last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


def test_sigterm_saves_the_step_prints_the_resume_line_and_frees_the_run(tmp_path):
    out = tmp_path / "run"
    p = _start([sys.executable, "-m", "tcsm.cli", "train", "-o", str(out), *ARGS], out)
    os.kill(p.pid, signal.SIGTERM)
    text, _ = p.communicate(timeout=120)
    assert p.returncode == 143, text[-3000:]
    last = _last_line(text)
    assert last.startswith("tcsm train: stopped by SIGTERM after step ") and last.endswith(
        f"saved as a checkpoint; resume with `tcsm train -o {out} --resume`"), last
    step = int(last.split("after step ")[1].split(",")[0])
    assert _step_of(resolve_checkpoint(out)) == step
    assert not (out / LOCK).exists()
    # the run resumes from it
    r = subprocess.run([sys.executable, "-m", "tcsm.cli", "train", "-o", str(out), "--resume",
                        *ARGS[:-2], f"train.steps={step + 1}", "train.save_every=0"],
                       capture_output=True, text=True, env=cli_env(), cwd=ROOT, timeout=180, check=False)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resuming at step {step}" in r.stdout
    assert json.loads((out / "summary.json").read_text())["step"] == step + 1


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="torchrun's process handling is tested on Linux")
def test_sigterm_to_torchrun_stops_every_rank_at_one_saved_step(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "tcsm.cli", "train", "-o", str(out), *ARGS, "train.micro_batch=2"]  # fmt: skip
    p = _start(cmd, out)
    os.kill(p.pid, signal.SIGTERM)  # torchrun sends it on to its workers
    text, _ = p.communicate(timeout=120)
    assert p.returncode != 0
    assert not (out / LOCK).exists()
    saved = _step_of(resolve_checkpoint(out))
    rows = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert saved == rows[-1], (saved, rows[-3:], text[-3000:])  # the ranks stopped together after the logged step
    # rank 0 speaks for the job, last (after the launcher's own lines)
    assert _last_line(text) == (f"tcsm train: stopped by SIGTERM after step {saved}, saved as a checkpoint; resume "
                                f"with `torchrun --nproc_per_node 2 -m tcsm.cli train -o {out} --resume`"), text[-3000:]
