"""4×4 Sudoku: fill the blanks of a grid so that every row, column and 2×2 box holds 1, 2, 3, 4 once.

    prompt   the 16 cells row by row, "0" for a blank, then "=":   "1030040130100200="   (17 characters)
    answer   the 16 cells of the full grid, digits 1–4:             "1234341221434321"    (16 characters)

Reward 1 iff the answer is exactly 16 digits in 1–4, keeps every given of the puzzle and is a valid Sudoku
(rows, columns, boxes are permutations). Every generated puzzle has a unique solution (checked against all 288
valid grids), so "valid and consistent" and "equal to the solution" agree.
"""

from __future__ import annotations

import itertools
from functools import lru_cache

import numpy as np
import torch

from tcsm.data.base import DataError
from tcsm.data.tasks.base import Example, Task, randint

__all__ = ["SudokuTask", "is_valid_grid", "valid_grids"]

#: the cells of each row, column and 2×2 box of a 4×4 grid read row by row
UNITS = (
    [[4 * r + c for c in range(4)] for r in range(4)]
    + [[4 * r + c for r in range(4)] for c in range(4)]
    + [[4 * (br + r) + bc + c for r in range(2) for c in range(2)] for br in (0, 2) for bc in (0, 2)]
)


def is_valid_grid(grid: str) -> bool:
    """Whether `grid` (16 characters) is a solved 4×4 Sudoku."""
    return len(grid) == 16 and all(sorted(grid[i] for i in unit) == list("1234") for unit in UNITS)


@lru_cache(maxsize=1)
def valid_grids() -> tuple[str, ...]:
    """All 288 solved 4×4 grids, in lexicographic order."""
    rows = ["".join(p) for p in itertools.permutations("1234")]
    return tuple(g for g in ("".join(r) for r in itertools.product(rows, repeat=4)) if is_valid_grid(g))


@lru_cache(maxsize=1)
def _grid_array() -> np.ndarray:
    return np.frombuffer("".join(valid_grids()).encode(), dtype=np.uint8).reshape(-1, 16)


def solutions(puzzle: str) -> list[str]:
    """The solved grids that keep every given of `puzzle` ("0" = blank), by one comparison with all 288."""
    p = np.frombuffer(puzzle[:16].encode(), dtype=np.uint8)
    keep = ((_grid_array() == p) | (p == ord("0"))).all(1)
    return [valid_grids()[i] for i in np.flatnonzero(keep)]


class SudokuTask(Task):
    """4×4 Sudoku puzzles with `min_blanks`..`max_blanks` blanks and a unique solution."""

    name = "sudoku"
    format = "the 16 digits (1-4) of the solved grid, row by row"
    chars = "01234="
    prompt_len = 17
    answer_len = 16

    def __init__(self, min_blanks: int = 6, max_blanks: int = 10):
        if not 1 <= int(min_blanks) <= int(max_blanks) <= 12:
            raise DataError(
                f"sudoku needs 1 <= min_blanks <= max_blanks <= 12 (more blanks admit several solutions), got "
                f"{min_blanks}, {max_blanks}"
            )
        self.min_blanks, self.max_blanks = int(min_blanks), int(max_blanks)

    def options(self) -> dict:
        return {"min_blanks": self.min_blanks, "max_blanks": self.max_blanks}

    def draw(self, generator: torch.Generator) -> Example:
        grids = valid_grids()
        while True:
            grid = grids[randint(0, len(grids) - 1, generator)]
            k = randint(self.min_blanks, self.max_blanks, generator)
            blanks = set(torch.randperm(16, generator=generator)[:k].tolist())
            puzzle = "".join("0" if i in blanks else ch for i, ch in enumerate(grid))
            if len(solutions(puzzle)) == 1:
                return Example(puzzle + "=", grid)

    def check(self, prompt: str, answer: str) -> bool:
        puzzle = prompt[:16]
        return (
            len(answer) == 16
            and is_valid_grid(answer)
            and all(p in ("0", a) for p, a in zip(puzzle, answer))
        )
