"""A task's problems as data: the `task` data kind's rows, the prompt / completion records and the lm-eval task
that `tcsm prepare --task` writes."""

import importlib.util
import json

import pytest
import torch

from tcsm.cli import main
from tcsm.data.base import DataError
from tcsm.data.build import build_data
from tcsm.data.tasks import make_task


def test_task_data_kind_pins_the_prompt_and_writes_the_reference_answers():
    data = build_data({"kind": "task", "task": "sudoku", "num_train": 50, "num_valid": 5, "num_test": 20, "seed": 1})
    task = make_task("sudoku")
    assert (len(data.train), len(data.valid), len(data.test)) == (50, 5, 20)
    batch = data.get_batch("train", torch.arange(4))
    assert batch.x1.shape == (4, task.seq_len) and batch.cond_mask[:, : task.prompt_len].all()
    assert not batch.cond_mask[:, task.prompt_len :].any()
    train = {data.decode(r)[: task.prompt_len] for r in data.train.x1} | {data.decode(r)[: task.prompt_len] for r in data.valid.x1}
    assert len(train) == 55 and not train & {data.decode(r)[: task.prompt_len] for r in data.test.x1}
    with pytest.raises(DataError, match="takes the options"):
        build_data({"kind": "task", "task": "sudoku", "options": {"digits": 3}})
    with pytest.raises(DataError, match="unknown task"):
        build_data({"kind": "task", "task": "chess"})



def test_prepare_task_writes_records_and_an_lmeval_task_scored_by_the_verifier(tmp_path, capsys):
    out = tmp_path / "cd"
    assert main(["prepare", "--task", "countdown", "--task-option", "count=4", "-o", str(out), "--num-train", "30",
                 "--num-test", "12", "--seed", "3"]) == 0  # fmt: skip
    task = make_task("countdown", count=4)
    train = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (out / "test.jsonl").read_text().splitlines()]
    assert [(r["prompt"], r["completion"]) for r in train] == [(e.prompt, e.answer) for e in task.examples("train", 30, 3)]
    assert len(test) == 12 and all(task.in_test(r["prompt"]) and task.score_text(r["prompt"], r["completion"]) for r in test)
    lm = out / "lmeval"
    yaml = (lm / "tcsm_countdown.yaml").read_text()
    assert "output_type: generate_until" in yaml and str((lm / "tcsm_countdown_test.jsonl").resolve()) in yaml
    assert "until: [\"\\n\"]" in yaml and "process_results: !function tcsm_countdown_utils.process_results" in yaml
    docs = [json.loads(line) for line in (lm / "tcsm_countdown_test.jsonl").read_text().splitlines()]
    assert [d["prompt"] for d in docs] == [e.prompt for e in task.examples("test", 12)]  # pinned: seed 0, as tcsm eval
    spec = importlib.util.spec_from_file_location("tcsm_countdown_utils", lm / "tcsm_countdown_utils.py")
    utils = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(utils)
    assert [utils.process_results(d, [d["answer"]])["acc"] for d in docs] == [1.0] * 12
    assert utils.process_results(docs[0], [docs[0]["answer"] + "+1"])["acc"] == 0.0
    capsys.readouterr()
    assert main(["prepare", "--task", "addition", "in.txt", "-o", str(out)]) != 0
    assert "give no INPUT" in capsys.readouterr().err
    assert main(["prepare", "-o", str(out)]) != 0
    assert "needs INPUT files and --tokenizer" in capsys.readouterr().err


def test_task_records_train_an_sft_run_through_the_sft_kind(tmp_path):
    assert main(["prepare", "--task", "sudoku", "-o", str(tmp_path), "--num-train", "20", "--num-test", "5"]) == 0
    tokenizer = {"kind": "task", "task": "sudoku", "num_train": 1, "num_valid": 0, "num_test": 0}
    data = build_data({"kind": "sft", "path": str(tmp_path / "train.jsonl"), "tokenizer": tokenizer, "valid_frac": 0.0})
    own = build_data({**tokenizer, "num_train": 20})
    def rows(bundle):  # the sft kind orders its records by its own split draw
        return sorted(zip(map(tuple, bundle.train.x1.tolist()), map(tuple, bundle.train.prompt_mask.tolist())))

    assert rows(data) == rows(own)  # the same rows either way: prompt, answer, EOS padding; the prompt pinned
