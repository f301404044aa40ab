"""`tcsm finetune fewstep` from block teachers (MATH.md §10, §9: K steps per block, each block's rollout given its
clean prefix): a plain tcsm block model on either source and a DiffusionGemma run imported from a tiny random
directory. The round trains the student from the teacher, and `tcsm sample` of the student decodes with the steps
it was distilled for per block unless --steps says otherwise."""

from __future__ import annotations

import json

import pytest
import torch
from diffusion_gemma_helpers import tiny_hf
from train_helpers import final_weights, restore_torch_threads  # noqa: F401

from tcsm.builders.loading import load_checkpoint
from tcsm.cli import main
from tcsm.data.prepare import prepare
from tcsm.train.logs import read_metrics
from tests.train_helpers import tiny

pytestmark = pytest.mark.usefixtures("one_thread")

QUIET = ("train.eval_every=0", "train.sample_every=0", "train.save_every=0")
B = 4  # block length


def _main(*argv) -> int:
    return main([str(a) for a in argv])


def _round(teacher, out, *extra) -> None:
    assert _main("finetune", "fewstep", "--from", teacher, "-o", out, "--teacher-steps", "4", "--steps", "2",
                 *extra) == 0  # fmt: skip


def _changed(before, after) -> bool:
    return any(not torch.equal(before[k], after[k]) for k in before)


def _teacher_calls(run) -> list[float]:
    return [r["target/teacher_calls"] for r in read_metrics(run) if "target/teacher_calls" in r]


@pytest.fixture(scope="module", params=["masked", "uniform"])
def block_teacher(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("block") / request.param
    assert _main("train", "-c", "synthetic", "-o", out, *tiny(*QUIET, "train.steps=3", "sample.steps=8",
                 f"path.source={request.param}", f"path.block_length={B}",
                 f"model.time_conditioning={request.param == 'uniform'}")) == 0  # fmt: skip
    return out


def test_a_block_model_round_distils_k_steps_per_block(block_teacher, tmp_path):
    _round(block_teacher, tmp_path / "fs", "target.window=null", *tiny(*QUIET, synthetic=False))
    run = load_checkpoint(tmp_path / "fs")
    assert run.config.path.block_length == B and run.config.sample.steps == 2
    assert run.config.reference.path.startswith(str(block_teacher))
    calls = _teacher_calls(tmp_path / "fs")
    # a full rollout from the student's grid point j ∈ {0, 1} takes K − 2j ∈ {4, 2} teacher steps per block
    assert calls and all(2 <= c <= 4 for c in calls)
    assert _changed(final_weights(block_teacher, "ema"), final_weights(tmp_path / "fs"))
    assert _sampled_steps(tmp_path / "fs", tmp_path / "s.jsonl") == (2, B)  # the steps it was distilled for
    assert _sampled_steps(tmp_path / "fs", tmp_path / "s3.jsonl", "--steps", "3") == (3, B)  # unless told


def test_a_joint_round_on_a_block_model_gives_a_block_student_with_a_step_head(block_teacher, tmp_path, capsys):
    """`--form joint` on a block teacher (MATH.md §10.1, §9): the student is the block denoiser with a step head,
    trained on every block's r teacher steps (all blocks' i-th steps in one call: r calls per row), the head alone;
    `tcsm sample` decodes it block by block with the joint in-block step and its distilled steps per block. The
    uniform source is refused in one line."""
    from tcsm.models.kinds import kind_of

    out = tmp_path / "joint"
    argv = ("finetune", "fewstep", "--from", block_teacher, "-o", out, "--teacher-steps", "4", "--steps", "2",
            "--form", "joint", *tiny(*QUIET, synthetic=False))  # fmt: skip
    if block_teacher.name == "uniform":
        assert _main(*argv) != 0
        assert "uniform source" in capsys.readouterr().err
        return
    assert _main(*argv) == 0
    run = load_checkpoint(out)
    kind = kind_of(run.model)
    assert kind.blocks and "joint_step" in kind.offers and run.config.model.step_head_only
    assert run.config.sample.steps == 2 and run.config.path.block_length == B
    assert all(0 < c <= 2 for c in _teacher_calls(out))
    student, start = run.model.state_dict(), final_weights(block_teacher, "ema")
    assert all(torch.equal(student[k], v) for k, v in start.items())  # the head alone was trained
    assert student["step_head.out.weight"].abs().sum() > 0
    capsys.readouterr()
    assert _sampled_steps(out, tmp_path / "s.jsonl") == (2, B)
    assert "joint step" in capsys.readouterr().err
    # exported and loaded back as the same block model with its head
    exported = tmp_path / "export"
    assert _main("export", out, "-o", exported) == 0
    back = load_checkpoint(exported).model
    assert kind_of(back) == kind
    loaded, saved = back.state_dict(), run.model.state_dict()
    assert loaded.keys() == saved.keys() and all(torch.equal(loaded[k], saved[k]) for k in saved)
    # a chained round: the block joint student is the teacher of a 1-step-per-block student, its two joint steps
    # per block rolled out for all blocks at once (2 calls per row)
    chained = tmp_path / "chained"
    assert _main("finetune", "fewstep", "--from", out, "-o", chained, "--teacher-steps", "2", "--steps", "1",
                 "--form", "joint", *tiny(*QUIET, synthetic=False)) == 0  # fmt: skip
    assert set(_teacher_calls(chained)) == {2.0} and load_checkpoint(chained).config.sample.steps == 1


def _sampled_steps(run, dest, *extra) -> tuple[int, int]:
    """(steps, block length) `tcsm sample` of `run` reports for its samples."""
    assert _main("sample", run, "-n", "2", "--seed", "0", "--no-progress", "-o", dest, *extra) == 0
    rows = [json.loads(line) for line in dest.read_text().splitlines()]
    assert len(rows) == 2 and len({(r["steps"], r["block_length"]) for r in rows}) == 1
    return rows[0]["steps"], rows[0]["block_length"]


K = 4
WORDS = ["good", "bad", "happy", "sad", "the", "day", "was", "a"]
DOCS = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(6 + i % 5)) + "." for i in range(60)]
COMMON = ["train.device=cpu", "train.threads=1", "train.progress=false", "train.tensorboard=false",
          "train.precision=fp32", "train.eval_every=0", "train.sample_every=0", "sample.num=0", "train.batch_size=4",
          "train.save_every=0", "train.eval_examples=8"]  # fmt: skip


