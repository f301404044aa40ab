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
import json

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
    from tcsm.cli.common import config_help

    r.epilog_fn = config_help
    r.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. optim.lr=1e-4")
    r.add_argument(
        "--from",
        "-k",
        "--checkpoint",
        dest="checkpoint",
        help="pre-trained run, checkpoints or step_* directory (the reference and the start)",
    )
    r.add_argument("--pairs", help="JSONL file of {prompt, chosen, rejected} records")
    r.add_argument(
        "-c", "--config", help="preset or YAML file (default: finetune-preference; with --resume: the run's)"
    )
    r.add_argument(
        "-o", "--out", help="run directory (default: train.out_dir, else runs/finetune-preference-<time>)"
    )
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
    r.add_argument("--steps", type=int, help="optimizer steps (train.steps)")
    r.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its latest checkpoint"
    )
    r.add_argument("--resume-from", metavar="CHECKPOINT", help="continue from this fine-tuning checkpoint")
    r.add_argument("--eval-reward", help="after training, judge samples of both models with this reward spec")
    r.add_argument(
        "--eval-samples", type=int, default=128, help="samples per model for --eval-reward (default 128)"
    )
    r.add_argument("--eval-prompt", help="prompt of the --eval-reward samples")
    r.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def _flag_values(args) -> dict:
    return {
        key: getattr(args, flag)
        for flag, key in PREFERENCE_FLAGS.items()
        if getattr(args, flag, None) is not None
    }


def resolve(args) -> tuple:
    """(config, run_dir, resume) of `tcsm finetune preference` from its arguments."""
    from pathlib import Path

    from tcsm.build.config import load_config, set_values
    from tcsm.cli.common import default_run_dir, resume_point
    from tcsm.errors import ConfigError
    from tcsm.recipes.preference import preference_config

    for flag in ("beta", "beta_dpo"):
        v = getattr(args, flag)
        if v is not None and not v > 0:
            raise ConfigError(f"--{flag.replace('_', '-')} must be > 0, got {v}")
    if args.num_t is not None and args.num_t < 1:
        raise ConfigError(f"--num-t must be >= 1, got {args.num_t}")
    run_dir = Path(args.out) if args.out else None
    point = resume_point(args, run_dir)
    if point is not None:
        checkpoint, run_dir, base = point
        cfg = set_values(load_config(args.config, args.overrides, base=base), _flag_values(args))
        return cfg, run_dir, checkpoint
    if not args.checkpoint or not args.pairs:
        raise ConfigError(
            "give the pre-trained model and the pairs: tcsm finetune preference --from RUN --pairs FILE "
            "(or --resume -o DIR)"
        )
    cfg = preference_config(
        args.checkpoint, args.pairs, args.config or "finetune-preference", args.overrides, _flag_values(args)
    )
    if run_dir is None:
        run_dir = Path(cfg.train.out_dir) if cfg.train.out_dir else default_run_dir("finetune-preference")
    return cfg, run_dir, None


def run(args) -> int:
    import os
    from pathlib import Path

    from omegaconf import OmegaConf

    cfg, run_dir, resume = resolve(args)
    if args.print_config:
        print(OmegaConf.to_yaml(cfg), end="")
        return 0
    from tcsm.train.fit import fit

    summary = fit(cfg, run_dir, resume, overwrite=getattr(args, "overwrite", False))
    print(f"run directory: {run_dir}", flush=True)
    if "pref_accuracy" in summary:
        print(
            f"held-out pairs ({summary['num_pairs']}): preference accuracy {summary['pref_accuracy']:.3f}, "
            f"implicit reward margin {summary['reward_margin']:.4g} ± {summary['reward_margin_stderr']:.2g} nats, "
            f"KL to the reference {summary['kl_ref']:.4g} nats/sequence",
            flush=True,
        )
    if args.eval_reward and args.eval_samples > 0 and int(os.environ.get("RANK", "0")) == 0:
        from tcsm.recipes.preference import preference_report

        report = preference_report(run_dir, args.eval_samples, args.eval_reward, prompt=args.eval_prompt)
        (Path(run_dir) / "preference_eval.json").write_text(
            json.dumps(report, indent=1) + "\n", encoding="utf-8"
        )
        print(
            f"{args.eval_reward} over {report['num_samples']} samples: reference {report['reference_reward_mean']:.4g} "
            f"± {report['reference_reward_stderr']:.2g} (entropy {report['reference_entropy']:.3f}), fine-tuned "
            f"{report['finetuned_reward_mean']:.4g} ± {report['finetuned_reward_stderr']:.2g} "
            f"(entropy {report['finetuned_entropy']:.3f})",
            flush=True,
        )
    return 0
