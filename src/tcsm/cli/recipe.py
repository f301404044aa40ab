"""A recipe's command from its spec (`tcsm.recipes.spec.RecipeSpec`): the source-run flag, `-c`, `-o`, key=value
overrides, one flag per config key the recipe exposes (type, choices and help from the config schema), its own
options, --steps / --resume / --resume-from / --print-config / --overwrite, then the run: compose the config from
the source run (or resume), train with the one Trainer, write the report."""

from __future__ import annotations

import argparse
import typing

from tcsm.recipes.spec import Flag, RecipeSpec, call_named, flag_field

__all__ = ["add_recipe_arguments", "flag_values", "run_recipe_spec"]

STEPS = Flag("train.steps", minimum=1)


def _flag_kwargs(spec: RecipeSpec, flag: Flag) -> dict:
    f, tp = flag_field(spec, flag)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    base = args[0] if args else tp
    help_text = f.metadata.get("help", "")
    kwargs: dict = {"dest": flag.dest, "help": f"{help_text} ({flag.key})" if help_text else flag.key}
    if base is bool:
        return {**kwargs, "action": "store_true", "default": None}
    if base in (int, float):
        kwargs["type"] = base
    if f.metadata.get("choices"):
        kwargs["choices"] = tuple(f.metadata["choices"])
    return kwargs


def add_recipe_arguments(p: argparse.ArgumentParser, spec: RecipeSpec) -> None:
    from tcsm.cli.common import add_config_arguments, add_overwrite_argument

    p.add_argument(*spec.source_flag, dest="checkpoint", metavar="RUN", help=spec.source_help)
    add_config_arguments(p, spec.preset)
    for flag in spec.flags:
        p.add_argument(flag.name, *flag.aliases, **_flag_kwargs(spec, flag))
    for option in spec.options:
        p.add_argument(*option.names, **option.kwargs)
    p.add_argument(STEPS.name, **{**_flag_kwargs(spec, STEPS), "help": "optimizer steps (train.steps)"})
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--resume-from", metavar="CHECKPOINT", help="continue from this checkpoint of the run")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    if "--overwrite" not in p._option_string_actions:
        add_overwrite_argument(p)


def flag_values(args, spec: RecipeSpec) -> dict:
    """{config key: value} of the recipe's flags given on the command line, checked against their bounds."""
    from tcsm.core.errors import ConfigError

    values = {}
    for flag in (*spec.flags, STEPS):
        v = getattr(args, flag.dest, None)
        if v is None:
            continue
        if flag.minimum is not None and v < flag.minimum:
            raise ConfigError(f"{flag.name} must be >= {flag.minimum}, got {v}")
        if flag.positive and not v > 0:
            raise ConfigError(f"{flag.name} must be > 0, got {v}")
        values[flag.key] = v
    return values


def run_recipe_spec(args, spec: RecipeSpec) -> int:
    from tcsm.cli.common import check_overwrite, resolve_recipe, run_recipe

    check_overwrite(args)
    values = flag_values(args, spec)
    if spec.check is not None:
        spec.check(args)

    def new_config(config: str, values: dict):
        return call_named(spec.compose, args, config, values)

    cfg, run_dir, resume = resolve_recipe(args, spec.preset, values, new_config)
    if spec.before_training is not None:
        spec.before_training(args, cfg)
    report = call_named(spec.report, args) if spec.report else None
    summarize = (lambda summary: spec.summarize(args, run_dir, cfg, summary)) if spec.summarize else None
    return run_recipe(args, cfg, run_dir, resume, report=report, report_file=spec.report_file,
                      describe=lambda r: spec.describe(args, r), summarize=summarize)  # fmt: skip
