"""Nothing a user does loses a run, part three (issue 34): the workbench commands. Items 1 (no data loss, no second
writer), 2 (no tracebacks) and 7 (messages that are true); one test or more per case, each failing before the fix.

The torchrun cases (a launcher killed with SIGKILL, Ctrl-C of a job) start two gloo processes and are marked slow."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from train_helpers import ROOT, cli_env, restore_torch_threads, tiny  # noqa: F401

from tcsm.cli import main

QUIET = ("train.eval_every=0", "train.sample_every=0", "sample.num=0")
LOCK = ".tcsm-run.lock"


def _error(capsys, argv) -> str:
    """Run argv; assert a non-zero exit with exactly one line on stderr and no traceback; return the line."""
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code != 0, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def _snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _train(run: Path, *extra: str) -> None:
    assert main(["train", "-o", str(run), *tiny(*QUIET, *extra)]) == 0


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny run with checkpoints at steps 2 and 4 (tests copy it before changing anything)."""
    out = tmp_path_factory.mktemp("ws") / "run"
    with torch.random.fork_rng(devices=[]):
        _train(out, "train.steps=4", "train.save_every=2")
    return out


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory) -> Path:
    import tcsm

    return tcsm.export(run, tmp_path_factory.mktemp("ws-export") / "hf")


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------------------------ 1 no data loss: export


def test_export_overwrite_replaces_only_what_an_export_wrote(run, exported, tmp_path, capsys):
    out = _copy(exported, tmp_path / "hf")
    (out / "eval_results.json").write_text('{"acc": 0.5}')
    (out / "onnx").mkdir()
    (out / "onnx" / "model.onnx").write_bytes(b"mine")
    before = _snapshot(out)
    line = _error(capsys, ["export", run, "-o", out, "--overwrite"])
    assert "eval_results.json" in line and "onnx" in line and "--keep-other-files" in line
    assert _snapshot(out) == before
    # told explicitly: the export's own files are replaced, the user's are left as they were
    assert main(["export", str(run), "-o", str(out), "--overwrite", "--keep-other-files", "--weights", "model"]) == 0
    assert (out / "eval_results.json").read_text() == '{"acc": 0.5}'
    assert (out / "onnx" / "model.onnx").read_bytes() == b"mine"
    assert (out / "model.safetensors").read_bytes() != before["model.safetensors"]  # raw weights, not EMA
    manifest = json.loads((out / "manifest.json").read_text())
    assert "model.safetensors" in manifest["written"] and "eval_results.json" not in manifest["written"]
    import tcsm

    tcsm.from_pretrained(out)  # still a whole export
    assert not list(tmp_path.glob(".tmp-export-*")) and not list(tmp_path.glob(".old-export-*"))
    # an export that wrote no `written` list (older exports): its known files are its own
    manifest.pop("written")
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert "eval_results.json" in _error(capsys, ["export", run, "-o", out, "--overwrite"])


def test_export_overwrite_never_deletes_a_training_run(run, exported, tmp_path, capsys):
    # a run trained into an export folder (accepted before this issue), then exported over with --overwrite
    out = _copy(exported, tmp_path / "hf")
    _copy(run / "checkpoints", out / "checkpoints")
    (out / "config.yaml").write_text((run / "config.yaml").read_text())
    before = _snapshot(out)
    line = _error(capsys, ["export", run, "-o", out, "--overwrite"])
    assert "checkpoints" in line and "config.yaml" in line
    assert _snapshot(out) == before
    # a run directory itself is never an export target
    r = _copy(run, tmp_path / "r")
    before = _snapshot(r)
    assert "holds a training run" in _error(capsys, ["export", run, "-o", r, "--overwrite"])
    assert _snapshot(r) == before


# ------------------------------------------------------------------------ 1 a run directory is a run directory


