"""Countdown: reach a target with `count` small numbers, each used exactly once, and + − × ÷.

    prompt   the numbers (1..max_number) and the target (10..99), left-padded   "  3,15,7:26="   (count·(w + 1) + 3
             with spaces to a fixed width (w = digits of max_number):                characters)
    answer   an arithmetic expression:                                           "15+7-3+7"... e.g. "3*7+5"

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
from tcsm.data.tasks.base import Example, Task

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
    """`count` numbers in 1..`max_number` and a target in 10..99 reachable with each number once. The defaults (3
    numbers up to 20) hold about 12 000 distinct problems (3 numbers up to 9: about 1 400; 4 up to 9: 19 500)."""

    name = "countdown"
    format = "an expression over + - * / and parentheses using each given number exactly once, equal to the target"
    chars = " 0123456789+-*/(),:="

    def __init__(self, count: int = 3, max_number: int = 20):
        if int(count) not in (2, 3, 4):
            raise DataError(f"countdown count must be 2, 3 or 4 numbers, got {count}")
        if not 2 <= int(max_number) <= 99:
            raise DataError(f"countdown max_number must be in 2..99, got {max_number}")
        self.count, self.max_number = int(count), int(max_number)
        w = len(str(self.max_number))
        # the numbers, their commas, ":", the two-digit target and "="
        self.prompt_len = self.count * (w + 1) + 3
        # the numbers, count − 1 operators and room for parentheses (the fewest need at most 2·(count − 2))
        self.answer_len = self.count * (w + 3)

    def options(self) -> dict:
        return {"count": self.count, "max_number": self.max_number}

    def numbers_and_target(self, prompt: str) -> tuple[list[int], int]:
        head, target = prompt.strip().rstrip("=").split(":")
        return [int(v) for v in head.split(",")], int(target)

    def draw(self, generator: torch.Generator) -> Example:
        while True:
            # one draw of the generator per attempt: the numbers, then (left, right, operator) per combination
            r = torch.randint(0, 1 << 30, (4 * self.count,), generator=generator).tolist()
            numbers = [1 + v % self.max_number for v in r[: self.count]]
            nodes = [(v, Fraction(v)) for v in numbers]  # (expression tree, its exact value)
            k, by_zero = self.count, False
            while len(nodes) > 1 and not by_zero:
                left = nodes.pop(r[k] % len(nodes))
                right = nodes.pop(r[k + 1] % len(nodes))
                op = OPS[r[k + 2] % 4]
                k += 3
                by_zero = op == "/" and right[1] == 0
                if not by_zero:
                    nodes.append(((op, left[0], right[0]), _apply(op, left[1], right[1])))
            if by_zero:
                continue
            tree, value = nodes[0]
            answer = _write(tree)
            if value.denominator == 1 and 10 <= value <= 99 and len(answer) <= self.answer_len:
                prompt = ",".join(map(str, numbers)) + f":{int(value)}="
                return Example(prompt.rjust(self.prompt_len), answer)

    def split_key(self, prompt: str) -> str:
        numbers, target = self.numbers_and_target(prompt)
        return ",".join(map(str, sorted(numbers))) + f":{target}"

    def check(self, prompt: str, answer: str) -> bool:
        numbers, target = self.numbers_and_target(prompt)
        value, literals = parse(answer)
        return sorted(literals) == sorted(numbers) and value == target
