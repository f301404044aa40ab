"""A post-training recipe, declared once: its command, preset, the run it starts from, its flags — each a config key,
whose type, choices and help come from the config schema (as a `<Method>Config` field is a flag in TRL) — how it
composes the run config from the source run, and its report. `tcsm finetune <name>` and `tcsm distill` are built
from these specs (`tcsm.cli.recipe`); the recipes are found by listing this package, so a new method adds its
folder here and nothing else outside its own files."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Flag", "Option", "RecipeSpec", "all_recipes", "call_named", "flag_field", "from_source", "lazy_report", "recipe", "recipe_of"]


@dataclass(frozen=True)
class Flag:
    """A command-line flag that sets the config key `key` (`--<last part of the key>`, `_` → `-`, plus `aliases`).
    Type, choices (the field's `choices` metadata) and help come from the schema; `minimum` / `positive` are the
    bounds the flag checks before any work."""

    key: str
    aliases: tuple[str, ...] = ()
    minimum: int | None = None
    positive: bool = False

    @property
    def dest(self) -> str:
        return self.key.rsplit(".", 1)[1]

    @property
    def name(self) -> str:
        return "--" + self.dest.replace("_", "-")


@dataclass(frozen=True)
class Option:
    """A flag that is not a config key (the report's sample count, an input file): argparse arguments as given;
    `minimum`: the bound a number given checks before any work."""

    names: tuple[str, ...]
    kwargs: dict = field(default_factory=dict)
    minimum: int | None = None

    @property
    def dest(self) -> str:
        return self.kwargs.get("dest") or self.names[0].lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class RecipeSpec:
    """A recipe states only what differs from the conventions: `doc` its package's DOC, whose first line is the
    `help`, `preset` finetune-<name>, `compose`
    tcsm.recipes.<name>.compose:compose, a `report` named by its function in that module ("report_of") written to
    <name>_eval.json, runs marked by objective.name = <name>, and a pre-trained source run."""

    name: str  # `tcsm finetune <name>`
    #: one line for `tcsm finetune --help` ("": the first line of `doc`, after the command's name)
    help: str = ""
    #: the command's description (`tcsm finetune <name> --help`; "": the recipe package's `DOC`)
    doc: str = ""
    preset: str = ""  # its default `-c`, and the label of its default run directory ("": finetune-<name>)
    #: "module:function" (args, config name, {key: value}) → run config, from the source run ("": the convention)
    compose: str = ""
    source_help: str = "pre-trained run, checkpoints or step_* directory"  # what --from names
    flags: tuple[Flag, ...] = ()
    options: tuple[Option, ...] = ()
    #: what the data-kind flags (`data.*`) are keys of: the data kind the recipe composes
    data_kind: str | None = None
    #: "module:function" (args) → Callable[[run_dir], dict] | None: the report made after training (None: off); a
    #: bare function name is one of the recipe's compose module
    report: str | None = None
    report_file: str = ""  # "": <name>_eval.json when there is a report
    describe: Callable[[Any, dict], str] = lambda args, report: ""
    #: (args, run_dir, cfg, the run's final summary) → a line printed after training, or None
    summarize: Callable[[Any, Any, Any, dict], str | None] | None = None
    check: Callable[[Any], None] | None = None  # (args) → raise ConfigError on a bad combination, before any work
    before_training: Callable[[Any, Any], None] | None = None  # (args, cfg): checks that need the config
    #: (config key, value) that marks a run of this recipe (a resumed run must be one); ("", ""): objective.name
    marks: tuple[str, str] = ("", "")
    command: tuple[str, ...] = ()  # the command words; default ("finetune", name)
    source_flag: tuple[str, ...] = ("--from", "-k", "--checkpoint")

    def __post_init__(self):
        module = f"tcsm.recipes.{self.name}.compose"
        # the spec is made in its package, whose DOC is set by then
        doc = self.doc or getattr(sys.modules.get(f"tcsm.recipes.{self.name}"), "DOC", "")
        conventions = {
            "doc": doc,
            "help": self.help or doc.partition("\n")[0].partition("`: ")[2].rstrip("."),
            "preset": self.preset or f"finetune-{self.name}",
            "compose": self.compose or f"{module}:compose",
            "report": self.report if not self.report or ":" in self.report else f"{module}:{self.report}",
            "report_file": self.report_file or (f"{self.name}_eval.json" if self.report else ""),
            "marks": self.marks if self.marks[0] else ("objective.name", self.name),
        }
        for key, value in conventions.items():
            object.__setattr__(self, key, value)

    @property
    def words(self) -> tuple[str, ...]:
        return self.command or ("finetune", self.name)


def from_source(args, build: Callable, config: str, values: dict, what: str, command: str, flag: str = "--from"):
    """`build(source run, config, overrides, values)`: a recipe's run config composed from its source run, which the
    command line must name (ConfigError in one line otherwise)."""
    from tcsm.core.errors import ConfigError

    if not args.checkpoint:
        raise ConfigError(f"give {what}: tcsm {command} {flag} RUN_DIR (or --resume -o DIR)")
    return build(args.checkpoint, config, args.overrides, values)


def call_named(spec: str, *args, **kwargs):
    """`module.function(*args, **kwargs)` for spec "module:function", importing the module when called."""
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)(*args, **kwargs)


def recipe(name: str) -> RecipeSpec:
    """The spec of the recipe `name` (its package `tcsm.recipes.<name>` defines `RECIPE`)."""
    return importlib.import_module(f"tcsm.recipes.{name}").RECIPE


def all_recipes() -> list[RecipeSpec]:
    """Every recipe package under tcsm.recipes, by name."""
    import tcsm.recipes as package

    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if m.ispkg)
    return [recipe(n) for n in names]


def _schema_of_section(spec: RecipeSpec, section: str) -> type:
    from tcsm.builders.config import load_config
    from tcsm.builders.schema import COMPONENTS, RunConfig

    if section == "data" and spec.data_kind is not None:
        return COMPONENTS["data"][2](spec.data_kind)
    if section in COMPONENTS:
        key, default, schema_of = COMPONENTS[section]
        cfg = load_config(spec.preset)
        return schema_of(str(cfg[section].get(key, default)))
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    return fields[section].default_factory  # type: ignore[return-value]


def flag_field(spec: RecipeSpec, flag: Flag) -> tuple[dataclasses.Field, Any]:
    """(the schema field `flag.key` names, its resolved type); KeyError if the schema has no such key."""
    section, leaf = flag.key.split(".", 1)
    schema = _schema_of_section(spec, section)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    if leaf not in fields:
        raise KeyError(f"recipe {spec.name}: flag {flag.name} names {flag.key}, which the config schema has not")
    hints = typing.get_type_hints(schema)
    return fields[leaf], hints.get(leaf, fields[leaf].type)


def recipe_of(cfg) -> RecipeSpec | None:
    """The recipe whose runs `cfg` (a dict or a DictConfig) describes, by its `marks`; None: a `tcsm train` run."""
    for spec in all_recipes():
        section, _, key = spec.marks[0].partition(".")
        node = cfg.get(section) if isinstance(cfg, dict) else getattr(cfg, section, None)
        if node is not None and node.get(key) == spec.marks[1]:
            return spec
    return None


def lazy_report(spec: str, count: int, *args, **kwargs) -> Callable | None:
    """`run_dir -> module.function(run_dir, count, *args, **kwargs)` for spec "module:function", importing the
    module only when the report is made (a recipe's evaluation imports what `--help` should not); None when
    `count` (the examples or samples it evaluates) is 0: the evaluation is off."""
    if count <= 0:
        return None

    def report(run_dir):
        return call_named(spec, run_dir, count, *args, **kwargs)

    return report
