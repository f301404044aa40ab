"""`tcsm finetune fewstep` (MATH.md §10): a round is an ordinary run from the teacher — the teacher frozen as
`reference`, the student started from it, `sample.steps` the student's — and bad step counts fail in one line."""

from __future__ import annotations

import pytest
import torch

from tcsm.builders.loading import load_checkpoint
from tcsm.cli import main
from tcsm.recipes.fewstep.compose import fewstep_config
from tcsm.train.logs import read_metrics
from tests.train_helpers import tiny

QUIET = ("train.eval_every=0", "train.sample_every=0", "train.save_every=0")


@pytest.fixture(scope="module", params=["masked", "uniform"])
def teacher(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("teacher") / request.param
    assert main(["train", "-c", "synthetic", "-o", str(out), *tiny(*QUIET, "train.steps=3", "sample.steps=8",
                                                                      f"path.source={request.param}")]) in (0, None)  # fmt: skip
    return out


def test_a_round_trains_the_student_from_the_teacher_and_samples_with_its_steps(teacher, tmp_path):
    out = tmp_path / "fs"
    rc = main(["finetune", "fewstep", "--from", str(teacher), "-o", str(out), "--teacher-steps", "8", "--window", "2",
               "--steps", "2", *tiny(*QUIET, synthetic=False)])  # fmt: skip
    assert rc in (0, None)
    run = load_checkpoint(out)
    cfg = run.config
    assert cfg.reference.path.startswith(str(teacher)) and cfg.train.init_from.startswith(str(teacher))
    assert cfg.sample.steps == 4 and cfg.target.name == "fewstep" and cfg.target.window == 2
    calls = [r["target/teacher_calls"] for r in read_metrics(out) if "target/teacher_calls" in r]
    assert calls and all(1 <= c <= 3 for c in calls)  # a window of 2: at most 3 teacher calls per row


def test_the_student_step_count_must_divide_the_teachers(teacher):
    from tcsm.core.errors import ConfigError

    with pytest.raises(ConfigError, match="divide"):
        fewstep_config(teacher, overrides=["target.teacher_steps=8", "target.student_steps=3"])
    cfg = fewstep_config(teacher, overrides=["target.teacher_steps=8", "target.student_steps=2"])
    assert cfg.sample.steps == 2


def test_a_joint_round_adds_a_step_head_and_its_student_samples_with_the_joint_step(teacher, tmp_path, capsys):
    """`--form joint` (MATH.md §10, "The joint student"): the student is the teacher's denoiser with a new step head,
    trained on the teacher's steps over one student step; `tcsm sample` of it draws with the joint step and its
    distilled steps, and a second round takes it as a (joint) teacher. The uniform source is refused in one line."""
    from tcsm.models.kinds import kind_of

    out = tmp_path / "joint"
    argv = ["finetune", "fewstep", "--from", str(teacher), "-o", str(out), "--teacher-steps", "8", "--form", "joint",
            "--steps", "2", *tiny(*QUIET, synthetic=False)]  # fmt: skip
    if teacher.name == "uniform":
        assert main(argv) not in (0, None)
        assert "uniform source" in capsys.readouterr().err
        return
    assert main(argv) in (0, None)
    run = load_checkpoint(out)
    assert "joint_step" in kind_of(run.model).offers and run.config.target.window is None
    assert run.config.sample.steps == 4 and run.config.model.step_head_layers == 1
    rows = [r for r in read_metrics(out) if "target/teacher_calls" in r]
    assert rows and all(0 < r["target/teacher_calls"] <= 2 for r in rows) and rows[-1]["target/revealed"] > 0
    capsys.readouterr()
    assert main(["sample", str(out), "-n", "2"]) in (0, None)
    assert "ancestral (joint step) sampler, 4 steps" in capsys.readouterr().err
    # exported for tcsm alone (transformers' denoiser code would drop the head), and loaded back with it
    exported = tmp_path / "export"
    assert main(["export", str(out), "-o", str(exported)]) in (0, None)
    said = capsys.readouterr()
    assert "(load with tcsm.from_pretrained)" in said.out and "no Hugging Face modeling code" in said.err
    assert not (exported / "modeling_tcsm.py").exists()
    back = load_checkpoint(exported).model
    assert "joint_step" in kind_of(back).offers
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), run.model.state_dict().values()))
    again = tmp_path / "joint2"
    assert main(["finetune", "fewstep", "--from", str(out), "-o", str(again), "--teacher-steps", "4", "--form",
                 "joint", "--steps", "1", *tiny(*QUIET, synthetic=False)]) in (0, None)  # fmt: skip
    assert load_checkpoint(again).config.sample.steps == 2
    # a joint round trains the head alone unless told: the denoiser keeps the teacher's weights
    student, start = run.model.state_dict(), load_checkpoint(teacher).model.state_dict()
    assert run.config.model.step_head_only
    assert all(torch.equal(student[k], v) for k, v in start.items())
    assert student["step_head.out.weight"].abs().sum() > 0  # zero at initialisation: the head was trained
    both = tmp_path / "both"
    assert main(["finetune", "fewstep", "--from", str(teacher), "-o", str(both), "--teacher-steps", "8",
                 "--form", "joint", "--steps", "2", *tiny(*QUIET, "model.step_head_only=false", synthetic=False)]) in (0, None)  # fmt: skip
    student = load_checkpoint(both).model.state_dict()
    assert not load_checkpoint(both).config.model.step_head_only
    assert any(not torch.equal(student[k], v) for k, v in start.items())


