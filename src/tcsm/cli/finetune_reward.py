"""`tcsm finetune reward`: fine-tune a pre-trained diffusion checkpoint toward p^R ∝ p_1 e^{R/β} (MATH.md §5.2).

The run is an ordinary `tcsm train` run — same Trainer, checkpoints, --resume, logs and one-line errors — whose
config is the pre-trained run's config (data, path, model), then the `finetune-reward` preset (or `-c`), then
key=value overrides, then the flags below. The model starts from the pre-trained (EMA) weights and the target
is `target.name: reward` around a frozen copy of them (`tcsm.targets.reward_tilt`):

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
import json

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
    from tcsm.cli.common import config_help

    r.epilog_fn = config_help
    r.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. optim.lr=1e-4")
    r.add_argument("-k", "--checkpoint", help="pre-trained run, checkpoints or step_* directory")
    r.add_argument(
        "-c", "--config", help="preset or YAML file (default: finetune-reward; with --resume: the run's)"
    )
    r.add_argument(
        "-o", "--out", help="run directory (default: train.out_dir, else runs/finetune-reward-<time>)"
    )
    r.add_argument(
        "--reward", help="reward spec: grid | vader | profanity | hf:PATH[,label=1] | python:mod:fn"
    )
    r.add_argument("--beta", type=float, help="temperature β > 0 (small: maximise reward; large: stay close)")
    r.add_argument("-B", "--num-proposals", type=int, help="N^full proposals per noisy state")
    r.add_argument("--neighbourhood", choices=("full", "n1"), help="N^full (default) or N^1")
    r.add_argument("--xt-source", choices=("data", "pretrained", "model"), help="where x_t comes from")
    r.add_argument("--prompt", help="text pinned at the start of every sequence (conditioning)")
    r.add_argument("--steps", type=int, help="optimizer steps (train.steps)")
    r.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its latest checkpoint"
    )
    r.add_argument("--resume-from", metavar="CHECKPOINT", help="continue from this fine-tuning checkpoint")
    r.add_argument(
        "--eval-samples", type=int, default=256, help="samples per model for the reward report (0: skip)"
    )
    r.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


# --------------------------------------------------------------------------------------------------- config


def _flag_values(args) -> dict:
    return {
        key: getattr(args, flag)
        for flag, key in REWARD_FLAGS.items()
        if getattr(args, flag, None) is not None
    }


def resolve(args) -> tuple:
    """(config, run_dir, resume) of `tcsm finetune reward` from its arguments."""
    from pathlib import Path

    from tcsm.build.config import load_config, set_values
    from tcsm.cli.common import default_run_dir, resume_point
    from tcsm.errors import ConfigError
    from tcsm.recipes.reward import reward_config

    run_dir = Path(args.out) if args.out else None
    if args.num_proposals is not None and args.num_proposals < 1:
        raise ConfigError(f"--num-proposals must be >= 1, got {args.num_proposals}")
    if args.beta is not None and not args.beta > 0:
        raise ConfigError(f"--beta must be > 0, got {args.beta}")
    point = resume_point(args, run_dir)
    if point is not None:
        checkpoint, run_dir, base = point
        cfg = set_values(load_config(args.config, args.overrides, base=base), _flag_values(args))
        return cfg, run_dir, checkpoint
    if not args.checkpoint:
        raise ConfigError(
            "give the pre-trained model: tcsm finetune reward --checkpoint RUN_DIR (or --resume -o DIR)"
        )
    cfg = reward_config(args.checkpoint, args.config or "finetune-reward", args.overrides, _flag_values(args))
    if run_dir is None:
        run_dir = Path(cfg.train.out_dir) if cfg.train.out_dir else default_run_dir("finetune-reward")
    return cfg, run_dir, None


def run(args) -> int:
    import os
    from pathlib import Path

    from omegaconf import OmegaConf

    cfg, run_dir, resume = resolve(args)
    if args.print_config:
        print(OmegaConf.to_yaml(cfg), end="")
        return 0
    from tcsm.recipes.reward import reward_report
    from tcsm.train.fit import fit

    fit(cfg, run_dir, resume, overwrite=getattr(args, "overwrite", False))
    print(f"run directory: {run_dir}", flush=True)
    if args.eval_samples > 0 and int(os.environ.get("RANK", "0")) == 0:
        report = reward_report(run_dir, args.eval_samples)
        (Path(run_dir) / "reward_eval.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(
            f"mean reward over {report['num_samples']} samples: pre-trained {report['pretrained_reward_mean']:.4g} "
            f"± {report['pretrained_reward_stderr']:.2g}, fine-tuned {report['finetuned_reward_mean']:.4g} "
            f"± {report['finetuned_reward_stderr']:.2g}",
            flush=True,
        )
    return 0
