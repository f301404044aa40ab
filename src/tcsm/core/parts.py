"""One pattern for a named part: a table `Parts` of name → part, whose unknown names are one ValueError that lists
the choices. A part with options is a class with a `name` (and, where it takes options, a frozen `settings_type`
dataclass whose fields carry their help), registered by `@table.register`; the math layers' tables (losses,
divergences, Bregman generators, time weightings, schedules, paths, AR estimators, teachers) hold functions, classes
or instances under a name (`entries`, or `@table.register("name")`). A table imports the modules that register the
built-in parts (`homes`, by name, like a user's plugin) before it answers, so a new part is one class or function
in one module plus its registration, and the names a config or a flag accepts are the table's keys, never a list
kept by hand. (Config sections select components through `tcsm.builders.registry`, which adds schemas and
builders on top.)"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["Parts"]


class Parts(dict):
    """name → part of one kind (`kind` names it in errors). `homes`: modules whose import registers the built-in
    ones; `passes(object)`: what `lookup` lets through as a part itself rather than a name (e.g. any callable for a
    loss table, a `BregmanGenerator` instance for the generators)."""

    def __init__(self, kind: str, entries: dict | None = None, *, homes: tuple[str, ...] = (),
                 passes: Callable[[Any], bool] | None = None):  # fmt: skip
        super().__init__(entries or {})
        self.kind, self.homes, self.passes = kind, tuple(homes), passes
        self._imported = not self.homes

    def register(self, part):
        """Class decorator: make `part` selectable by `part.name` (a different class under a taken name is refused);
        or, given a name, a decorator that adds the decorated object under it."""
        if isinstance(part, str):

            def add(obj):
                dict.__setitem__(self, part, obj)
                return obj

            return add
        name = getattr(part, "name", "")
        if not name or dict.get(self, name, part) is not part:
            raise ValueError(f"{self.kind} name {name!r} is empty or already registered")
        dict.__setitem__(self, name, part)
        return part

    def _import_homes(self) -> None:
        if not self._imported:
            self._imported = True
            for module in self.homes:
                importlib.import_module(module)

    def get(self, name, *default):
        """The part registered as `name`; ValueError (one line, with the choices) otherwise, or `default` when one
        is given (as a dict's `get`)."""
        self._import_homes()
        if default:
            return dict.get(self, name, *default)
        try:
            return self[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of {sorted(self)}") from None

    def lookup(self, name_or_part):
        """`get(name)`, or the object itself when `passes(object)`."""
        if self.passes is not None and not isinstance(name_or_part, str) and self.passes(name_or_part):
            return name_or_part
        return self.get(name_or_part)

    def names(self) -> tuple[str, ...]:
        """The registered names, in the order they were registered."""
        self._import_homes()
        return tuple(dict.keys(self))

    def __getitem__(self, name):
        self._import_homes()
        return dict.__getitem__(self, name)

    def __contains__(self, name) -> bool:
        self._import_homes()
        return dict.__contains__(self, name)

    def __iter__(self):
        self._import_homes()
        return dict.__iter__(self)

    def __len__(self) -> int:
        self._import_homes()
        return dict.__len__(self)

    def values(self):
        self._import_homes()
        return dict.values(self)

    def items(self):
        self._import_homes()
        return dict.items(self)

    def __repr__(self) -> str:
        return f"Parts({self.kind!r}, {list(dict.keys(self))})"