def test_train_refuses_an_export_or_a_shards_folder_as_its_run_directory(exported, tmp_path, capsys):
    out = _copy(exported, tmp_path / "hf")
    before = kept = _snapshot(out)
    for extra in ([], ["--overwrite"], ["--resume"]):
        line = _error(capsys, ["train", "-o", out, *extra, *tiny(*QUIET, "train.steps=1")])
        assert "tcsm export" in line and "not a run" in line, line
        assert _snapshot(out) == before
    shards = tmp_path / "shards"
    text = tmp_path / "corpus.txt"
    text.write_text("".join(f"document {i} says hello to the world.\n\n" for i in range(40)))
    assert main(["prepare", str(text), "-o", str(shards), "--tokenizer", "char"]) == 0
    before = _snapshot(shards)
    capsys.readouterr()
    line = _error(capsys, ["train", "-o", shards, *tiny(*QUIET, "train.steps=1")])
    assert "tcsm prepare" in line and "not a run" in line
    assert _snapshot(shards) == before
    # the Python API too (the check lives with the trainer's lock)
    from tcsm.builders.config import load_config
    from tcsm.core.errors import ConfigError
    from tcsm.train.fit import fit

    with pytest.raises(ConfigError, match="not a run"):
        fit(load_config("synthetic", tiny(*QUIET, "train.steps=1")), out, log=lambda s: None)
    assert _snapshot(out) == kept


# ----------------------------------------------------------------------------------- 1 no second writer: lock


def _holder(run_dir: Path) -> subprocess.Popen:
    """Another process that holds `run_dir`'s lock (as a training run does) until it is killed."""
    code = (
        "import sys, time\n"
        "from tcsm.train.rundir import hold_run_lock\n"
        "hold_run_lock(sys.argv[1])\n"
        "print('held', flush=True)\n"
        "time.sleep(600)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code, str(run_dir)], stdout=subprocess.PIPE, text=True, env=cli_env())
    assert p.stdout.readline().strip() == "held"
    return p


def test_a_second_writer_is_refused_naming_the_holder_and_a_dead_holder_is_taken_over(run, tmp_path, capsys):
    import socket

    r = _copy(run, tmp_path / "r")
    holder = _holder(r)
    try:
        before = {k: v for k, v in _snapshot(r).items() if k != LOCK}
        for argv in (
            ["train", "-o", r, "--resume", *tiny(*QUIET, "train.steps=6")],
            ["train", "-o", r, *tiny(*QUIET, "train.steps=6")],
            ["train", "-o", r, "--overwrite", *tiny(*QUIET, "train.steps=6")],
        ):
            line = _error(capsys, argv)
            assert f"pid {holder.pid}" in line and socket.gethostname() in line and "being written" in line, line
            assert "--resume" not in line.split("being written")[1]  # no advice to write it too
            assert {k: v for k, v in _snapshot(r).items() if k != LOCK} == before
        # the Python API is refused the same way
        from tcsm.builders.config import load_config
        from tcsm.train.rundir import RunDirectoryInUse
        from tcsm.train.trainer import Trainer

        with pytest.raises(RunDirectoryInUse):
            Trainer.from_config(load_config("synthetic", tiny(*QUIET, "train.steps=6")), r, resume=True)
    finally:
        holder.kill()
        holder.wait()
    # the holder died without cleaning up (kill -9): its lock file is taken over, and the user is told
    assert (r / LOCK).exists()
    assert main(["train", "-o", str(r), "--resume", *tiny(*QUIET, "train.steps=6")]) == 0
    err = capsys.readouterr().err
    assert f"pid {holder.pid}" in err and "no longer running" in err and "taking the lock over" in err
    assert json.loads((r / "summary.json").read_text())["step"] == 6
    assert not (r / LOCK).exists()  # a normal exit leaves no lock


def test_the_lock_is_released_by_a_handled_error_and_by_ctrl_c(run, tmp_path, capsys, monkeypatch):
    import tcsm.train.trainer as trainer_mod

    r = _copy(run, tmp_path / "r")
    original = trainer_mod.Trainer.train_step

    def interrupted(self):
        if self.step == 5:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(trainer_mod.Trainer, "train_step", interrupted)
    assert main(["train", "-o", str(r), "--resume", *tiny(*QUIET, "train.steps=8")]) == 130
    err = capsys.readouterr().err.strip()
    assert err == f"tcsm train: interrupted; resume with `tcsm train -o {r} --resume`", err
    assert not (r / LOCK).exists()
    # a run that had no checkpoint yet is not told to resume
    fresh = tmp_path / "fresh"
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", lambda self: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert main(["train", "-o", str(fresh), *tiny(*QUIET, "train.steps=8")]) == 130
    err = capsys.readouterr().err.strip()
    assert "interrupted" in err and "--resume" not in err and "no checkpoint yet" in err, err
    assert not (fresh / LOCK).exists()
    # a handled error (non-finite loss) leaves no lock either
    monkeypatch.setattr(trainer_mod.Trainer, "train_step", original)
    bad = tmp_path / "bad"
    line = _error(capsys, ["train", "-o", bad, *tiny(*QUIET, "train.steps=4", "optim.lr=1e30", "optim.warmup=0")])
    assert "non-finite" in line
    assert not (bad / LOCK).exists()
    # a run that cannot even be built leaves neither a lock nor an empty directory
    assert "max_len" in _error(capsys, ["train", "-o", tmp_path / "nope", *tiny(*QUIET, "model.max_len=4")])
    assert not (tmp_path / "nope").exists()


# ------------------------------------------------------------------- 1 + 2 torchrun: launcher death and Ctrl-C


def _torchrun_job(out: Path) -> tuple[subprocess.Popen, list[int]]:
    """A 2-process gloo run that would train for hours, once it has logged a few steps: (launcher, its ranks)."""
    args = tiny(*QUIET, "train.steps=100000", "train.micro_batch=2", "train.save_every=4")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "tcsm.cli", "train", "-o", str(out), *args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env(), cwd=ROOT)
    deadline = time.time() + 180
    while time.time() < deadline and p.poll() is None:
        m = out / "metrics.jsonl"
        if m.exists() and len(m.read_text().splitlines()) >= 6 and list((out / "checkpoints").glob("step_*")):
            break
        time.sleep(0.1)
    assert p.poll() is None, p.communicate()[0][-3000:]
    return p, [pid for pid, parent in _processes().items() if parent == p.pid]


