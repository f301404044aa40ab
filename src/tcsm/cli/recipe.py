"""A recipe's command from its spec (`tcsm.recipes.spec.RecipeSpec`): the source-run flag, `-c`, `-o`, key=value
overrides, one flag per config key the recipe exposes (type, choices and help from the config schema), its own
options, --steps / --resume / --resume-from / --print-config / --overwrite, then the run: compose the config from
the source run (or resume), train with the one Trainer, write the report."""

from __future__ import annotations

import argparse
import typing
from collections.abc import Callable
from pathlib import Path

from tcsm.recipes.spec import Flag, RecipeSpec, call_named, flag_field

__all__ = ["add_recipe_arguments", "flag_values", "resolve_recipe", "run_recipe", "run_recipe_spec"]

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
    for option in spec.options:
        v = getattr(args, option.dest, None)
        if option.minimum is not None and v is not None and v < option.minimum:
            raise ConfigError(f"{option.names[0]} must be >= {option.minimum}, got {v}")
    return values


def run_recipe_spec(args, spec: RecipeSpec) -> int:
    from tcsm.cli.common import check_overwrite

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


def resolve_recipe(args, preset: str, values: dict, new_config: Callable) -> tuple:
    """(config, run_dir, resume) of a recipe run. A resumed run starts from its saved config, which must be one
    this recipe trains; a new one from `new_config(config_name, flag_values)`, which builds it from the recipe's
    source run (and refuses a missing one); `values` are the flags' {config key: value}, with `preset` as the default -c and the label of the default run
    directory."""
    from tcsm.builders.config import load_config, set_values
    from tcsm.cli.common import command_of, default_run_dir, import_hf_source, resume_point
    from tcsm.core.errors import ConfigError

    run_dir = Path(args.out) if args.out else None
    point = resume_point(args, run_dir)
    if point is not None:
        checkpoint, run_dir, base = point
        mine, theirs = command_of(load_config(preset)), command_of(base or {})
        if theirs != mine:  # e.g. `tcsm finetune preference --resume -o RUN_OF_ANOTHER_RECIPE`
            raise ConfigError(
                f"{str(run_dir)!r} is a `{theirs}` run, not a `{mine}` run; continue it with `{theirs} --resume`"
            )
        return set_values(load_config(args.config, args.overrides, base=base), values), run_dir, checkpoint
    imported = import_hf_source(args, preset)
    if imported is not None:
        run_dir = imported
    cfg = new_config(args.config or preset, values)
    if run_dir is None:
        run_dir = Path(cfg.train.out_dir) if cfg.train.out_dir else default_run_dir(preset)
    return cfg, run_dir, None


def run_recipe(
    args,
    cfg,
    run_dir,
    resume,
    *,
    report: Callable[[Path], dict] | None,
    report_file: str,
    describe: Callable[[dict], str],
    summarize: Callable[[dict], str | None] | None = None,
) -> int:
    """The tail of a recipe run: --print-config, or train with `fit`, then on rank 0 say where the run lives,
    print `summarize(fit's summary)` when it gives a line, and — unless `report` is None (the recipe's evaluation
    is off) — write `report(run_dir)` to `run_dir/report_file` and print `describe(report)`."""
    import os

    from tcsm.cli.common import write_json_report

    if args.print_config:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(cfg), end="")
        return 0
    from tcsm.train.fit import fit

    summary = fit(cfg, run_dir, resume, overwrite=getattr(args, "overwrite", False))
    # torchrun's other ranks have nothing to add, and their own run_dir may carry another time stamp than rank 0's.
    if os.environ.get("RANK", "0") != "0":
        return 0
    print(f"run directory: {run_dir}", flush=True)
    line = summarize(summary) if summarize is not None else None
    if line:
        print(line, flush=True)
    if report is not None:
        result = report(Path(run_dir))
        write_json_report(Path(run_dir) / report_file, result)
        print(describe(result), flush=True)
    return 0
