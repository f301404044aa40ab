"""Verifiable tasks a small model learns on a CPU: 4×4 Sudoku, Countdown and multi-digit addition (docs/tasks.md).

Each task (`tcsm.data.tasks.base.Task`) has a seeded generator of problems with a train / test split disjoint by
construction, an exact verifier (reward 1 for a correct answer, else 0; the format rule is in each module's
docstring), a character vocabulary with "\\n" as end of text, and fixed lengths (`prompt_len`, `seq_len`).

The reward of a task from token ids — what reward fine-tuning and RL call:

    from tcsm.data.tasks import task_reward
    reward = task_reward("sudoku")                       # ids of the task's own tokenizer (data.kind=task)
    reward = task_reward("countdown", decode=data.decode, vocab_size=data.vocab_size, count=4)   # a run's tokenizer
    r = reward.score(prompt_ids, completion_ids)         # FloatTensor[B] of 0/1; prompts [B, P], completions [B, C]
    r = reward(x)                                        # whole sequences [B, L], prompt = x[:, :task.prompt_len]

`make_task(name, **options)` builds a task; `task.examples("test", n, seed)` its problems; `build_task` (the
`task` data kind: `data.kind=task data.task=sudoku`) its prompt / completion rows for supervised training.
"""

from __future__ import annotations

from tcsm.core.parts import Parts
from tcsm.data.base import DataError
from tcsm.data.tasks.addition import AdditionTask
from tcsm.data.tasks.base import EOS, Example, Task, TaskReward
from tcsm.data.tasks.countdown import CountdownTask
from tcsm.data.tasks.sudoku import SudokuTask

__all__ = ["EOS", "TASKS", "Example", "Task", "TaskReward", "make_task", "run_task_options", "task_reward"]

TASKS = Parts("task", {"sudoku": SudokuTask, "countdown": CountdownTask, "addition": AdditionTask})


def make_task(name: str, **options) -> Task:
    """The task `name` with its options (e.g. digits=4 for addition); one-line DataError for an unknown name or
    option."""
    if name not in TASKS:
        raise DataError(f"unknown task {name!r}; choose one of {sorted(TASKS)}")
    try:
        return TASKS[name](**options)
    except TypeError:
        import inspect

        accepted = [p for p in inspect.signature(TASKS[name]).parameters]
        raise DataError(f"task {name} takes the options {accepted}, got {sorted(options)}") from None


def task_reward(name: str, decode=None, vocab_size: int | None = None, **options) -> TaskReward:
    """The 0/1 reward of task `name` on token ids (see the module docstring)."""
    return TaskReward(make_task(name, **options), decode=decode, vocab_size=vocab_size)


def run_task_options(data_section) -> dict[str, dict]:
    """{task name: its options} for a run trained on a task (`data.kind: task`), else {}: what `tcsm eval --task`
    and the task rewards (`make_reward(..., task_options=...)`) take as the task's defaults for that run."""
    if data_section is None or data_section.get("kind") != "task" or not data_section.get("task"):
        return {}
    return {str(data_section.get("task")): dict((data_section.get("options") or {}).items())}