def _processes() -> dict[int, int]:
    """{pid: parent pid} of the live (not zombie) processes."""
    out = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            out[int(stat.parent.name)] = int(fields[1])
    return out


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_ranks_stop_when_the_torchrun_launcher_is_killed(tmp_path):
    out = tmp_path / "run"
    p, ranks = _torchrun_job(out)
    assert len(ranks) == 2
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    deadline = time.time() + 60  # a rank stops within ~11 s; a loaded 2-core machine may take several times that
    while time.time() < deadline and set(ranks) & set(_processes()):
        time.sleep(0.2)
    left = set(ranks) & set(_processes())
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, "ranks kept training after their launcher was killed"
    assert not (out / LOCK).exists()  # rank 0 was interrupted and released the run directory
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    time.sleep(1.5)
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == steps


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process table from /proc")
def test_ctrl_c_of_a_torchrun_job_ends_with_the_resume_line(tmp_path):
    out = tmp_path / "run"
    p, ranks = _torchrun_job(out)
    os.kill(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C sends the launcher (its workers have their own groups)
    text, _ = p.communicate(timeout=90)
    last = [line for line in text.splitlines() if line.strip()][-1]
    assert last == f"tcsm train: interrupted; resume with `torchrun --nproc_per_node 2 -m tcsm.cli train -o {out} --resume`"
    assert text.count("tcsm train: interrupted") == 1, text[-3000:]  # rank 0 speaks for the job
    assert not (out / LOCK).exists()
    assert not set(ranks) & set(_processes())


# ------------------------------------------------------------------------------------------ 2 no tracebacks


def test_export_onto_a_full_disk_is_one_line_and_keeps_the_old_export(run, exported, tmp_path, capsys, monkeypatch):
    out = _copy(exported, tmp_path / "hf")
    before = _snapshot(out)
    real = Path.write_text

    def full(self, *a, **k):
        if self.name == "config.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)
    line = _error(capsys, ["export", run, "-o", out, "--overwrite"])
    assert "disk is full" in line and "unchanged" in line and "free space" in line
    line = _error(capsys, ["export", run, "-o", tmp_path / "new"])
    assert "disk is full" in line and "nothing was written" in line
    monkeypatch.undo()
    assert _snapshot(out) == before and not (tmp_path / "new").exists()
    assert not list(tmp_path.glob(".tmp-export-*"))
    # safetensors reports a full disk as its own error type (not an OSError)
    from safetensors import SafetensorError

    import tcsm.builders.exporters as ex  # the family's exporter writes the weights

    def full_st(*a, **k):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space" })')

    monkeypatch.setattr(ex, "save_file", full_st)
    assert "disk is full" in _error(capsys, ["export", run, "-o", out, "--overwrite"])
    assert _snapshot(out) == before


def _lmeval_task(tmp_path: Path) -> Path:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "d.jsonl").write_text(json.dumps({"context": "ab", "target": "ba"}) + "\n")
    (tasks / "t.yaml").write_text(
        "task: tcsm_ws_task\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tasks / 'd.jsonl'}\ntest_split: test\noutput_type: loglikelihood\n"
        'doc_to_text: "{{context}}"\ndoc_to_target: "{{target}}"\nmetric_list:\n  - metric: acc\n'
    )
    return tasks


