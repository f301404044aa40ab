"""`tcsm demo grid`: the paper's 2-D grid reward experiment in one command (App. E, `fig:grid_samples`).

Pre-trains a denoiser on the 128×128 grid distribution (uniform source, L_distrib), fine-tunes it with
N^full reward weights toward R = 0 on the left half and R = −10^5 on the right half, and writes to the output
directory the two training runs, `grid_dynamics.png` (sample histograms at intermediate sampling steps before
and after fine-tuning) and `metrics.json` (right-half fraction before/after, total variation of the fine-tuned
samples to the data restricted to the left half). A few minutes on 2 CPU cores; re-running resumes.
"""

from __future__ import annotations

import argparse

HELP = "run a demo end to end (grid: the paper's 128x128 reward fine-tuning experiment)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="demo", metavar="<demo>", parser_class=type(p))
    g = sub.add_parser(
        "grid",
        help="pre-train on the 128x128 grid, reward fine-tune away the right half, plot",
        description=__doc__,
    )
    g.add_argument("-o", "--out", help="output directory (default: runs/demo-grid-<time>)")
    g.add_argument(
        "--size",
        choices=("full", "test"),
        default="full",
        help="full: the 128x128 demo; test: a 32x32 version in seconds (what the tests run)",
    )
    g.add_argument(
        "--pretrain",
        nargs="*",
        default=[],
        metavar="key=value",
        help="overrides of the demo-grid preset (pre-training), e.g. train.steps=3000",
    )
    g.add_argument(
        "--finetune",
        nargs="*",
        default=[],
        metavar="key=value",
        help="overrides of the finetune-grid preset, e.g. target.num_proposals=16 target.beta=0.5",
    )
    g.add_argument(
        "--samples", type=int, default=20000, help="points sampled from each model (default 20000)"
    )
    g.add_argument("--steps", type=int, default=64, help="sampler steps (default 64)")
    g.add_argument("--seed", type=int, default=0, help="seed of the evaluation samples")


def run(args) -> int:
    import json
    import sys
    import time
    from pathlib import Path

    from tcsm.cli.common import default_run_dir
    from tcsm.core.errors import ConfigError

    if getattr(args, "demo", None) is None:
        print("tcsm demo: error: choose a demo: tcsm demo grid --help", file=sys.stderr)
        return 2
    if args.samples < 1 or args.steps < 1:
        raise ConfigError("--samples and --steps must be >= 1")
    from tcsm.demos.grid import run_grid_demo

    out = Path(args.out) if args.out else default_run_dir("demo-grid")
    start = time.perf_counter()
    metrics = run_grid_demo(
        out,
        size=args.size,
        pretrain_overrides=args.pretrain,
        finetune_overrides=args.finetune,
        num_samples=args.samples,
        sample_steps=args.steps,
        seed=args.seed,
    )
    minutes, seconds = divmod(time.perf_counter() - start, 60)
    print(f"\n== grid demo done in {int(minutes)}m{seconds:04.1f}s: {out}")
    print(
        f"  right-half fraction   data {metrics['right_fraction_data']:.3f}   pre-trained "
        f"{metrics['right_fraction_before']:.4f}   fine-tuned {metrics['right_fraction_after']:.4f}"
    )
    print(
        f"  TV(fine-tuned samples, data | left half) {metrics['tv_after_to_left_data']:.3f}   (an exact sample of "
        f"the same size: {metrics['tv_exact_sample_to_left_data']:.3f})"
    )
    print(f"  figure  {out / 'grid_dynamics.png'}\n  metrics {out / 'metrics.json'}")
    json.dumps(metrics)  # fail loudly here, not in a reader, if a value is not JSON
    return 0
