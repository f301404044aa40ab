"""`tcsm eval RUN --task NAME` end to end: a tiny run trained on a task's data, its held-out accuracy with a
Wilson interval at the stated sampler and steps, and one-line errors for runs that cannot do the task."""

from __future__ import annotations

import json

import pytest
from train_helpers import restore_torch_threads, tiny  # noqa: F401

from tcsm.cli import main
from tcsm.evaluation.tasks import wilson_interval

TASK_RUN = [  # the default objective: validation is the completion | prompt bound of the rows
    "data.kind=task", "data.task=addition", "data.options.digits=2", "data.num_train=64", "data.num_valid=8",
    "data.num_test=8", "train.steps=2", "train.eval_every=0", "train.sample_every=0",
    "sample.num=0",
]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("task_runs")
    task_run = [o for o in tiny(*TASK_RUN, synthetic=False) if not o.startswith("data.seq_len")]  # the task's length
    assert main(["train", "-o", str(root / "add"), *task_run]) == 0
    assert main(["train", "-o", str(root / "syn"), *tiny("train.steps=1", "train.eval_every=0", "sample.num=0")]) == 0
    return root


def test_eval_task_reports_accuracy_with_a_wilson_interval_per_step_count(runs, capsys, tmp_path):
    out = tmp_path / "acc.json"
    capsys.readouterr()
    argv = ["eval", runs / "add", "--task", "addition", "--max-examples", "20", "--steps", "2,4", "--method",
            "ancestral", "--json", "--output", out]  # fmt: skip
    assert main([str(a) for a in argv]) == 0
    result = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text())["results"] == result["results"]
    assert result["task"] == "addition" and result["options"] == {"digits": 2} and result["split"] == "test"
    assert [r["steps"] for r in result["results"]] == [2, 4]
    for r in result["results"]:
        assert r["method"] == "ancestral" and r["num_problems"] == 20 and r["network_calls"] > 0
        assert (r["ci_low"], r["ci_high"]) == pytest.approx(wilson_interval(r["correct"], 20))
        assert r["accuracy"] == r["correct"] / 20
    # the same prompts, seed and sampler give the same answers
    assert main([str(a) for a in argv[:-2]]) == 0
    again = json.loads(capsys.readouterr().out)["results"]
    assert [{**r, "seconds": 0} for r in again] == [{**r, "seconds": 0} for r in result["results"]]
    assert main(["eval", str(runs / "add"), "--task", "addition", "--max-examples", "4", "--show", "2"]) == 0
    text = capsys.readouterr().out
    assert "Wilson" in text and "4 held-out problems" in text and text.count("->") == 2


def _error(capsys, argv) -> str:
    capsys.readouterr()
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip()
    assert code != 0 and "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_eval_task_refuses_what_it_cannot_evaluate_in_one_line(runs, capsys):
    assert "unknown --task 'chess'" in _error(capsys, ["eval", runs / "add", "--task", "chess"])
    assert "task sudoku needs 33" in _error(capsys, ["eval", runs / "add", "--task", "sudoku"])  # 10 tokens < 17 + 16
    assert "cannot write task addition" in _error(capsys, ["eval", runs / "syn", "--task", "addition", "--max-examples", "2"])
    assert "--max-examples must be a positive" in _error(capsys, ["eval", runs / "add", "--task", "addition", "--max-examples", "0"])
    assert "one of --zeroshot, --genppl and --task" in _error(capsys, ["eval", runs / "add", "--task", "addition", "--genppl"])
