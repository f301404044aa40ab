"""One pattern for a named part with options: a class with a `name` (and, where it takes options, a frozen
`settings_type` dataclass whose fields carry their help), registered in a `Parts` table by `@table.register`. The
table imports the modules that register the built-in parts (`homes`, by name, like a user's plugin) before it
answers, so a new part is one class in one module plus its registration, and the names a config or a flag accepts
are the table's keys, never a list kept by hand."""

from __future__ import annotations

import importlib
from collections.abc import Iterator

__all__ = ["Parts"]


class Parts:
    """name → class of one kind of part (`kind` names it in errors); `homes`: modules whose import registers the
    built-in ones."""

    def __init__(self, kind: str, homes: tuple[str, ...] = ()):
        self.kind, self.homes = kind, tuple(homes)
        self._parts: dict[str, type] = {}
        self._imported = False

    def register(self, cls: type) -> type:
        """Class decorator: make `cls` selectable by `cls.name`."""
        name = getattr(cls, "name", "")
        if not name or self._parts.get(name, cls) is not cls:
            raise ValueError(f"{self.kind} name {name!r} is empty or already registered")
        self._parts[name] = cls
        return cls

    def _import_homes(self) -> None:
        if not self._imported:
            self._imported = True
            for module in self.homes:
                importlib.import_module(module)

    def get(self, name: str) -> type:
        """The part registered as `name`; ValueError (one line, with the choices) otherwise."""
        self._import_homes()
        if name not in self._parts:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of {list(self._parts)}")
        return self._parts[name]

    def names(self) -> tuple[str, ...]:
        self._import_homes()
        return tuple(self._parts)

    def __contains__(self, name: str) -> bool:
        self._import_homes()
        return name in self._parts

    def __iter__(self) -> Iterator[type]:
        self._import_homes()
        return iter(list(self._parts.values()))

    def __repr__(self) -> str:
        return f"Parts({self.kind!r}, {list(self._parts)})"
