"""`tcsm train`: train a model from a preset or YAML config plus key=value overrides; --resume continues
a run exactly. Runs under `torchrun --nproc_per_node N -m tcsm.cli train ...` with DDP unchanged.

An existing run directory is only ever changed by --resume; a new run there is refused unless --overwrite."""

from __future__ import annotations

import argparse

HELP = "train a model (from a preset or YAML config, with key=value overrides)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from tcsm.cli.common import add_overwrite_argument, config_help

    p.epilog_fn = config_help
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides, e.g. train.steps=2000"
    )
    p.add_argument(
        "-c",
        "--config",
        help="preset name or YAML file (default: synthetic; with --resume: the run's). A YAML file is applied over the "
        "schema defaults; begin it with `extends: <preset>` to change a preset instead",
    )
    p.add_argument("-o", "--out", help="run directory (default: train.out_dir, else runs/<config>-<time>)")
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its latest complete checkpoint"
    )
    p.add_argument(
        "--resume-from",
        metavar="CHECKPOINT",
        help="continue from this run, checkpoints or step_* directory (the run directory is its run's unless --out)",
    )
    add_overwrite_argument(p)
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def resolve(args) -> tuple:
    """(config, run_dir, resume) from the arguments, without starting anything."""
    from pathlib import Path

    from tcsm.builders.config import load_config
    from tcsm.cli.common import DEFAULT_PRESET, default_run_dir, resume_point

    base, resume = None, None
    run_dir = Path(args.out) if args.out else None
    point = resume_point(args, run_dir)
    if point is not None:
        resume, run_dir, base = point
    preset = args.config if args.config is not None else (None if base is not None else DEFAULT_PRESET)
    cfg = load_config(preset, args.overrides, base=base)
    if run_dir is None:
        run_dir = Path(cfg.train.out_dir) if cfg.train.out_dir else default_run_dir(preset or "run")
    return cfg, run_dir, resume


def run(args) -> int:
    from omegaconf import OmegaConf

    from tcsm.cli.common import claim_run_dir

    cfg, run_dir, resume = resolve(args)
    if args.print_config:
        print(OmegaConf.to_yaml(cfg), end="")
        return 0
    claim_run_dir(run_dir, resume=resume is not None, overwrite=args.overwrite)
    return train(cfg, run_dir, resume, overwrite=args.overwrite)


def train(cfg, run_dir, resume=None, log=None, overwrite: bool = False) -> int:
    """`tcsm train`: fit, then say where the run lives."""
    import os

    from tcsm.train.fit import fit

    fit(cfg, run_dir, resume, log, overwrite=overwrite)
    if os.environ.get("RANK", "0") == "0":  # torchrun's rank; one line per run, not per process
        print(f"run directory: {run_dir}", flush=True)
    return 0
