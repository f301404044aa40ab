"""The `task` data kind: a verifiable task's problems as prompt / completion rows for supervised training.

    data: {kind: task, task: sudoku, num_train: 5000, num_valid: 500, num_test: 500, seed: 0, options: {}}

Rows are the task's sequences (`prompt + reference answer + EOS...`, `task.seq_len` characters) in the task's
character tokenizer; the prompt positions are conditioning (`Batch.cond_mask`: never noised, never scored), as in
the `sft` kind, so a plain `tcsm train` on it learns p(answer | prompt). Train and valid come from the task's
train split (disjoint rows), test is the held-out split that `tcsm eval --task` also draws from.
"""

from __future__ import annotations

import torch

from tcsm.data.base import DataError
from tcsm.data.build import DATA_KINDS
from tcsm.data.sft import SFTBundle, SFTRows
from tcsm.data.tasks import make_task
from tcsm.data.tasks.base import Example, Task

__all__ = ["build_task", "task_rows"]


def task_rows(task: Task, examples: list[Example], tokenizer) -> SFTRows:
    """Token ids [N, seq_len] of the examples' sequences and their prompt mask [N, seq_len]."""
    L = task.seq_len
    x1 = torch.tensor([tokenizer.encode(task.text(ex)) for ex in examples], dtype=torch.uint8).reshape(-1, L)
    mask = torch.zeros(len(examples), L, dtype=torch.bool)
    mask[:, : task.prompt_len] = True
    return SFTRows(x1, mask)


def build_task(
    task: str | None = None,
    num_train: int = 5000,
    num_valid: int = 500,
    num_test: int = 500,
    seed: int = 0,
    options: dict | None = None,
    name: str | None = None,
) -> SFTBundle:
    """The `task` data kind (see the module docstring)."""
    if task is None:
        raise DataError("data.kind=task needs data.task, one of sudoku, countdown, addition")
    t = make_task(task, **dict(options or {}))
    if int(num_train) < 1 or int(num_valid) < 0 or int(num_test) < 0:
        raise DataError(f"task data needs num_train >= 1, num_valid >= 0, num_test >= 0, got {num_train}, {num_valid}, {num_test}")
    tok = t.tokenizer()
    train = t.examples("train", int(num_train) + int(num_valid), seed)
    test = t.examples("test", int(num_test), seed)
    return SFTBundle(
        name=name or f"task-{t.name}",
        vocab_size=tok.vocab_size,
        seq_len=t.seq_len,
        tokenizer=tok,
        eos_id=tok.eos_id,
        meta={"task": t.name, "options": t.options(), "pad_id": tok.eos_id, "prompt_len": t.prompt_len},
        train=task_rows(t, train[: int(num_train)], tok),
        valid=task_rows(t, train[int(num_train) :], tok),
        test=task_rows(t, test, tok),
    )


DATA_KINDS["task"] = build_task
