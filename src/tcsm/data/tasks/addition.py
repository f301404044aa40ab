"""Multi-digit addition: the sum of two `digits`-digit numbers.

    prompt   both operands zero-padded to `digits` digits:  "123+045="   (2·digits + 2 characters)
    answer   the sum in decimal digits:                     "0168"       (at most digits + 1 characters)

Reward 1 iff the answer is 1 to digits + 1 decimal digits (leading zeros allowed) whose value is the sum. The
reference answers are zero-padded to digits + 1 digits, so every training answer has the same length; a + b and
b + a fall in the same split.
"""

from __future__ import annotations

import torch

from tcsm.data.base import DataError
from tcsm.data.tasks.base import Example, Task, randint

__all__ = ["AdditionTask"]


class AdditionTask(Task):
    """a + b for a, b uniform in [0, 10^digits)."""

    name = "addition"
    format = "the sum in decimal digits (leading zeros allowed), at most digits + 1 of them"
    chars = "0123456789+="

    def __init__(self, digits: int = 3):
        if not 2 <= int(digits) <= 12:
            raise DataError(f"addition needs 2 <= digits <= 12 (1 digit has too few problems for a test split), got {digits}")
        self.digits = int(digits)
        self.prompt_len = 2 * self.digits + 2
        self.answer_len = self.digits + 1

    def options(self) -> dict:
        return {"digits": self.digits}

    def operands(self, prompt: str) -> tuple[int, int]:
        a, b = prompt.rstrip("=").split("+")
        return int(a), int(b)

    def draw(self, generator: torch.Generator) -> Example:
        n = self.digits
        a, b = randint(0, 10**n - 1, generator), randint(0, 10**n - 1, generator)
        return Example(f"{a:0{n}d}+{b:0{n}d}=", f"{a + b:0{n + 1}d}")

    def split_key(self, prompt: str) -> str:
        return "+".join(str(v) for v in sorted(self.operands(prompt)))

    def check(self, prompt: str, answer: str) -> bool:
        a, b = self.operands(prompt)
        ok = 1 <= len(answer) <= self.answer_len and answer.isascii() and answer.isdigit()
        return ok and int(answer) == a + b