@pytest.fixture(scope="module")
def dgemma_run(tmp_path_factory):
    """A tiny random DiffusionGemma directory of a character corpus' vocabulary, imported as a run (train.steps=0)."""
    tf = pytest.importorskip("transformers")
    if not hasattr(tf, "DiffusionGemmaForBlockDiffusion"):
        pytest.skip("this transformers has no DiffusionGemma")
    root = tmp_path_factory.mktemp("dgfs")
    (root / "c.txt").write_text("\n".join(DOCS), encoding="utf-8")
    prepare([str(root / "c.txt")], root / "shards", "char", doc_separator="\n", progress=False, valid_fraction=0.2,
            test_fraction=0)  # fmt: skip
    V = json.loads((root / "shards" / "index.json").read_text())["vocab_size"]
    tiny_hf(V=V, k=K, window=3).save_pretrained(root / "model")
    assert _main("train", "-o", root / "run", "data.kind=shards", f"data.path={root / 'shards'}", "data.seq_len=12",
                 "data.windows=random", "path.source=uniform", f"path.block_length={K}", "model.name=diffusion_gemma",
                 f"model.name_or_path={root / 'model'}", "train.steps=0", "sample.steps=4", *COMMON) == 0  # fmt: skip
    return root / "run"


def test_a_diffusion_gemma_run_is_a_fewstep_teacher_and_student(dgemma_run, tmp_path):
    _round(dgemma_run, tmp_path / "fs", "--window", "1", "optim.lr=1e-2", *COMMON)
    run = load_checkpoint(tmp_path / "fs")
    assert type(run.model).__name__ == type(load_checkpoint(dgemma_run).model).__name__
    assert run.config.model.name == "diffusion_gemma" and run.config.sample.steps == 2
    calls = _teacher_calls(tmp_path / "fs")
    # a window of 1: per block one grid step, then the step to 1; a row's blocks start at grid points 0 or 2 and run
    # in lock step, so a row takes 2 to 4 teacher calls
    assert calls and all(2 <= c <= 4 for c in calls)
    assert _changed(final_weights(dgemma_run), final_weights(tmp_path / "fs"))
    # the student is a teacher too: the next round halves again, 2 -> 1 step per block
    _round(tmp_path / "fs", tmp_path / "fs1", "--teacher-steps", "2", *COMMON)
    assert load_checkpoint(tmp_path / "fs1").config.sample.steps == 1
    assert _sampled_steps(tmp_path / "fs1", tmp_path / "s.jsonl") == (1, K)
