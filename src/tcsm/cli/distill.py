"""`tcsm distill`: train a diffusion student on the N^1 conditionals of an autoregressive teacher (MATH.md §5.4).

The teacher is a causal-LM run of this project (`tcsm train -c clean-causal ...`) or a local Hugging Face
causal-LM directory (config.json, weights and tokenizer files); the student is any denoiser config. The run is
an ordinary `tcsm train` run — same Trainer, checkpoints, --resume, logs and one-line errors — whose config is
the teacher run's data section, then the `distill` preset (or `-c`), then key=value overrides, then the flags:

    tcsm distill --teacher runs/ar --estimator topk_ngram -k 8 --steps 2000 -o runs/student
    tcsm distill --teacher runs/ar --proposal teacher -o runs/no-data     # x_1 ~ p^AR: no training data read
    tcsm distill --teacher hf/gpt2-dir data.kind=bpe data.tokenizer=gpt2 data.bpe_dir=... data.path=...
    tcsm distill --resume -o runs/student

A teacher whose vocabulary or tokenizer differs from the student's data, or one that would not fit in memory,
is refused before training. Every logged step reports the teacher's cost (target/seq_scores: sequence scores
per proposal sequence, against (V−1)L+1 for the exact marginal) and, with --audit-rows N, the teacher mass
the candidate sets miss (target/missed_mass). After training, `--eval-samples N` student samples per entry of
--eval-steps are judged by the teacher (gen-PPL) and their unigram entropy; written to distill_eval.json.
"""

from __future__ import annotations

import argparse
import json

HELP = "distil an autoregressive teacher into a diffusion student (exact / Top-K / Top-K+n-gram / Taylor; MATH.md §5.4)"

#: flag → config key
DISTILL_FLAGS = {
    "estimator": "target.estimator",
    "k": "target.k",
    "ngram_order": "target.ngram_order",
    "ngram_k": "target.ngram_k",
    "proposal": "target.proposal",
    "audit_rows": "target.audit_rows",
    "steps": "train.steps",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from tcsm.cli.common import add_config_arguments, add_overwrite_argument, add_steps_and_resume_arguments

    p.add_argument("-t", "--teacher", help="tcsm causal-LM run (or checkpoint) or Hugging Face causal-LM directory")
    add_config_arguments(p, "distill", overrides_example="model.d_model=128")
    p.add_argument("--estimator", choices=("exact", "topk", "topk_ngram", "taylor"), help="teacher score estimator")
    p.add_argument("-k", "--k", type=int, help="teacher candidates per position (topk, topk_ngram)")
    p.add_argument("--ngram-order", type=int, help="N of the right-context n-gram (topk_ngram)")
    p.add_argument("--ngram-k", type=int, help="n-gram candidates per position (topk_ngram; default: k)")
    p.add_argument("--proposal", choices=("data", "teacher", "student"), help="where x_1 comes from (h)")
    p.add_argument("--audit-rows", type=int, help="sequences per step scored exactly to report the missed mass")
    add_steps_and_resume_arguments(p, "distillation")
    add_overwrite_argument(p)
    p.add_argument("--eval-samples", type=int, default=0, help="student samples judged by the teacher (0: skip)")
    p.add_argument("--eval-steps", default="8,32,128", help="sampling steps of the judged samples, comma-separated")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def resolve(args) -> tuple:
    """(config, run_dir, resume) of `tcsm distill` from its arguments."""
    from tcsm.cli.common import resolve_recipe
    from tcsm.core.errors import ConfigError

    for flag in ("k", "ngram_order", "ngram_k", "steps"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {v}")
    if args.audit_rows is not None and args.audit_rows < 0:
        raise ConfigError(f"--audit-rows must be >= 0, got {args.audit_rows}")
    if (args.resume or args.resume_from) and args.teacher:
        raise ConfigError("--teacher cannot change on --resume: the run keeps the teacher it was started with")

    def new_config(config: str, values: dict):
        from tcsm.recipes.distill.compose import distill_config

        if not args.teacher:
            raise ConfigError("give the teacher: tcsm distill --teacher RUN_OR_HF_DIR (or --resume -o DIR)")
        return distill_config(args.teacher, config, args.overrides, values)

    return resolve_recipe(args, "distill", DISTILL_FLAGS, new_config)


def _eval_steps(text: str) -> list[int]:
    from tcsm.core.errors import ConfigError

    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        steps = []
    if not steps or min(steps) < 1:
        raise ConfigError(f"--eval-steps must be positive integers separated by commas, got {text!r}")
    return steps


def cost_summary(run_dir, cfg) -> str | None:
    """One line: the teacher's mean sequence scores per student step, against the exact marginal's."""
    from pathlib import Path

    rows = []
    path = Path(run_dir) / "metrics.jsonl"
    if path.is_file():
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    per_seq = [r["target/seq_scores"] for r in rows if "target/seq_scores" in r]
    if not per_seq:
        return None
    mean = sum(per_seq) / len(per_seq)
    text = f"teacher cost: {mean:.1f} sequence scores per sequence, {mean * cfg.train.batch_size:.0f} per student step"
    missed = [r["target/missed_mass"] for r in rows if "target/missed_mass" in r]
    if missed:
        text += f"; candidate sets miss {sum(missed) / len(missed):.3f} of the teacher's mass"
    return text


def _describe(report: dict) -> str:
    lines = [
        f"{k:>4} sampling steps: gen-PPL under the teacher {r['gen_ppl']:.2f}, entropy {r['entropy']:.3f} nats"
        for k, r in report["steps"].items()
    ]
    t = report["teacher"]
    lines.append(f"teacher's own samples: gen-PPL {t['gen_ppl']:.2f}, entropy {t['entropy']:.3f} nats")
    return "\n".join(lines)


def run(args) -> int:
    from tcsm.cli.common import check_overwrite, lazy_report, run_recipe

    check_overwrite(args)
    cfg, run_dir, resume = resolve(args)
    report = lazy_report("tcsm.recipes.distill.compose:distill_report", args.eval_samples, _eval_steps(args.eval_steps))

    return run_recipe(
        args,
        cfg,
        run_dir,
        resume,
        report=report,
        report_file="distill_eval.json",
        describe=_describe,
        summarize=lambda _summary: cost_summary(run_dir, cfg),
    )
