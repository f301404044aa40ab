"""Reward fine-tuning, the recipe (MATH.md §5.2): `builder` (the `target.name: reward` schema and registry entry),
`compose` (the run config from a pre-trained run, the report), and `RECIPE`, the command `tcsm finetune reward`.
The method's math is `tcsm.posttrain.reward`."""

from __future__ import annotations

from tcsm.recipes.spec import Flag, Option, RecipeSpec

DOC = """`tcsm finetune reward`: reward fine-tuning toward p^R ∝ p_1·exp(R/β) (N^full SNIS or N^1 tilted conditionals; MATH.md §5.2).

The run is an ordinary `tcsm train` run — same Trainer, checkpoints, --resume, logs and one-line errors — whose
config is the pre-trained run's config (data, path, model), then the `finetune-reward` preset (or `-c`), then
key=value overrides, then the flags below. The model starts from the pre-trained (EMA) weights and the target
is `target.name: reward` around a frozen copy of them (`tcsm.posttrain.reward.targets`):

    tcsm finetune reward --checkpoint runs/grid --reward grid --beta 1 --num-proposals 8 --steps 500
    tcsm finetune reward --checkpoint runs/ts --reward vader --prompt "Once upon a time, there was a" -o runs/ft
    tcsm finetune reward --resume -o runs/ft          # continue the run

Resume replays the trainer's state exactly; the x_t sample pool of `xt_source: pretrained | model` is not part
of a checkpoint and is redrawn on resume (so such runs continue statistically, not bit for bit).

After training, `--eval-samples N` sequences are drawn from the pre-trained and the fine-tuned model (with the
prompt) and their mean rewards are printed and written to `reward_eval.json`.
"""


def _describe(args, report: dict) -> str:
    return (
        f"mean reward over {report['num_samples']} samples: pre-trained {report['pretrained_reward_mean']:.4g} "
        f"± {report['pretrained_reward_stderr']:.2g}, fine-tuned {report['finetuned_reward_mean']:.4g} "
        f"± {report['finetuned_reward_stderr']:.2g}"
        + (f"; accuracy {report['pretrained_accuracy']:.3f} → {report['finetuned_accuracy']:.3f}"
           if "finetuned_accuracy" in report else "")
    )


RECIPE = RecipeSpec(
    name="reward",
    flags=(
        Flag("target.reward"),
        Flag("target.beta", positive=True),
        Flag("target.num_proposals", ("-B",), minimum=1),
        Flag("target.neighbourhood"),
        Flag("target.xt_source"),
        Flag("target.prompt"),
    ),
    options=(Option(("--eval-samples",), {"type": int, "default": 256,
                                          "help": "samples per model for the reward report (0: skip)"}),),
    report="report_of",
    describe=_describe,
    marks=("target.name", "reward"),
)
