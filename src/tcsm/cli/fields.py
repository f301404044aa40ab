"""Command-line flags derived from a settings dataclass, as the recipes derive theirs from the config schema: one
flag per field (`--<name>`, `_` → `-`), its type and help from the field. A bool field that defaults to True is
`--no-<name>`, one that defaults to False `--<name>`; an `X | None` field also takes `none`; a tuple field takes as
many values as it has. Only the flags given on the command line come back (`given`), so an unset flag never hides
the run's own value."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import MISSING

__all__ = ["add_field_flags", "flag_name", "given"]

#: what a flag of an `X | None` field reads as None
NONE_WORDS = ("none", "null")


def flag_name(f: dataclasses.Field) -> str:
    default = f.default if f.default is not MISSING else None
    stem = f.name.replace("_", "-")
    return f"--no-{stem}" if default is True else f"--{stem}"


def _parser(base: type, optional: bool):
    def parse(text: str):
        if optional and text.lower() in NONE_WORDS:
            return None
        try:
            return base(text)
        except ValueError:
            kind = {int: "an integer", float: "a number"}.get(base, base.__name__)
            raise argparse.ArgumentTypeError(
                f"expected {kind}{' or none' if optional else ''}, got {text!r}"
            ) from None

    parse.__name__ = base.__name__
    return parse


def add_field_flags(p, schema: type, *, dest: str, aliases: dict | None = None, choices: dict | None = None,
                    skip=()) -> None:  # fmt: skip
    """A flag per field of `schema` (a dataclass), stored as `<dest>.<field>` in the namespace (default: not given)."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if f.name in skip:
            continue
        tp = hints.get(f.name, f.type)
        args = typing.get_args(tp)
        optional = type(None) in args
        base = next((a for a in args if a is not type(None)), tp) if optional else tp
        kwargs: dict = {"dest": f"{dest}.{f.name}", "default": argparse.SUPPRESS, "help": f.metadata.get("help", "")}
        if base is bool:
            kwargs.update(action="store_const", const=not (f.default is True))
            if f.default is True:
                kwargs["help"] = f"turn off: {kwargs['help']}"
        elif typing.get_origin(base) is tuple:
            inner = typing.get_args(base)
            kwargs.update(nargs=len(inner), type=_parser(inner[0], False), metavar=tuple(a.__name__.upper() for a in inner))
        else:
            kwargs.update(type=_parser(base, optional) if base in (int, float) else None)
            if kwargs["type"] is None:
                kwargs.pop("type")
                if optional:
                    kwargs["type"] = lambda text: None if text.lower() in NONE_WORDS else text
            if (choices or {}).get(f.name):
                kwargs["choices"] = tuple(choices[f.name])
                kwargs["metavar"] = f.name.upper()
            else:
                kwargs["metavar"] = f.name.upper()
        p.add_argument(flag_name(f), *(aliases or {}).get(f.name, ()), **kwargs)


def given(args, dest: str) -> dict:
    """{field: value} of the flags of `add_field_flags(..., dest=dest)` given on the command line."""
    prefix = dest + "."
    return {k[len(prefix):]: (tuple(v) if isinstance(v, list) else v) for k, v in vars(args).items()
            if k.startswith(prefix)}  # fmt: skip
