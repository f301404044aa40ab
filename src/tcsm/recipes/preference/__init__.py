"""Preference fine-tuning, the recipe (MATH.md §5.3): `builder` (the `objective.name: preference` schema and
registry entry), `compose` (pairs from a model's own samples, the run config, the report), and `RECIPE`, the
command `tcsm finetune preference`. The method's math is `tcsm.posttrain.preference`; its data kind `tcsm.data.pairs`."""

from __future__ import annotations

from tcsm.recipes.spec import Flag, Option, RecipeSpec

DOC = """`tcsm finetune preference`: preference fine-tuning on chosen/rejected pairs (paper BCE with margin β, or DPO-style; MATH.md §5.3).

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


def _describe(args, report: dict) -> str:
    return (
        f"{args.eval_reward} over {report['num_samples']} samples: reference {report['reference_reward_mean']:.4g} "
        f"± {report['reference_reward_stderr']:.2g} (entropy {report['reference_entropy']:.3f}), fine-tuned "
        f"{report['finetuned_reward_mean']:.4g} ± {report['finetuned_reward_stderr']:.2g} "
        f"(entropy {report['finetuned_entropy']:.3f})"
    )


def _held_out_line(args, run_dir, cfg, summary: dict) -> str | None:
    if summary.get("pref_accuracy") is None:
        return None
    return (
        f"held-out pairs ({summary['num_pairs']}): preference accuracy {summary['pref_accuracy']:.3f}, "
        f"implicit reward margin {summary['reward_margin']:.4g} ± {summary['reward_margin_stderr']:.2g} nats, "
        f"KL to the reference {summary['kl_ref']:.4g} nats/sequence"
    )


def _before_training(args, cfg) -> None:
    if args.eval_reward and args.eval_samples > 0:  # a bad reward spec must not cost a training run
        from tcsm.recipes.preference.compose import check_eval_reward

        check_eval_reward(args.eval_reward, cfg)


RECIPE = RecipeSpec(
    name="preference",
    source_help="pre-trained run, checkpoints or step_* directory (the reference and the start)",
    flags=(
        Flag("objective.loss"),
        Flag("objective.beta", positive=True),
        Flag("objective.beta_dpo", positive=True),
        Flag("objective.num_t", minimum=1),
        Flag("data.truncate"),
    ),
    data_kind="pairs",
    options=(
        Option(("--pairs",), {"help": "JSONL file of {prompt, chosen, rejected} records"}),
        Option(("--eval-reward",), {"help": "after training, judge samples of both models with this reward spec"}),
        Option(("--eval-samples",), {"type": int, "default": 128,
                                     "help": "samples per model for --eval-reward (default 128)"}),
        Option(("--eval-prompt",), {"help": "prompt of the --eval-reward samples"}),
    ),
    report="report_of",
    describe=_describe,
    summarize=_held_out_line,
    before_training=_before_training,
)
