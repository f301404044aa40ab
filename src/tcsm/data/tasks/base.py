"""What every verifiable task shares: fixed-length text formats, seeded generation of a train / test split that
are disjoint by construction, the task's character vocabulary, and the 0/1 reward read from token ids.

A task is a set of problems, each a prompt text of exactly `prompt_len` characters (ending in a separator) and an
answer of at most `answer_len` characters; a sequence is `prompt + answer + EOS...` of `seq_len = prompt_len +
answer_len + 1` characters, so there is always room for at least one end-of-text (EOS = "\\n", the character
tokenizers' end of document). The verifier reads the completion up to its first EOS (what follows is ignored, as
a generation that stops there) and returns whether that answer solves the prompt — reward 1, else 0.

Train and test are disjoint by construction: a problem belongs to the test split iff crc32 of its `split_key`
(the problem up to the symmetries the task names, e.g. the operands' order) is divisible by `TEST_SHARE`, so every
seed and size of one split stays out of the other.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from tcsm.data.base import DataError

__all__ = ["EOS", "TEST_SHARE", "Example", "Task", "TaskReward", "randint"]

#: the end-of-text character of every task (the character tokenizers' end of document)
EOS = "\n"

#: one problem in TEST_SHARE (by the crc32 of its split key) belongs to the held-out test split
TEST_SHARE = 8

#: draws in a row without a new problem after which a split counts as exhausted
STALL = 20_000


@dataclass(frozen=True)
class Example:
    """One problem: its prompt text and a reference answer (one of possibly several the verifier accepts)."""

    prompt: str
    answer: str


def randint(lo: int, hi: int, generator: torch.Generator) -> int:
    """A uniform integer in [lo, hi] drawn from `generator`."""
    return int(torch.randint(lo, hi + 1, (), generator=generator))


class Task:
    """Base class: subclasses set `name`, `chars` (the vocabulary without EOS), `prompt_len`, `answer_len`,
    `format` (the stated answer rule) and implement `draw` (one random problem) and `check` (the verifier)."""

    name: ClassVar[str] = ""
    format: ClassVar[str] = ""
    chars: str
    prompt_len: int
    answer_len: int

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.answer_len + 1

    @property
    def vocabulary(self) -> str:
        """The sorted characters of the task with EOS: the character tokenizer's vocabulary (id = position)."""
        return "".join(sorted(set(self.chars) | {EOS}))

    def tokenizer(self):
        """The task's character tokenizer (EOS = "\\n" is its end of document and padding)."""
        from tcsm.data.tokenizer_spec import CharDocTokenizer

        return CharDocTokenizer(self.chars)

    # ------------------------------------------------------------------ what a subclass provides

    def draw(self, generator: torch.Generator) -> Example:
        raise NotImplementedError

    def check(self, prompt: str, answer: str) -> bool:
        """Whether `answer` (the completion before its first EOS) solves `prompt`."""
        raise NotImplementedError

    def split_key(self, prompt: str) -> str:
        """The problem up to the symmetries that must not cross the train / test boundary (default: the prompt)."""
        return prompt

    def options(self) -> dict:
        """The keyword arguments that rebuild this task (saved with a run's data section)."""
        return {}

    # ------------------------------------------------------------------ shared

    def in_test(self, prompt: str) -> bool:
        return zlib.crc32(self.split_key(prompt).encode()) % TEST_SHARE == 0

    def examples(self, split: str, n: int, seed: int = 0) -> list[Example]:
        """`n` problems of `split` ("train" or "test"), distinct up to the task's symmetries (`split_key`); a function
        of (task options, split, n, seed)."""
        if split not in ("train", "test"):
            raise DataError(f"task split must be train or test, got {split!r}")
        want_test = split == "test"
        g = torch.Generator().manual_seed(int(seed) * 2 + int(want_test))
        out, seen = [], set()
        misses = 0  # draws since the last new problem: many in a row mean the split is (nearly) exhausted
        while len(out) < int(n):
            if misses > STALL:
                raise DataError(
                    f"{self!r}: found only {len(out)} distinct {split} problems of the {n} asked for "
                    f"({STALL} draws in a row gave none new); ask for fewer or enlarge the task with its options"
                )
            ex = self.draw(g)
            key = self.split_key(ex.prompt)
            if key in seen or self.in_test(ex.prompt) != want_test:
                misses += 1
                continue
            misses = 0
            seen.add(key)
            out.append(ex)
        return out

    def text(self, ex: Example) -> str:
        """The full training sequence: prompt, answer, then EOS up to `seq_len`."""
        return ex.prompt + ex.answer + EOS * (self.seq_len - len(ex.prompt) - len(ex.answer))

    def score_text(self, prompt: str, completion: str) -> float:
        """Reward 1.0 when the completion's text before its first EOS solves the prompt, else 0.0."""
        answer = completion.split(EOS, 1)[0]
        try:
            return 1.0 if self.check(prompt, answer) else 0.0
        except (ValueError, ZeroDivisionError):
            return 0.0

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.options().items())
        return f"{type(self).__name__}({opts})"


