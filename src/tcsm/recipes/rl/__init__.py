"""GRPO for diffusion LMs, the recipe: `builder` (the `objective.name: grpo` schema and registry entry), `compose`
(the run config from a trained run, the report) and `RECIPE`, the command `tcsm finetune rl`. The method's math is
`tcsm.posttrain.rl`."""

from __future__ import annotations

from tcsm.recipes.spec import Flag, Option, RecipeSpec

DOC = """`tcsm finetune rl`: GRPO for diffusion LMs with a verifiable reward (one_step / elbo (SPG) / exact likelihood estimates).

The run is an ordinary `tcsm train` run — same Trainer, checkpoints, exact --resume (the rollout buffer included),
logs and one-line errors — whose config is the source run's (data, path, model), then the `finetune-rl` preset (or
`-c`), then key=value overrides, then the flags below. The policy starts from the source run's (EMA) weights, which
are also the frozen reference of the KL term. Each step draws --group-size rollouts per prompt of the batch with the
run's sampler (`sample:`), scores them with --reward, and takes the clipped GRPO step on the --estimator's sequence
log-likelihood: one_step (d1's one-step estimate), elbo (the path's bound; --upper eubo|mix for SPG's sandwich) or
exact (an autoregressive policy). By exact enumeration on a tiny policy, the one-step estimate's expected gradient has
cosine 0.20-0.22 with the true policy gradient and the ELBO's 0.72-0.75 (docs/tasks.md). As d1 does, completion
tokens after the first end-of-sequence token are left out of the loss (objective.keep_after_eos=true keeps them);
unlike d1, advantages are divided by the group's std (objective.scale_advantages=false is d1's). The reward is given as for `tcsm finetune reward`, so both families run on one task reward:

    tcsm finetune rl --from runs/sft --reward task:sudoku --estimator one_step --group-size 8 --steps 200
    tcsm finetune rl --from runs/sft --reward task:countdown --estimator elbo --upper eubo -o runs/spg
    tcsm finetune reward --from runs/sft --reward task:sudoku --neighbourhood n1      # TCSM reward tuning
    tcsm finetune rl --resume -o runs/spg

Each log step prints the reward's mean and std, accuracy (share of rollouts with reward == objective.success), the
share of flat groups (all rewards equal: no gradient; a step where every group is flat warns), kl and clip
fraction; metrics.jsonl also has adv_std and ratio.
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
                                          "help": "held-out prompts for the before/after report (0: skip)"},
                    minimum=0),),
    report="report_of",
    describe=_describe,
    marks=("objective.name", "grpo"),
)
