"""`tcsm finetune dre`: density-ratio post-training of a pre-trained diffusion run (MATH.md §5.1).

The run is an ordinary `tcsm train` run — same Trainer, checkpoints, --resume, logs and one-line errors — whose
config is the reference run's config (data, path), then the `finetune-dre` preset (or `-c`), then key=value
overrides, then the flags below:

* `--strategy ii` (default): the energy model p^θ ∝ p^ref·e^{f_θ}; only the ratio head trains (its trunk starts
  as a copy of the reference's), the reference stays frozen and is stored in the run's checkpoints, so the run
  directory is self-contained. It is sampled by SIR (`tcsm sample RUN --sir-k 4`) and evaluated by an
  importance-sampling *estimate* of its likelihood, printed beside the reference's valid bound (never as a bound).
* `--strategy i`: the student denoiser starts from the reference and fits r = p^θ/p^ref against a frozen reference
  (default: the `--from` run; `--reference ema | previous` for the EMA or the SPIN-like previous iterate).

    tcsm finetune dre --from runs/synthetic --loss bce -n 4 --steps 500 -o runs/dre
    tcsm finetune dre --from runs/synthetic --strategy i --reference previous objective.refresh_every=50
    tcsm finetune dre --resume -o runs/dre            # continue the run

After training, `--eval-examples N` sequences of the eval split are scored and written to `dre_eval.json`.
"""

from __future__ import annotations

import argparse

HELP = "density-ratio post-training on a frozen reference (strategy i or ii energy model; MATH.md §5.1)"

#: flag → config key of the DRE recipe
DRE_FLAGS = {
    "strategy": "objective.strategy",
    "loss": "objective.loss",
    "num_negatives": "objective.num_negatives",
    "reference": "objective.reference",
    "steps": "train.steps",
}


def add_arguments(r: argparse.ArgumentParser) -> None:
    from tcsm.cli.common import add_config_arguments, add_source_run_argument, add_steps_and_resume_arguments

    add_source_run_argument(r, "reference run, checkpoints or step_* directory")
    add_config_arguments(r, "finetune-dre")
    r.add_argument(
        "--strategy", choices=("i", "ii"), help="i: student over p^ref | ii: energy model p^ref·e^f"
    )
    r.add_argument("--loss", choices=("lsif", "bce", "gkl"), help="Bregman DRE loss (bce = EDLM's NCE)")
    r.add_argument("-n", "--num-negatives", type=int, help="reference draws per noisy state")
    r.add_argument("--reference", help="strategy i: a checkpoint, ema or previous (default: the --from run)")
    add_steps_and_resume_arguments(r, "fine-tuning")
    r.add_argument(
        "--eval-examples",
        type=int,
        default=64,
        help="sequences scored for dre_eval.json after training (0: skip)",
    )
    r.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def resolve(args) -> tuple:
    """(config, run_dir, resume) of `tcsm finetune dre` from its arguments."""
    from tcsm.cli.common import resolve_recipe
    from tcsm.core.errors import ConfigError

    if args.num_negatives is not None and args.num_negatives < 1:
        raise ConfigError(f"--num-negatives must be >= 1, got {args.num_negatives}")
    if args.eval_examples < 0:
        raise ConfigError(f"--eval-examples must be >= 0, got {args.eval_examples}")

    def new_config(config: str, values: dict):
        from tcsm.recipes.dre.compose import dre_config

        if not args.checkpoint:
            raise ConfigError("give the reference run: tcsm finetune dre --from RUN_DIR (or --resume -o DIR)")
        return dre_config(args.checkpoint, config, args.overrides, values)

    return resolve_recipe(args, "finetune-dre", DRE_FLAGS, new_config)


def _describe(report: dict) -> str:
    if "bpc_estimate" in report:
        ns = report["log_z_samples"]
        est = ", ".join(f"n={n}: {report[f'bpc_estimate_n{n}']:.4f}" for n in ns)
        return (
            f"reference valid bound {report['reference_bpc']:.4f} ± {report['reference_bpc_stderr']:.4f} bits/token; "
            f"energy model IS estimate (not a bound; log Ẑ biased low, so optimistic) {est}"
        )
    ref = f"reference bound {report['reference_bpc']:.4f}, " if "reference_bpc" in report else ""
    return f"{ref}fine-tuned bound {report['finetuned_bpc']:.4f} ± {report['finetuned_bpc_stderr']:.4f} bits/token"


def run(args) -> int:
    from tcsm.cli.common import lazy_report, run_recipe

    report = lazy_report("tcsm.recipes.dre.compose:dre_report", args.eval_examples)
    n = args.eval_examples
    describe = lambda r: f"{r['split']} split, {n} sequences: {_describe(r)}"
    return run_recipe(args, *resolve(args), report=report, report_file="dre_eval.json", describe=describe)