class TaskReward:
    """R(x) = 1 if the completion x[P:] solves the prompt x[:P] (P = `task.prompt_len`), else 0; a reward function
    LongTensor[B, L] → FloatTensor[B] for reward fine-tuning and RL (MATH.md §5.2's R).

    Token ids are read through a character-level vocabulary: `decode(list[int]) -> str` and `vocab_size` of the
    run's tokenizer (default: the task's own), in which every task character and EOS must be one token — else a
    one-line DataError. An id outside the vocabulary (e.g. a mask left unfilled) before the first EOS scores 0.
    """

    def __init__(self, task: Task, decode=None, vocab_size: int | None = None):
        if decode is None:
            tok = task.tokenizer()
            decode, vocab_size = tok.decode, tok.vocab_size
        if vocab_size is None:
            raise DataError(f"task {task.name}: the reward needs the tokenizer's vocabulary size")
        table = [decode([i]) for i in range(int(vocab_size))]
        ids = {c: i for i, c in reversed(list(enumerate(table))) if len(c) == 1}
        missing = [c for c in task.vocabulary if c not in ids]
        if missing:
            raise DataError(
                f"the tokenizer cannot write task {task.name}: no single token for {''.join(missing)!r} (the task needs "
                f"one token per character of {task.vocabulary!r}); train the model on data.kind=task data.task={task.name}"
            )
        self.task, self.table, self.ids, self.eos_id = task, table, ids, ids[EOS]

    def encode(self, text: str) -> list[int]:
        """The ids of a task text (its characters, EOS included) in the reward's vocabulary."""
        try:
            return [self.ids[c] for c in text]
        except KeyError as e:
            raise DataError(f"task {self.task.name}: {e.args[0]!r} is not a character of the task") from None

    def answer_text(self, completion_ids: list[int]) -> str:
        """The text of a completion up to its first EOS ("?" for an id outside the vocabulary)."""
        ids = completion_ids[: completion_ids.index(self.eos_id)] if self.eos_id in completion_ids else completion_ids
        return "".join(self.table[i] if 0 <= i < len(self.table) else "?" for i in ids)

    def _text(self, ids: list[int]) -> str | None:
        V = len(self.table)
        if any(not 0 <= i < V for i in ids):
            return None
        return "".join(self.table[i] for i in ids)

    def score(self, prompt_ids: Tensor, completion_ids: Tensor) -> Tensor:
        """Rewards FloatTensor[B] of completions [B, C] to prompts [B, P] (on the completions' device)."""
        prompts, completions = torch.as_tensor(prompt_ids), torch.as_tensor(completion_ids)
        if prompts.dim() != 2 or completions.dim() != 2 or prompts.shape[0] != completions.shape[0]:
            raise ValueError(
                f"task reward takes prompts [B, P] and completions [B, C], got {tuple(prompts.shape)} and "
                f"{tuple(completions.shape)}"
            )
        out = []
        for p, c in zip(prompts.tolist(), completions.tolist()):
            c = c[: c.index(self.eos_id)] if self.eos_id in c else c
            prompt, answer = self._text(p), self._text(c)
            out.append(0.0 if prompt is None or answer is None else self.task.score_text(prompt, answer))
        return torch.tensor(out, dtype=torch.float32, device=completions.device)

    def __call__(self, x: Tensor) -> Tensor:
        """Rewards FloatTensor[B] of whole sequences x [B, L] (prompt in the first `task.prompt_len` positions)."""
        P = self.task.prompt_len
        if x.shape[-1] <= P:
            raise ValueError(f"task {self.task.name}: sequences of {x.shape[-1]} tokens hold no completion after the {P}-token prompt")
        return self.score(x[:, :P], x[:, P:])
