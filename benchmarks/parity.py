#!/usr/bin/env python3
"""Fixed-seed parity of the command line across a refactor: the same commands, one thread, fixed seeds, and every
metric they write, so that two source trees (before / after a change that must not change behaviour) can be
compared number for number.

    python benchmarks/parity.py --src src --out after.json                     # run the commands on a tree
    python benchmarks/parity.py --src /path/to/old/src --out before.json
    python benchmarks/parity.py --compare before.json after.json               # exit 1 on any difference

The commands: `tcsm quickstart` (the full default: a couple of CPU-minutes), `tcsm demo grid --size test`, and a
short run of each post-training recipe — `finetune reward`, `pairs` + `finetune preference`, `finetune dre`,
`finetune sft`, `distill` — from tiny fixed-seed source runs on a small generated text, each followed by
`tcsm eval RUN --json` on the fine-tuned run. Only README command lines are used, so both trees accept them.
Metrics are the numeric leaves of each run's summary.json / metrics.json / report and of the eval output; keys
about time or speed are left out of the comparison (they differ between any two runs).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

SENTENCES = [
    "Once upon a time, there was a little cat.",
    "The quick brown fox jumps over the lazy dog.",
    "She was happy and sang a song.",
    "It is a good day, said the old man.",
]
TRAIN = [
    "train.batch_size=4", "train.eval_every=0", "train.sample_every=0", "train.progress=false",
    "train.tensorboard=false", "train.compile=false", "train.precision=fp32", "train.device=cpu",
    "train.threads=1", "train.eval_examples=8", "eval.num_t=2", "eval.batch_size=8", "sample.num=2",
    "sample.steps=4", "optim.warmup=0", "model.preset=tiny",
]  # fmt: skip
TEXT = ["data.kind=text", "data.path=book.txt", "data.seq_len=48"]
EVAL = ["--json", "--max-examples", "8", "--num-t", "2", "--batch-size", "8"]
UNSTABLE = re.compile(r"time|sec|rate|wall|eta|per_s|tok_s|elapsed|duration|date|host|pid|path|dir|cpu", re.IGNORECASE)


def commands() -> list[tuple[str, list[str], list[str]]]:
    """(name, argv, files whose metrics to collect) in dependency order."""
    recipe = [*(o for o in TRAIN if not o.startswith("model.")), "train.steps=3"]  # the model is the source run's
    return [
        ("quickstart", ["quickstart", "-o", "qs", "train.threads=1", "train.progress=false"], ["qs/quickstart.json"]),
        ("demo_grid", ["demo", "grid", "-o", "grid", "--size", "test", "--samples", "512", "--steps", "8", "--seed", "0",
                       "--pretrain", "train.steps=200", "train.threads=1", "--finetune", "train.steps=50", "train.threads=1"],
         ["grid/metrics.json"]),
        ("train_text", ["train", "-o", "src", *TEXT, *TRAIN, "train.steps=40"], ["src/summary.json"]),
        ("train_synthetic", ["train", "-o", "syn", *TRAIN, "train.steps=40"], ["syn/summary.json"]),
        ("train_causal", ["train", "-c", "clean-causal", "-o", "ar", *TEXT, *TRAIN, "train.steps=40"], ["ar/summary.json"]),
        ("finetune_reward", ["finetune", "reward", "-k", "src", "--reward", "vader", "--prompt", "Once upon a time,",
                             "-o", "ft_reward", "--steps", "3", "-B", "2", "--eval-samples", "0", *recipe],
         ["ft_reward/summary.json"]),
        ("pairs", ["pairs", "--from", "src", "--reward", "vader", "--prompt", "Once upon a time,", "-n", "16",
                   "--group", "4", "--steps", "4", "-o", "pairs.jsonl"], ["pairs.jsonl"]),
        ("finetune_preference", ["finetune", "preference", "--from", "src", "--pairs", "pairs.jsonl", "--loss", "paper",
                                 "--beta", "1", "-o", "ft_pref", "--steps", "3", "--eval-samples", "0", *recipe,
                                 "train.batch_size=1"], ["ft_pref/summary.json"]),
        ("finetune_dre", ["finetune", "dre", "--from", "syn", "--loss", "bce", "-n", "2", "-o", "ft_dre", "--steps", "3",
                          "--eval-examples", "4", *recipe], ["ft_dre/summary.json"]),
        ("finetune_sft", ["finetune", "sft", "--from", "src", "--data", "chats.jsonl", "--chat-template", "tmpl.jinja",
                          "-o", "ft_sft", "--steps", "3", "data.pad=.", "data.valid_frac=0.25", *recipe],
         ["ft_sft/summary.json"]),
        ("distill", ["distill", "--teacher", "ar", "--estimator", "topk_ngram", "-k", "8", "-o", "student", "--steps", "3",
                     "--eval-samples", "2", "--eval-steps", "2", *recipe], ["student/summary.json"]),
        *[(f"eval_{run}", ["eval", run, *EVAL], [])
          for run in ("src", "syn", "ft_reward", "ft_pref", "ft_dre", "ft_sft", "student")],
    ]  # fmt: skip


def write_inputs(work: Path) -> None:
    text = " ".join(itertools.islice(itertools.cycle(SENTENCES), 400))
    (work / "book.txt").write_text(text)
    chat = {"messages": [{"role": "user", "content": "the old man"}, {"role": "assistant", "content": "sang a song"}]}
    (work / "chats.jsonl").write_text((json.dumps(chat) + "\n") * 12)
    (work / "tmpl.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}, {% elif m['role'] == 'assistant' %}"
        "said {{ m['content'] }}. {% endif %}{% endfor %}{% if add_generation_prompt %}said {% endif %}"
    )


def leaves(value, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a JSON value, by dotted key (lists by index)."""
    out: dict[str, float] = {}
    if isinstance(value, dict):
        for k, v in value.items():
            out.update(leaves(v, f"{prefix}{k}."))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.update(leaves(v, f"{prefix}{i}."))
    elif isinstance(value, (bool, int, float)):
        out[prefix[:-1]] = float(value)
    return out


