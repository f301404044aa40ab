"""AR → diffusion distillation, the recipe (MATH.md §5.4): `builder` (teacher inspection, memory checks, the
`target.name: distill` schema and registry entry), `compose` (the student's run config, the report), and `RECIPE`,
the command `tcsm distill` (also `tcsm finetune distill`). The method's math is `tcsm.posttrain.distill`."""

from __future__ import annotations

from tcsm.recipes.spec import Flag, Option, RecipeSpec

DOC = """`tcsm distill`: distil an autoregressive teacher into a diffusion student (exact / Top-K / Top-K+n-gram / Taylor; MATH.md §5.4).

The teacher is a causal-LM run of this project (`tcsm train -c causal-lm ...`) or a local Hugging Face
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


def _describe(args, report: dict) -> str:
    lines = [
        f"{k:>4} sampling steps: gen-PPL under the teacher {r['gen_ppl']:.2f}, entropy {r['entropy']:.3f} nats"
        for k, r in report["steps"].items()
    ]
    t = report["teacher"]
    lines.append(f"teacher's own samples: gen-PPL {t['gen_ppl']:.2f}, entropy {t['entropy']:.3f} nats")
    return "\n".join(lines)


def _check(args) -> None:
    from tcsm.core.errors import ConfigError

    if (args.resume or args.resume_from) and args.checkpoint:
        raise ConfigError("--teacher cannot change on --resume: the run keeps the teacher it was started with")


def _summarize(args, run_dir, cfg, summary: dict) -> str | None:
    from tcsm.recipes.distill.compose import cost_summary

    return cost_summary(run_dir, cfg)


RECIPE = RecipeSpec(
    name="distill",
    preset="distill",
    source_help="tcsm causal-LM run (or checkpoint) or Hugging Face causal-LM directory",
    source_flag=("-t", "--teacher"),
    flags=(
        Flag("target.estimator"),
        Flag("target.k", ("-k",), minimum=1),
        Flag("target.ngram_order", minimum=1),
        Flag("target.ngram_k", minimum=1),
        Flag("target.proposal"),
        Flag("target.audit_rows", minimum=0),
    ),
    options=(
        Option(("--eval-samples",), {"type": int, "default": 0, "help": "student samples judged by the teacher (0: skip)"}),
        Option(("--eval-steps",), {"default": "8,32,128",
                                   "help": "sampling steps of the judged samples, comma-separated"}),
    ),
    report="report_of",
    describe=_describe,
    summarize=_summarize,
    check=_check,
    command=("distill",),
    marks=("target.name", "distill"),
)
