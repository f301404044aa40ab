"""`tcsm finetune reward`: fine-tune a pre-trained diffusion checkpoint toward p^R ∝ p_1 e^{R/β} (MATH.md §5.2).

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

from __future__ import annotations

import argparse

HELP = "reward fine-tuning toward p^R ∝ p_1·exp(R/β) (N^full SNIS or N^1 tilted conditionals; MATH.md §5.2)"

#: flag → config key of the reward recipe
REWARD_FLAGS = {
    "reward": "target.reward",
    "beta": "target.beta",
    "num_proposals": "target.num_proposals",
    "neighbourhood": "target.neighbourhood",
    "xt_source": "target.xt_source",
    "prompt": "target.prompt",
    "steps": "train.steps",
}


def add_arguments(r: argparse.ArgumentParser) -> None:
    from tcsm.cli.common import add_config_arguments, add_source_run_argument, add_steps_and_resume_arguments

    add_source_run_argument(r, "pre-trained run, checkpoints or step_* directory")
    add_config_arguments(r, "finetune-reward")
    r.add_argument(
        "--reward", help="reward spec: grid | vader | profanity | hf:PATH[,label=1] | python:mod:fn"
    )
    r.add_argument("--beta", type=float, help="temperature β > 0 (small: maximise reward; large: stay close)")
    r.add_argument("-B", "--num-proposals", type=int, help="N^full proposals per noisy state")
    r.add_argument("--neighbourhood", choices=("full", "n1"), help="N^full (default) or N^1")
    r.add_argument("--xt-source", choices=("data", "pretrained", "model"), help="where x_t comes from")
    r.add_argument("--prompt", help="text pinned at the start of every sequence (conditioning)")
    add_steps_and_resume_arguments(r, "fine-tuning")
    r.add_argument(
        "--eval-samples", type=int, default=256, help="samples per model for the reward report (0: skip)"
    )
    r.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def resolve(args) -> tuple:
    """(config, run_dir, resume) of `tcsm finetune reward` from its arguments."""
    from tcsm.cli.common import resolve_recipe
    from tcsm.core.errors import ConfigError

    if args.num_proposals is not None and args.num_proposals < 1:
        raise ConfigError(f"--num-proposals must be >= 1, got {args.num_proposals}")
    if args.beta is not None and not args.beta > 0:
        raise ConfigError(f"--beta must be > 0, got {args.beta}")

    def new_config(config: str, values: dict):
        from tcsm.recipes.reward.compose import reward_config

        if not args.checkpoint:
            raise ConfigError(
                "give the pre-trained model: tcsm finetune reward --checkpoint RUN_DIR (or --resume -o DIR)"
            )
        return reward_config(args.checkpoint, config, args.overrides, values)

    return resolve_recipe(args, "finetune-reward", REWARD_FLAGS, new_config)


def _describe(report: dict) -> str:
    return (
        f"mean reward over {report['num_samples']} samples: pre-trained {report['pretrained_reward_mean']:.4g} "
        f"± {report['pretrained_reward_stderr']:.2g}, fine-tuned {report['finetuned_reward_mean']:.4g} "
        f"± {report['finetuned_reward_stderr']:.2g}"
    )


def run(args) -> int:
    from tcsm.cli.common import lazy_report, run_recipe

    report = lazy_report("tcsm.recipes.reward.compose:reward_report", args.eval_samples)
    return run_recipe(args, *resolve(args), report=report, report_file="reward_eval.json", describe=_describe)
