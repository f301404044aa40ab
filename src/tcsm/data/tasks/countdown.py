"""Countdown: reach a target with `count` small numbers, each used exactly once, and + − × ÷.

    prompt   the numbers (1..max_number, one digit each) and the two-digit target:  "3,5,7:26="  (2·count + 3 chars)
    answer   an arithmetic expression:                                               "5*7-3-6"... e.g. "3*7+5"

Reward 1 iff the answer is an expression of the grammar

    expr := term (("+" | "-") term)*      term := factor (("*" | "/") factor)*      factor := NUMBER | "(" expr ")"

(no spaces, no unary minus, numbers in plain decimal without leading zeros) whose number literals are exactly the
given numbers — each used once, as in d1 / TinyZero's rule — and whose exact rational value (`fractions.Fraction`:
"/" is exact division, intermediate fractions allowed, division by zero fails) equals the target. Nothing is
`eval`-ed. Reference answers come from a random expression tree over the numbers, written with the fewest
parentheses; permutations of the numbers fall in the same split.
"""

from __future__ import annotations

from fractions import Fraction

import torch

from tcsm.data.base import DataError
from tcsm.data.tasks.base import Example, Task, randint

__all__ = ["CountdownTask", "evaluate", "parse"]

OPS = "+-*/"
PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


def _apply(op: str, a: Fraction, b: Fraction) -> Fraction:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        raise ZeroDivisionError("division by zero")
    return a / b


def parse(text: str) -> tuple[Fraction, list[int]]:
    """(exact value, number literals in order) of an expression of the module's grammar; ValueError if `text` is
    not one, ZeroDivisionError on a division by zero."""
    pos, literals = 0, []

    def peek() -> str:
        return text[pos] if pos < len(text) else ""

    def factor() -> Fraction:
        nonlocal pos
        if peek() == "(":
            pos += 1
            value = expr()
            if peek() != ")":
                raise ValueError(f"expected ')' at {pos} in {text!r}")
            pos += 1
            return value
        start = pos
        while peek().isdigit() and peek().isascii():
            pos += 1
        digits = text[start:pos]
        if not digits or (len(digits) > 1 and digits[0] == "0"):
            raise ValueError(f"expected a number at {start} in {text!r}")
        literals.append(int(digits))
        return Fraction(int(digits))

    def chain(operand, ops: str) -> Fraction:
        nonlocal pos
        value = operand()
        while peek() and peek() in ops:
            op = peek()
            pos += 1
            value = _apply(op, value, operand())
        return value

    def term() -> Fraction:
        return chain(factor, "*/")

    def expr() -> Fraction:
        return chain(term, "+-")

    value = expr()
    if pos != len(text):
        raise ValueError(f"unexpected {text[pos]!r} at {pos} in {text!r}")
    return value, literals


def evaluate(text: str) -> Fraction:
    """The exact value of an expression of the module's grammar (ValueError / ZeroDivisionError if none)."""
    return parse(text)[0]


def _write(node) -> str:
    """An expression tree (a number, or (op, left, right)) written with the fewest parentheses that keep it."""
    if isinstance(node, int):
        return str(node)
    op, left, right = node
    lhs, rhs = _write(left), _write(right)
    if not isinstance(left, int) and PRECEDENCE[left[0]] < PRECEDENCE[op]:
        lhs = f"({lhs})"
    # the right operand needs brackets at a lower precedence, or at the same one under - and / (not associative)
    if not isinstance(right, int) and (
        PRECEDENCE[right[0]] < PRECEDENCE[op] or (PRECEDENCE[right[0]] == PRECEDENCE[op] and op in "-/")
    ):
        rhs = f"({rhs})"
    return f"{lhs}{op}{rhs}"


class CountdownTask(Task):
    """`count` numbers in 1..`max_number` and a target in 10..99 reachable with each number once."""

    name = "countdown"
    format = "an expression over + - * / and parentheses using each given number exactly once, equal to the target"
    chars = "0123456789+-*/(),:="

    def __init__(self, count: int = 3, max_number: int = 9):
        if int(count) not in (2, 3, 4):
            raise DataError(f"countdown count must be 2, 3 or 4 numbers, got {count}")
        if not 2 <= int(max_number) <= 9:
            raise DataError(f"countdown max_number must be in 2..9 (one digit per number), got {max_number}")
        self.count, self.max_number = int(count), int(max_number)
        self.prompt_len = 2 * self.count + 3
        # count digits, count − 1 operators and room for redundant parentheses
        self.answer_len = 4 * self.count

    def options(self) -> dict:
        return {"count": self.count, "max_number": self.max_number}

    def numbers_and_target(self, prompt: str) -> tuple[list[int], int]:
        head, target = prompt.rstrip("=").split(":")
        return [int(v) for v in head.split(",")], int(target)

    def draw(self, generator: torch.Generator) -> Example:
        while True:
            numbers = [randint(1, self.max_number, generator) for _ in range(self.count)]
            nodes = list(numbers)
            while len(nodes) > 1:
                i = randint(0, len(nodes) - 1, generator)
                left = nodes.pop(i)
                right = nodes.pop(randint(0, len(nodes) - 1, generator))
                nodes.append((OPS[randint(0, 3, generator)], left, right))
            answer = _write(nodes[0])
            try:
                value = evaluate(answer)
            except ZeroDivisionError:
                continue
            if value.denominator == 1 and 10 <= value <= 99 and len(answer) <= self.answer_len:
                return Example(",".join(map(str, numbers)) + f":{int(value)}=", answer)

    def split_key(self, prompt: str) -> str:
        numbers, target = self.numbers_and_target(prompt)
        return ",".join(map(str, sorted(numbers))) + f":{target}"

    def check(self, prompt: str, answer: str) -> bool:
        numbers, target = self.numbers_and_target(prompt)
        value, literals = parse(answer)
        return sorted(literals) == sorted(numbers) and value == target
