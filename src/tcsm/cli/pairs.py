"""`tcsm pairs`: preference pairs without human data — sample a trained model, judge the samples with a reward,
write chosen / rejected pairs as JSON lines for `tcsm finetune preference` (MATH.md §5.3).

Each pair is the best and the worst of `--group` samples drawn with the same prompt (or none), under any reward
of tcsm.rewards.functions: `vader`, `profanity`, `hf:PATH[,label=1]` (a local classifier), `grid`, `python:module:function`.
Groups whose rewards tie are redrawn. Every line holds `prompt`, `chosen`, `rejected` (the response texts, after
the prompt), the two rewards, and the sampled token ids with the tokenizer they belong to (a run with the
same tokenizer trains on exactly the judged tokens; tcsm.data.pairs):

    tcsm pairs --from runs/ts --reward vader -n 512 --prompt "Once upon a time, there was a" -o pairs.jsonl
    tcsm finetune preference --from runs/ts --pairs pairs.jsonl --loss paper --beta 1 -o runs/ts-pref
"""

from __future__ import annotations

import argparse

HELP = "sample a trained model, judge the samples with a reward, write chosen/rejected pairs (JSONL)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    from tcsm.cli.common import add_source_run_argument

    add_source_run_argument(p, "trained run, checkpoints or step_* directory to sample", required=True)
    p.add_argument(
        "--reward",
        required=True,
        help="judge: vader | profanity | grid | hf:PATH[,label=1] | python:module:function",
    )
    p.add_argument("-n", "--num-pairs", type=int, default=256, help="pairs to write (default 256)")
    p.add_argument("-o", "--output", required=True, help="JSONL file to write")
    p.add_argument(
        "--prompt", action="append", default=[], help="prompt text (repeatable; pairs are spread over them)"
    )
    p.add_argument("--prompts-file", help="a text file with one prompt per line (added to --prompt)")
    p.add_argument(
        "--group", type=int, default=2, help="samples per pair: chosen = best, rejected = worst (default 2)"
    )
    p.add_argument("--steps", type=int, help="sampler steps (default: the run's sample.steps)")
    p.add_argument("--seed", type=int, default=0, help="seed of the samples")
    p.add_argument(
        "--weights", choices=("ema", "model"), default="ema", help="EMA (default, when saved) or raw weights"
    )
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N | auto")
    p.add_argument("--max-rounds", type=int, default=20, help="redraw rounds for tied groups (default 20)")


def run(args) -> int:
    from pathlib import Path

    from tcsm.builders.loading import load_checkpoint
    from tcsm.core.errors import ConfigError
    from tcsm.recipes.preference.compose import sample_pairs, write_pairs
    from tcsm.rewards.functions import make_reward
    from tcsm.sampling.settings import sample_settings
    from tcsm.train.distributed import resolve_device

    prompts = list(args.prompt)
    if args.prompts_file:
        try:
            text = Path(args.prompts_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read --prompts-file {args.prompts_file}: {e}") from None
        prompts += [line.rstrip("\n") for line in text.splitlines() if line.strip()]
    if args.steps is not None and args.steps < 1:
        raise ConfigError(f"--steps must be >= 1, got {args.steps}")
    device = resolve_device(args.device)
    ck = load_checkpoint(args.checkpoint, device=device, ema=args.weights == "ema")
    data = ck.build_data()
    from types import SimpleNamespace

    from tcsm.data.tasks import run_task_options
    from tcsm.rewards.domain import check_reward_domain

    shape = SimpleNamespace(config=ck.config, vocab_size=int(data.vocab_size), seq_len=int(data.seq_len))
    check_reward_domain(args.reward, shape, what="--reward ")  # before any sampling: a grid reward on text is noise
    try:
        reward = make_reward(args.reward, decode=data.decode, vocab_size=data.vocab_size,
                             task_options=run_task_options(ck.config.data))
    except (ValueError, ImportError, AttributeError) as e:
        raise ConfigError(f"--reward {args.reward!r}: {e}") from None
    records, stats = sample_pairs(
        ck.model,
        ck.build_path(),
        data,
        reward,
        args.num_pairs,
        group=args.group,
        prompts=prompts or [""],
        settings=sample_settings(ck.config.sample, steps=args.steps),
        seed=args.seed,
        max_rounds=args.max_rounds,
    )
    if not records:
        raise ConfigError(
            f"no pair written: every group of {args.group} samples tied under {args.reward!r} "
            f"({stats['samples']} samples); raise --group or use another reward"
        )
    out = write_pairs(records, args.output)
    short = f" (asked for {args.num_pairs})" if len(records) < args.num_pairs else ""
    print(
        f"wrote {len(records)} pairs{short} to {out}: {stats['samples']} samples, {stats['reward_calls']} reward calls, "
        f"{stats['ties_skipped']} tied and {stats['identical_skipped']} identical groups redrawn",
        flush=True,
    )
    return 0