def test_lm_eval_adapter_errors_are_one_line(run, tmp_path, capsys, monkeypatch):
    from tcsm.cli.lmeval import _Adapter
    from tcsm.core.errors import TCSMError

    bad = {
        (): "needs checkpoint=",
        (("chekpoint", str(run)),): "did you mean checkpoint",
        (("checkpoint", str(run)), ("num_tt", "3")): "did you mean num_t",
        (("checkpoint", str(run)), ("num_t", "abc")): "num_t=abc is not an integer",
        (("checkpoint", str(run)), ("num_t", "1")): "num_t=1: must be >= 2",
        (("checkpoint", str(run)), ("steps", "2.5")): "steps=2.5 is not an integer",
        (("checkpoint", str(run)), ("no_ema", "maybe")): "is not true or false",
        (("checkpoint", str(run)), ("method", "foo")): "model_args method: must be one of",
        (("checkpoint", str(run)), ("top_p", "2")): "model_args top_p: must be in (0, 1]",
        (("checkpoint", str(tmp_path / "nope")),): "does not exist",
    }
    for args, message in bad.items():
        with pytest.raises(TCSMError) as e:
            _Adapter(**dict(args))
        assert message in str(e.value), (args, str(e.value))


@pytest.mark.slow  # lm-eval indexes its task folder on every call (about 10 s each here)
def test_lm_eval_cli_errors_are_one_line(run, tmp_path, capsys, monkeypatch):
    pytest.importorskip("lm_eval")
    from tcsm.cli.lmeval import main as lmeval

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tasks = _lmeval_task(tmp_path)
    common = ["--model", "tcsm", "--include_path", str(tasks)]
    cases = [
        (["--model_args", "chekpoint=" + str(run), "--tasks", "tcsm_ws_task"], "did you mean checkpoint"),
        (["--model_args", f"checkpoint={run}", "--tasks", "no_such_task"], "Tasks not found: no_such_task"),
    ]
    for argv, message in cases:
        assert lmeval([*common, *argv]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("tcsm lmeval")]
        assert len(err) == 1 and message in err[0], err
        assert "Traceback" not in capsys.readouterr().err


def test_a_chat_template_that_fails_while_rendering_is_one_line(tmp_path, capsys):
    from tcsm.data import DataError
    from tcsm.data.sft import build_sft

    text = tmp_path / "text.txt"
    text.write_text("the cat sat on a mat. Q: A: the dog ran to me.\n" * 40)
    records = tmp_path / "chat.jsonl"
    chat = [{"role": "user", "content": "the cat"}, {"role": "assistant", "content": "sat"}]
    records.write_text(json.dumps({"messages": chat}) + "\n")
    template = (
        "{% for m in messages %}{% if m['role'] == 'user' %}Q: {{ m['content'] }}\n"
        "{% elif m['role'] == 'assistant' %}A: {{ m.content.missing.upper() }}\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}A: {% endif %}"
    )
    section = {"kind": "text", "path": str(text), "seq_len": 32, "valid_frac": 0.1}
    with pytest.raises(DataError, match=r"chat.jsonl:1: chat template fails while rendering: UndefinedError"):
        build_sft(path=str(records), tokenizer=section, pad=".", chat_template=template)
    pre = tmp_path / "pre"
    data = [f"data.path={text}", "data.kind=text", "data.seq_len=32", "data.valid_frac=0.1", "model.max_len=32"]
    assert main(["train", "-o", str(pre), *tiny(*QUIET, "train.steps=1", *data, synthetic=False)]) == 0
    capsys.readouterr()
    line = _error(capsys, ["finetune", "sft", "--from", pre, "--data", records, "--chat-template", template,
                           "-o", tmp_path / "sft", "train.device=cpu", "data.pad=."])  # fmt: skip
    assert "fails while rendering" in line and "--chat-template" in line


# ------------------------------------------------------------------------------------ 7 messages that are true