def read_metrics(path: Path) -> dict[str, float]:
    if path.suffix == ".jsonl":  # pairs: a digest of the records is the metric
        lines = path.read_text().splitlines()
        return {"records": float(len(lines)), "chars": float(sum(map(len, lines)))}
    return leaves(json.loads(path.read_text()))


def run_all(src: Path, work: Path, python: str) -> dict:
    work.mkdir(parents=True, exist_ok=False)
    write_inputs(work)
    env = {**os.environ, "PYTHONPATH": str(src.resolve()), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore"}  # fmt: skip
    result: dict = {"src": str(src.resolve()), "commands": {}, "metrics": {}}
    for name, argv, files in commands():
        t0 = time.time()
        done = subprocess.run([python, "-m", "tcsm.cli", *argv], cwd=work, env=env, capture_output=True, text=True, check=False)
        print(f"{name:22s} rc={done.returncode} {time.time() - t0:6.1f} s", flush=True)
        if done.returncode != 0:
            raise SystemExit(f"{name} failed: {' '.join(argv)}\n{done.stderr[-3000:]}")
        metrics: dict[str, float] = {}
        for f in files:
            metrics.update({f"{Path(f).name}:{k}": v for k, v in read_metrics(work / f).items()})
        if name.startswith("eval_"):
            metrics.update(leaves(json.loads(done.stdout[done.stdout.index("{"):])))
        result["commands"][name] = "tcsm " + " ".join(argv)
        result["metrics"][name] = {k: v for k, v in metrics.items() if not UNSTABLE.search(k)}
    return result


def compare(a: dict, b: dict, tol: float) -> int:
    bad = n = 0
    for name in sorted(set(a["metrics"]) | set(b["metrics"])):
        ma, mb = a["metrics"].get(name, {}), b["metrics"].get(name, {})
        for key in sorted(set(ma) | set(mb)):
            n += 1
            x, y = ma.get(key), mb.get(key)
            same = x is not None and y is not None and (
                (math.isnan(x) and math.isnan(y)) or abs(x - y) <= tol * max(1.0, abs(x), abs(y)))
            if not same:
                bad += 1
                print(f"DIFF {name:22s} {key:50s} {x!r:>24} {y!r:>24}")
    print(f"{n} metrics over {len(a['metrics'])} commands: {n - bad} equal, {bad} different (tolerance {tol:g})")
    return 1 if bad else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1] / "src", help="source tree to run")
    p.add_argument("--out", type=Path, help="JSON file of the metrics")
    p.add_argument("--workdir", type=Path, help="scratch folder for the runs (must not exist)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    p.add_argument("--tol", type=float, default=1e-9, help="relative tolerance of --compare")
    args = p.parse_args(argv)
    if args.compare:
        return compare(*(json.loads(f.read_text()) for f in args.compare), args.tol)
    if not args.out or not args.workdir:
        p.error("give --out and --workdir (or --compare)")
    result = run_all(args.src, args.workdir, args.python)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