def test_a_left_to_right_fill_round_learns_from_one_teacher_call_per_revealed_token(teacher, tmp_path, capsys):
    """`--fill left_to_right` (MATH.md §10.1): the teacher fills each student step's reveal set one token a call and
    the head learns its conditionals; a fill without `--form joint` is refused in one line."""
    if teacher.name == "uniform":
        pytest.skip("the joint student is the masked source's")
    out = tmp_path / "l2r"
    assert main(["finetune", "fewstep", "--from", str(teacher), "-o", str(out), "--form", "joint", "--fill",
                 "left_to_right", "--student-steps", "2", "--teacher-steps", "4", "--steps", "3",
                 *tiny(*QUIET, "train.log_every=1", synthetic=False)]) in (0, None)  # fmt: skip
    run = load_checkpoint(out)
    assert run.config.target.fill == "left_to_right" and run.config.sample.steps == 2
    rows = [r for r in read_metrics(out) if "target/teacher_calls" in r]
    assert rows and all(r["target/teacher_calls"] == pytest.approx(r["target/revealed"]) for r in rows)
    assert main(["finetune", "fewstep", "--from", str(teacher), "-o", str(tmp_path / "bad"), "--fill",
                 "left_to_right", "--steps", "1", *tiny(*QUIET, synthetic=False)]) not in (0, None)  # fmt: skip
    err = capsys.readouterr().err
    assert "target.form=joint" in err and not (tmp_path / "bad" / "checkpoints").exists()


def test_a_round_with_pooled_rollouts_resumes_exactly(teacher, tmp_path):
    """`target.reuse=2` (`posttrain.fewstep.replay`): half of each batch after the first from the pool of earlier
    rollouts; a run stopped after 2 steps and resumed to 4 ends with the weights of one run of 4 (the pool is in
    the checkpoint)."""
    from tests.train_helpers import assert_same_weights, final_weights

    def run(out, steps, *extra):
        assert main(["finetune", "fewstep", "--from", str(teacher), "-o", str(out), "--teacher-steps", "4",
                     "--window", "1", *extra, *tiny("train.eval_every=0", "train.sample_every=0", "train.save_every=1",
                                                    f"train.steps={steps}", "target.reuse=2",
                                                    synthetic=False)]) in (0, None)  # fmt: skip

    run(tmp_path / "whole", 4)
    run(tmp_path / "parts", 2)
    run(tmp_path / "parts", 4, "--resume")
    assert_same_weights(final_weights(tmp_path / "whole"), final_weights(tmp_path / "parts"))
    reused = [r["target/reused"] for r in read_metrics(tmp_path / "whole") if "target/reused" in r]
    assert reused and reused[0] == 0.0 and reused[-1] == 0.5
