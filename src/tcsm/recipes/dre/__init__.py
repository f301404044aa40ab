"""Density-ratio post-training, the recipe (MATH.md §5.1): `builder` (the `objective.name: dre` and energy-model
schemas and registry entries), `compose` (the run config from the reference run, the report), and `RECIPE`, the
command `tcsm finetune dre`. The method's math is `tcsm.posttrain.dre`."""

from __future__ import annotations

from tcsm.recipes.spec import Flag, Option, RecipeSpec

DOC = """`tcsm finetune dre`: density-ratio post-training on a frozen reference (strategy i or ii energy model; MATH.md §5.1).

The run is an ordinary `tcsm train` run — same Trainer, checkpoints, --resume, logs and one-line errors — whose
config is the reference run's config (data, path), then the `finetune-dre` preset (or `-c`), then key=value
overrides, then the flags below:

* `--strategy ii` (default): the energy model p^θ ∝ p^ref·e^{f_θ}; only the ratio head trains (its trunk starts
  as a copy of the reference's), the reference stays frozen and is stored in the run's checkpoints, so the run
  directory is self-contained. It is sampled by SIR (`tcsm sample RUN --sir-k 4`) and evaluated by an
  importance-sampling *estimate* of its likelihood, printed beside the reference's valid bound (never as a bound).
* `--strategy i`: the student denoiser starts from the reference and fits r = p^θ/p^ref against a frozen reference
  (default: the `--from` run; `--reference ema | previous` for the EMA or the SPIN-like previous iterate).

    tcsm finetune dre --from runs/synthetic --bregman bce -n 4 --steps 500 -o runs/dre
    tcsm finetune dre --from runs/synthetic --strategy i --reference previous objective.refresh_every=50
    tcsm finetune dre --resume -o runs/dre            # continue the run

After training, `--eval-examples N` sequences of the eval split are scored and written to `dre_eval.json`.
"""


def _describe(args, report: dict) -> str:
    n = args.eval_examples
    if "bpc_estimate" in report:
        est = ", ".join(f"n={k}: {report[f'bpc_estimate_n{k}']:.4f}" for k in report["log_z_samples"])
        text = (
            f"reference valid bound {report['reference_bpc']:.4f} ± {report['reference_bpc_stderr']:.4f} bits/token; "
            f"energy model IS estimate (not a bound; log Ẑ biased low, so optimistic) {est}"
        )
    elif "finetuned_bpc" not in report:
        text = (f"reference valid bound {report['reference_bpc']:.4f} ± {report['reference_bpc_stderr']:.4f} "
                "bits/token; no energy-model estimate on this path (it needs the masked source)")  # fmt: skip
    else:
        ref = f"reference bound {report['reference_bpc']:.4f}, " if "reference_bpc" in report else ""
        text = f"{ref}fine-tuned bound {report['finetuned_bpc']:.4f} ± {report['finetuned_bpc_stderr']:.4f} bits/token"
    return f"{report['split']} split, {n} sequences: {text}"


RECIPE = RecipeSpec(
    name="dre",
    source_help="reference run, checkpoints or step_* directory",
    flags=(
        Flag("objective.strategy"),
        Flag("objective.bregman", ("--loss",)),
        Flag("objective.num_negatives", ("-n",), minimum=1),
        Flag("objective.reference"),
    ),
    options=(Option(("--eval-examples",), {"type": int, "default": 64,
                                           "help": "sequences scored for dre_eval.json after training (0: skip)"},
                    minimum=0),),
    report="report_of",
    describe=_describe,
)
