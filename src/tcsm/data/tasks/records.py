"""A task's problems as files: prompt / completion JSON lines (TRL's format, for `tcsm finetune sft --data` and any
other trainer) and an lm-evaluation-harness task (generate_until requests scored by the task's verifier), as
`tcsm prepare --task NAME -o DIR` writes them.

    DIR/train.jsonl, DIR/test.jsonl          {"prompt": "1030040130100200=", "completion": "1234341221434321"}
    DIR/lmeval/tcsm_NAME.yaml (+ _test.jsonl, _utils.py)   lm_eval --include_path DIR/lmeval --tasks tcsm_NAME

The completion is the reference answer without its end of text: the `sft` kind pads it with the tokenizer's own.
"""

from __future__ import annotations

import json
from pathlib import Path

from tcsm.data.tasks.base import EOS, Task
from tcsm.storage.fileio import write_atomically

__all__ = ["lmeval_files", "record_lines", "write_task_files"]


def record_lines(task: Task, split: str, n: int, seed: int = 0) -> str:
    """`n` problems of `split` as JSON lines {"prompt", "completion"}."""
    return "".join(json.dumps({"prompt": ex.prompt, "completion": ex.answer}) + "\n" for ex in task.examples(split, n, seed))


def lmeval_files(task: Task, directory: Path, n: int) -> dict[str, str]:
    """{file name: text} of an lm-eval task `tcsm_<name>` over the first `n` test problems (the ones `tcsm eval --task`
    pins): generate_until requests stopped at the end of text, the metric `acc` the verifier's 0/1 reward."""
    name = f"tcsm_{task.name}"
    data = (Path(directory) / f"{name}_test.jsonl").resolve()
    problems = "".join(json.dumps({"prompt": ex.prompt, "answer": ex.answer}) + "\n" for ex in task.examples("test", n))
    yaml = "\n".join([
        f"task: {name}",
        "dataset_path: json",
        f"dataset_kwargs: {{data_files: {{test: {json.dumps(str(data))}}}}}",
        "test_split: test",
        "output_type: generate_until",
        'doc_to_text: "{{prompt}}"',
        'doc_to_target: "{{answer}}"',
        f"generation_kwargs: {{until: [{json.dumps(EOS)}], max_gen_toks: {task.answer_len + 1}}}",
        f"process_results: !function {name}_utils.process_results",
        "metric_list: [{metric: acc, aggregation: mean, higher_is_better: true}]",
    ]) + "\n"  # fmt: skip
    utils = (
        f'"""The verifier of tcsm\'s {task.name} task as lm-eval\'s process_results (reward 1 or 0 per problem)."""\n\n'
        "from tcsm.data.tasks import make_task\n\n"
        f"TASK = make_task({task.name!r}, **{task.options()!r})\n\n\n"
        "def process_results(doc, results):\n"
        '    return {"acc": TASK.score_text(doc["prompt"], results[0])}\n'
    )
    return {f"{name}.yaml": yaml, f"{name}_test.jsonl": problems, f"{name}_utils.py": utils}


def write_task_files(task: Task, out: str | Path, *, num_train: int, num_test: int, seed: int = 0) -> dict[str, int]:
    """Write train.jsonl / test.jsonl (`seed`) and lmeval/ (the pinned test problems) under `out`; {file: lines}."""
    root = Path(out)
    (root / "lmeval").mkdir(parents=True, exist_ok=True)
    files = {root / "train.jsonl": record_lines(task, "train", num_train, seed),
             root / "test.jsonl": record_lines(task, "test", num_test, seed)}  # fmt: skip
    files.update({root / "lmeval" / k: v for k, v in lmeval_files(task, root / "lmeval", num_test).items()})
    for path, text in files.items():
        write_atomically(path, text)
    return {str(p): text.count("\n") for p, text in files.items()}
