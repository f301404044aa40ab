"""train.strategy=fsdp (FSDP2 over gloo, 2 CPU processes): the same weights as DDP, sharded checkpoints that survive
a SIGKILL and resume bit for bit, resume on 1 process from 2 and on 2 from 1, activation checkpointing that changes
nothing, and FSDP runs that `tcsm sample` / `tcsm eval` read like any other.

Tolerances: 2-process FSDP and DDP, and 1 against 2 processes, agree to float summation order (measured ≤ 4e-7 here;
the DDP test allows 5e-5 for Adam's normalisation of near-zero gradients); the same world size is bit-identical."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from train_helpers import (  # noqa: F401
    ROOT,
    assert_same_weights,
    cli_env,
    final_weights,
    restore_torch_threads,
    run_cli,
    tiny,
)

from tcsm.builders.config import load_config
from tcsm.core.errors import CheckpointError, ConfigError
from tcsm.storage.checkpoint import consolidate_shards, read_weights, resolve_checkpoint
from tcsm.train.logs import read_metrics
from tcsm.train.trainer import Trainer

pytestmark = pytest.mark.slow

STEPS = 18
ARGS = tiny(
    f"train.steps={STEPS}",
    "train.micro_batch=2",  # 4 micro-batches: 2 per rank, so gradient accumulation runs under FSDP
    "train.save_every=3",
    "train.keep_last=0",
    "train.eval_every=0",
    "train.sample_every=0",
    "train.eval_examples=8",
    "train.strategy=fsdp",
)
TOL = 5e-5


def _torchrun(nproc: int, out: Path, *extra: str, resume: bool = False, popen: bool = False):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd += ["-m", "tcsm.cli", "train", "-o", str(out), *(["--resume"] if resume else []), *ARGS, *extra]
    if popen:
        return subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=cli_env(), cwd=ROOT
        )
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=cli_env(), cwd=ROOT, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _fit(run_dir, *extra, resume=None):
    trainer = Trainer.from_config(load_config("synthetic", ARGS + list(extra)), run_dir, resume=resume, log=lambda s: None)
    return trainer, trainer.fit()


def _cut_at(src: Path, dst: Path, step: int) -> Path:
    """A copy of run `src` as it was right after the checkpoint of `step` (later checkpoints removed)."""
    shutil.copytree(src, dst)
    ckpts = dst / "checkpoints"
    for d in ckpts.glob("step_*"):
        if int(d.name.split("_")[1]) > step:
            shutil.rmtree(d)
    (ckpts / "latest").write_text(f"step_{step:08d}\n")
    return dst


def _kill_tree(pid: int) -> None:
    """SIGKILL the launcher and every process under it (torchrun's workers are not in its process group)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    for p in reversed(tree):  # workers first: none outlives the launcher's death by a step
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    """An uninterrupted 2-process FSDP run (with its final evaluation and samples, which need both ranks)."""
    out = tmp_path_factory.mktemp("fsdp") / "run"
    done = _torchrun(2, out, "sample.num=2")
    assert "2 process(es), 4 micro-batch(es) of 2" in done.stdout and "bits/token" in done.stdout
    return out


def test_fsdp_matches_ddp_and_writes_shards_and_whole_weights(fsdp_run, tmp_path):
    _torchrun(2, tmp_path / "ddp", "sample.num=2", "train.strategy=ddp")
    for which in ("model", "ema"):
        assert_same_weights(final_weights(fsdp_run, which), final_weights(tmp_path / "ddp", which), TOL)
    losses = [[r["loss"] for r in read_metrics(run) if r["kind"] == "train"] for run in (fsdp_run, tmp_path / "ddp")]
    assert len(losses[0]) == STEPS and losses[0] == pytest.approx(losses[1], rel=1e-5)
    last = resolve_checkpoint(fsdp_run)
    assert sorted(p.name for p in (last / "sharded").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    # The whole weights rank 0 wrote are exactly what the shards hold.
    for which in ("model", "ema"):
        assert_same_weights(consolidate_shards(last, which), read_weights(last, ema=which == "ema"))
    samples = [(run / "samples.jsonl").read_text() for run in (fsdp_run, tmp_path / "ddp")]
    assert samples[0] == samples[1]  # both ranks sampled together; rank 0 alone wrote


def test_sigkill_then_resume_on_two_processes_is_bit_identical(fsdp_run, tmp_path):
    """Kill the launcher and both workers mid-run (possibly mid-save), resume on 2 processes, with activation
    checkpointing switched on for the resumed part: the final weights are the uninterrupted run's, bit for bit."""
    killed = tmp_path / "killed"
    proc = _torchrun(2, killed, popen=True)
    deadline = time.time() + 180
    try:
        while time.time() < deadline and proc.poll() is None:
            rows = read_metrics(killed)
            if rows and max(r["step"] for r in rows) >= 7:
                break
            time.sleep(0.02)
        _kill_tree(proc.pid)
    finally:
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert max(r["step"] for r in read_metrics(killed)) < STEPS
    done = _torchrun(2, killed, "train.activation_checkpointing=true", resume=True)
    assert "resuming at step" in done.stdout
    for which in ("model", "ema"):
        assert_same_weights(final_weights(fsdp_run, which), final_weights(killed, which))


def test_resume_on_one_process_from_two(fsdp_run, tmp_path):
    run = _cut_at(fsdp_run, tmp_path / "run", 6)
    trainer, summary = _fit(run, resume=True)
    assert summary["step"] == STEPS and trainer.env.world_size == 1
    for which in ("model", "ema"):
        assert_same_weights(final_weights(fsdp_run, which), final_weights(run, which), TOL)


def test_resume_on_two_processes_from_one(fsdp_run, tmp_path):
    _fit(tmp_path / "one")
    for which in ("model", "ema"):  # one process and two see the same data and noise
        assert_same_weights(final_weights(fsdp_run, which), final_weights(tmp_path / "one", which), TOL)
    run = _cut_at(tmp_path / "one", tmp_path / "run", 6)
    _torchrun(2, run, resume=True)
    rows = [r["step"] for r in read_metrics(run) if r["kind"] == "train"]
    assert rows == list(range(1, STEPS + 1))  # the data order continued where it stopped
    for which in ("model", "ema"):
        assert_same_weights(final_weights(tmp_path / "one", which), final_weights(run, which), TOL)


def test_activation_checkpointing_recomputes_and_changes_nothing(tmp_path, monkeypatch):
    import torch.utils.checkpoint as tuc

    calls = []
    original = tuc.checkpoint

    def counting(*args, **kwargs):
        calls.append(kwargs.get("use_reentrant"))
        return original(*args, **kwargs)

    monkeypatch.setattr(tuc, "checkpoint", counting)
    short = ("train.steps=3", "train.save_every=3", "model.dropout=0.1")  # dropout: its masks must be replayed
    _fit(tmp_path / "off", *short)
    assert calls == []
    _fit(tmp_path / "on", *short, "train.activation_checkpointing=true")
    assert calls and set(calls) == {False}  # non-reentrant, once per block and micro-batch
    assert len(calls) == 3 * 4 * 2
    for which in ("model", "ema"):
        assert_same_weights(final_weights(tmp_path / "off", which), final_weights(tmp_path / "on", which))


def test_a_save_killed_before_its_rename_is_never_loaded(tmp_path, monkeypatch):
    from tcsm.train import checkpointer

    trainer, _ = _fit(tmp_path, "train.steps=3")

    def killed(*args, **kwargs):  # every shard is written; the process dies before rank 0 completes the directory
        raise SystemExit(137)

    monkeypatch.setattr(checkpointer, "save_checkpoint", killed)
    trainer.step = 4
    with pytest.raises(SystemExit):
        trainer.save()
    monkeypatch.undo()
    leftovers = list((tmp_path / "checkpoints").glob(".tmp-step_00000004-*"))
    assert len(leftovers) == 1 and (leftovers[0] / "sharded" / ".metadata").is_file()
    assert resolve_checkpoint(tmp_path).name == "step_00000003"
    resumed = Trainer.from_config(load_config("synthetic", ARGS + ["train.steps=6"]), tmp_path, resume=True)
    assert resumed.step == 3
    resumed.fit()
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


def test_sample_and_eval_read_a_run_saved_as_shards_only(tmp_path):
    trainer, _ = _fit(tmp_path, "train.steps=2", "train.consolidated_weights=false")
    last = resolve_checkpoint(tmp_path)
    assert not (last / "model.safetensors").exists() and (last / "sharded").is_dir()
    weights = read_weights(last)
    assert_same_weights(weights, {k: v.detach() for k, v in trainer.model.state_dict().items()})
    sampled = run_cli("sample", str(tmp_path), "-n", "2", "--steps", "4")
    assert sampled.returncode == 0, sampled.stderr
    evaluated = run_cli("eval", str(tmp_path), "--max-examples", "8", "--num-t", "2")
    assert evaluated.returncode == 0, evaluated.stderr


def test_bad_strategy_settings_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="train.strategy must be one of"):
        _fit(tmp_path / "a", "train.strategy=zero3")
    with pytest.raises(ConfigError, match="cpu_offload"):
        _fit(tmp_path / "b", "train.cpu_offload=true")
    _fit(tmp_path / "ddp", "train.steps=2", "train.strategy=ddp")
    with pytest.raises(CheckpointError, match="written whole"):
        _fit(tmp_path / "ddp", "train.steps=4", resume=True)
