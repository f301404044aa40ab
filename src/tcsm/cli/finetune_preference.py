"""`tcsm finetune preference`: fine-tune a pre-trained diffusion checkpoint on chosen / rejected pairs (MATH.md §5.3).

The run is an ordinary `tcsm train` run — same Trainer, checkpoints, --resume, logs and one-line errors — whose
config is the pre-trained run's config (path, model), then the `finetune-preference` preset (or `-c`), then
key=value overrides, then the flags below. Data: `data.kind: pairs` over --pairs, a JSONL file with `prompt`,
`chosen` and `rejected` texts (write one from the model's own samples with `tcsm pairs`), tokenized with the
pre-trained run's tokenizer; prompts are conditioning, never noised or scored. The model starts from the
pre-trained (EMA) weights and a frozen copy of them is the reference:

    tcsm finetune preference --from runs/ts --pairs pairs.jsonl --loss paper --beta 1 -o runs/ts-pref
    tcsm finetune preference --from runs/ts --pairs pairs.jsonl --loss dpo --beta-dpo 0.1 -o runs/ts-dpo
    tcsm finetune preference --resume -o runs/ts-pref          # continue the run

Losses: `paper` is the paper's BCE with logits Δ − log β (β is a margin: larger pushes harder); `dpo` is
−log σ(β_DPO (Δ_w − Δ_l)). Validation (train.eval_every, and at the end) reports on the held-out pairs the
preference accuracy, the mean implicit reward margin and a KL estimate to the reference (metrics.jsonl, summary.json).
With `--eval-reward SPEC`, `--eval-samples N` samples of the reference and of the fine-tuned model are judged after
training (mean reward and sample entropy, written to preference_eval.json).
"""

from __future__ import annotations

import argparse

HELP = "preference fine-tuning on chosen/rejected pairs (paper BCE with margin β, or DPO-style; MATH.md §5.3)"

#: flag → config key of the preference recipe
PREFERENCE_FLAGS = {
    "loss": "objective.loss",
    "beta": "objective.beta",
    "beta_dpo": "objective.beta_dpo",
    "num_t": "objective.num_t",
    "truncate": "data.truncate",
    "steps": "train.steps",
}


def add_arguments(r: argparse.ArgumentParser) -> None:
    from tcsm.cli.common import add_config_arguments, add_source_run_argument, add_steps_and_resume_arguments

    add_source_run_argument(r, "pre-trained run, checkpoints or step_* directory (the reference and the start)")
    r.add_argument("--pairs", help="JSONL file of {prompt, chosen, rejected} records")
    add_config_arguments(r, "finetune-preference")
    r.add_argument("--loss", choices=("paper", "dpo"), help="paper BCE (margin β) or DPO-style (β_DPO)")
    r.add_argument("--beta", type=float, help="paper loss: margin β > 0 (larger pushes harder)")
    r.add_argument("--beta-dpo", type=float, help="dpo loss: inverse temperature β_DPO > 0")
    r.add_argument("--num-t", type=int, help="times t per pair and step")
    r.add_argument(
        "--truncate",
        action="store_true",
        default=None,
        help="cut responses that do not fit the model's length (default: refuse such pairs)",
    )
    add_steps_and_resume_arguments(r, "fine-tuning")
    r.add_argument("--eval-reward", help="after training, judge samples of both models with this reward spec")
    r.add_argument(
        "--eval-samples", type=int, default=128, help="samples per model for --eval-reward (default 128)"
    )
    r.add_argument("--eval-prompt", help="prompt of the --eval-reward samples")
    r.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def resolve(args) -> tuple:
    """(config, run_dir, resume) of `tcsm finetune preference` from its arguments."""
    from tcsm.cli.common import resolve_recipe
    from tcsm.core.errors import ConfigError

    for flag in ("beta", "beta_dpo"):
        v = getattr(args, flag)
        if v is not None and not v > 0:
            raise ConfigError(f"--{flag.replace('_', '-')} must be > 0, got {v}")
    if args.num_t is not None and args.num_t < 1:
        raise ConfigError(f"--num-t must be >= 1, got {args.num_t}")

    def new_config(config: str, values: dict):
        from tcsm.recipes.preference.compose import preference_config

        if not args.checkpoint or not args.pairs:
            raise ConfigError(
                "give the pre-trained model and the pairs: tcsm finetune preference --from RUN --pairs FILE "
                "(or --resume -o DIR)"
            )
        return preference_config(args.checkpoint, args.pairs, config, args.overrides, values)

    return resolve_recipe(args, "finetune-preference", PREFERENCE_FLAGS, new_config)


def _held_out_line(summary: dict) -> str | None:
    if "pref_accuracy" not in summary:
        return None
    return (
        f"held-out pairs ({summary['num_pairs']}): preference accuracy {summary['pref_accuracy']:.3f}, "
        f"implicit reward margin {summary['reward_margin']:.4g} ± {summary['reward_margin_stderr']:.2g} nats, "
        f"KL to the reference {summary['kl_ref']:.4g} nats/sequence"
    )


def run(args) -> int:
    from tcsm.cli.common import lazy_report, run_recipe

    report = lazy_report(
        "tcsm.recipes.preference.compose:preference_report", args.eval_samples, args.eval_reward,
        prompt=args.eval_prompt,
    )  # fmt: skip

    def describe(report: dict) -> str:
        return (
            f"{args.eval_reward} over {report['num_samples']} samples: reference {report['reference_reward_mean']:.4g} "
            f"± {report['reference_reward_stderr']:.2g} (entropy {report['reference_entropy']:.3f}), fine-tuned "
            f"{report['finetuned_reward_mean']:.4g} ± {report['finetuned_reward_stderr']:.2g} "
            f"(entropy {report['finetuned_entropy']:.3f})"
        )

    cfg, run_dir, resume = resolve(args)
    if args.eval_reward and args.eval_samples > 0:  # before training, not after it
        from tcsm.recipes.preference.compose import check_eval_reward

        check_eval_reward(args.eval_reward, cfg)
    return run_recipe(
        args,
        cfg,
        run_dir,
        resume,
        report=report if args.eval_reward else None,
        report_file="preference_eval.json",
        describe=describe,
        summarize=_held_out_line,
    )
