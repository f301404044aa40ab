"""The one name → object table of the math layers (losses, divergences, Bregman generators, time weightings,
schedules, paths, AR estimators, teachers): a dict whose `lookup` passes an object of the table's own kind through
and turns an unknown name into one ValueError that lists the choices; `register` adds an entry by decorator.
(Config sections select components through `tcsm.builders.registry`, which adds schemas and builders on top.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["NameTable"]


class NameTable(dict):
    """`table.lookup(name_or_object)`: the entry of `name`, or the object itself when `passes(object)` (e.g. any
    callable for a loss table, a `BregmanGenerator` instance for the generators)."""

    def __init__(self, kind: str, entries: dict | None = None, passes: Callable[[Any], bool] | None = None):
        super().__init__(entries or {})
        self.kind = kind
        self.passes = passes

    def lookup(self, name):
        if self.passes is not None and not isinstance(name, str) and self.passes(name):
            return name
        try:
            return self[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of {sorted(self)}") from None

    def register(self, name: str):
        """Decorator: add the decorated object under `name`."""

        def add(obj):
            self[name] = obj
            return obj

        return add

    def __repr__(self) -> str:
        return f"NameTable({self.kind!r}, {sorted(self)})"