def test_a_missing_local_model_directory_is_not_called_a_hub_repo_id(tmp_path, capsys):
    pytest.importorskip("transformers")
    for where, local in ((tmp_path / "no" / "such" / "model", "true"), ("./my-model", "true"), ("my-model", "true")):
        model = ["model.name=hf_denoiser", f"model.name_or_path={where}", f"model.local_files_only={local}"]
        line = _error(capsys, ["train", "-o", tmp_path / "r", *QUIET, "train.device=cpu", *model])
        assert "no such directory" in line and "Repo id" not in line and "huggingface.co" not in line, line
    from tcsm.builders.models import _cannot_load

    e = _cannot_load("org/name", OSError("We couldn't connect to 'https://huggingface.co'"), local_only=False)
    assert "is not a local directory" in str(e) and "Hub id" in str(e)
    (tmp_path / "file").write_text("x")
    assert "is a file" in str(_cannot_load(str(tmp_path / "file"), OSError("x"), local_only=True))


def test_a_directory_given_as_data_is_called_a_directory(run, tmp_path):
    from tcsm.core.errors import ConfigError
    from tcsm.data import DataError
    from tcsm.data.pairs import read_pair_records
    from tcsm.data.sft import read_sft_records
    from tcsm.recipes.preference.compose import preference_config
    from tcsm.recipes.sft.compose import sft_config

    folder = tmp_path / "records"
    folder.mkdir()
    with pytest.raises(ConfigError, match="is a directory; give the JSONL file"):
        sft_config(run, folder)
    with pytest.raises(ConfigError, match="is a directory; give the JSONL file"):
        preference_config(run, folder)
    from collections import Counter

    with pytest.raises(DataError, match="is a directory"):
        read_sft_records(folder, ("prompt", "completion", "messages"), None, Counter())
    with pytest.raises(DataError, match="is a directory"):
        read_pair_records(folder, (None, "chosen", "rejected"), Counter())


def test_resume_is_not_advised_for_a_run_without_a_checkpoint(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "metrics.jsonl").write_text("")
    line = _error(capsys, ["train", "-o", run, *tiny(*QUIET, "train.steps=1")])
    assert "no checkpoint yet" in line and "--resume" not in line and "--overwrite" in line


def test_a_moved_shards_folder_on_resume_names_the_override(tmp_path, capsys):
    text = tmp_path / "corpus.txt"
    text.write_text("".join(f"document {i} says hello to the world.\n\n" for i in range(40)))
    shards = tmp_path / "shards"
    assert main(["prepare", str(text), "-o", str(shards), "--tokenizer", "char", "--no-progress"]) == 0
    run = tmp_path / "run"
    data = [f"data.path={shards}", "data.kind=shards", "data.seq_len=16"]
    assert main(["train", "-o", str(run), *tiny(*QUIET, "train.steps=2", *data, synthetic=False)]) == 0
    shards.rename(tmp_path / "moved")
    capsys.readouterr()
    line = _error(capsys, ["train", "-o", run, "--resume", "train.steps=3"])
    assert f"data.path={shards}" in line and "--resume data.path=NEW_PATH" in line and "moved" in line
    # the advice works
    assert main(["train", "-o", str(run), "--resume", "train.steps=3", f"data.path={tmp_path / 'moved'}"]) == 0
    assert json.loads((run / "summary.json").read_text())["step"] == 3
    # data.seq_len=0 is refused as such, not turned into 128 and then refused for the model's max_len
    capsys.readouterr()
    data = [f"data.path={tmp_path / 'moved'}", "data.kind=shards", "data.seq_len=0"]
    line = _error(capsys, ["train", "-o", tmp_path / "zero", *tiny(*QUIET, "train.steps=1", *data, synthetic=False)])
    assert "data.seq_len must be a positive integer, got 0" in line


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_utf16_text_is_not_called_binary(tmp_path, capsys, encoding):
    f = tmp_path / "corpus.txt"
    f.write_bytes("hello world, this is text.\n".encode(encoding) * 20)
    line = _error(capsys, ["prepare", f, "-o", tmp_path / "shards", "--tokenizer", "char"])
    assert "UTF-16" in line and "binary" not in line and "iconv" in line, line
    line = _error(capsys, ["train", "-o", tmp_path / "r", *tiny(*QUIET, "data.kind=text", f"data.path={f}", "train.steps=1",
                                                                 synthetic=False)])  # fmt: skip
    assert "UTF-16" in line and "iconv" in line, line
    # the conversion it names gives text that reads
    name = {"utf-16": "UTF-16", "utf-16-le": "UTF-16LE", "utf-16-be": "UTF-16BE"}[encoding]
    assert f"iconv -f {name} " in line
    assert f.read_bytes().decode(name.lower().replace("utf-16le", "utf-16-le").replace("utf-16be", "utf-16-be"))
