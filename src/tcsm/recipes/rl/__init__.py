"""GRPO for diffusion LMs, the recipe: `builder` (the `objective.name: grpo` schema and registry entry), `compose`
(the run config from a trained run, the report) and `RECIPE`, the command `tcsm finetune rl`. The method's math is
`tcsm.posttrain.rl`."""

from __future__ import annotations

from tcsm.recipes.spec import Flag, Option, RecipeSpec

DOC = """`tcsm finetune rl`: reinforcement learning with a verifiable reward, the GRPO family for diffusion LMs.

The run is an ordinary `tcsm train` run — same Trainer, checkpoints, exact --resume (the rollout buffer included),
logs and one-line errors — whose config is the source run's (data, path, model), then the `finetune-rl` preset (or
`-c`), then key=value overrides, then the flags below. The policy starts from the source run's (EMA) weights, which
are also the frozen reference of the KL term. Each step draws --group-size rollouts per prompt of the batch with the
run's sampler (`sample:`), scores them with --reward, and takes the clipped GRPO step on the --estimator's sequence
log-likelihood: one_step (diffu-GRPO), elbo (the path's bound; --upper eubo|mix for SPG's sandwich) or exact (an
autoregressive policy). The reward is given as for `tcsm finetune reward`, so both families run on one task reward:

    tcsm finetune rl --from runs/sft --reward task:sudoku --estimator one_step --group-size 8 --steps 200
    tcsm finetune rl --from runs/sft --reward task:countdown --estimator elbo --upper eubo -o runs/spg
    tcsm finetune reward --from runs/sft --reward task:sudoku --neighbourhood n1      # TCSM reward tuning
    tcsm finetune rl --resume -o runs/spg

The log has reward, accuracy (share of rollouts with reward == objective.success), kl, clip_fraction and adv_std.
After training, --eval-prompts N held-out prompts get one completion from the source and from the fine-tuned model;
their mean reward and accuracy are printed and written to `rl_eval.json`.
"""


def _describe(args, report: dict) -> str:
    return (
        f"{report['num_prompts']} held-out prompts: reward {report['source_reward']:.4g} → "
        f"{report['finetuned_reward']:.4g}, accuracy {report['source_accuracy']:.3f} → {report['finetuned_accuracy']:.3f}"
    )


RECIPE = RecipeSpec(
    name="rl",
    help="GRPO for diffusion LMs with a verifiable reward (one_step / elbo (SPG) / exact likelihood estimates)",
    doc=DOC,
    source_help="the run to start from (and the KL reference): a denoiser, or an AR LM for --estimator exact",
    flags=(
        Flag("objective.reward"),
        Flag("objective.estimator"),
        Flag("objective.group_size", ("-G",), minimum=2),
        Flag("objective.clip_eps", positive=True),
        Flag("objective.kl_coef"),
        Flag("objective.num_iterations", minimum=1),
        Flag("objective.upper"),
        Flag("objective.num_t", minimum=1),
    ),
    options=(Option(("--eval-prompts",), {"type": int, "default": 64,
                                          "help": "held-out prompts for the before/after report (0: skip)"}),),
    report="report_of",
    describe=_describe,
    marks=("objective.name", "grpo"),
)
