#!/usr/bin/env python3
"""Fixed-seed parity of the `tcsm` command line across a refactor.

A refactor that must not change behaviour (moving modules into folders, renaming internals) is checked by running
the same README command lines on the tree before and the tree after, with fixed seeds, one thread, fp32, CPU,
compile and progress off, and comparing every metric they write, number for number.

    python benchmarks/parity.py --src <tree before>/src --workdir /tmp/p1 --out before.json
    python benchmarks/parity.py --src src --workdir /tmp/p2 --out after.json
    python benchmarks/parity.py --compare before.json after.json [--tol 1e-6]     # table; exit 1 on a difference

`--only quickstart,train_text,...` runs (or compares) those commands alone: a command that reads another's run
needs that one in the list too (the recipes read train_text's, train_synthetic's or train_causal's).

`--src` is the source tree whose CLI runs (`PYTHONPATH=<src> <python> -m tcsm.cli ...`, OMP/MKL_NUM_THREADS=1);
`--python` the interpreter (default: this one). The workdir must not exist; it keeps every run for inspection.

Commands, in order (only command lines the README documents, with the tiny settings tests/test_readme.py adds):
  quickstart           `tcsm quickstart -o qs` — the full default (synthetic preset, ~2 CPU-minutes); metrics:
                       qs/quickstart.json (final test metrics, samples' NLL, ...).
  demo_grid            `tcsm demo grid -o grid --size test --samples 512 --steps 8 --seed 0`, 200 + 50 steps
                       (10 s): the demo's 32x32 path; metrics: grid/metrics.json.
  demo_grid_full       `tcsm demo grid -o grid_full --seed 0` — the full default (128x128, 2,000 + 500 steps,
                       20,000 samples; 2.3 min wall on one thread when the machine is quiet, 3 min under load);
                       metrics: grid_full/metrics.json.
  train_text           tiny `tcsm train` on a generated text (book.txt, 4 sentences cycled, 400 of them), 40 steps.
  train_synthetic      tiny `tcsm train` on the synthetic preset, 40 steps.
  train_causal         tiny `tcsm train -c clean-causal` on book.txt, 40 steps (the distillation teacher).
  finetune_reward      `tcsm finetune reward -k src --reward vader`, 3 steps.
  pairs                `tcsm pairs --from src --reward vader -n 16 --group 4`; metrics: record count, characters
                       and the SHA-256 of pairs.jsonl (under "digests").
  finetune_preference  `tcsm finetune preference --from src --pairs pairs.jsonl --loss paper`, 3 steps.
  finetune_dre         `tcsm finetune dre --from syn --loss bce -n 2`, 3 steps.
  finetune_sft         `tcsm finetune sft --from src --data chats.jsonl --chat-template tmpl.jinja` (12 generated
                       chats), 3 steps.
  distill              `tcsm distill --teacher ar --estimator topk_ngram -k 8`, 3 steps.
  eval_<run>           `tcsm eval RUN --json` (8 examples, 2 times) on each source and fine-tuned run.
Every training command gets train.seed=0 (the default, made explicit), train.threads=1, train.device=cpu,
train.precision=fp32, train.compile=false, train.progress=false.

Metrics are the numeric leaves of each file (dotted keys, lists by index) and of the eval JSON. Keys naming time,
speed or the machine (a word among time/seconds/sec/s/rate/wall/eta/elapsed/duration/speed/throughput/
date/host/pid/memory, e.g. `wall_seconds`, `tokens_per_s`) are kept under "excluded" and never compared: they
differ between any two runs. Determinism: two passes on the same tree (one thread, fixed seeds) give identical
metrics and digests for every compared key (checked on fd0a373: see benchmarks/results/parity_before.json).
"""

from __future__ import annotations

import argparse
import hashlib
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
FIXED = ["train.seed=0", "train.threads=1", "train.device=cpu", "train.precision=fp32", "train.compile=false",
         "train.progress=false", "train.tensorboard=false"]  # fmt: skip
TRAIN = [*FIXED, "train.batch_size=4", "train.eval_every=0", "train.sample_every=0", "train.eval_examples=8",
         "eval.num_t=2", "eval.batch_size=8", "sample.num=2", "sample.steps=4", "optim.warmup=0"]  # fmt: skip
TINY = ["model.preset=tiny", "train.steps=40"]
TEXT = ["data.kind=text", "data.path=book.txt", "data.seq_len=48"]
RECIPE = [*TRAIN, "train.steps=3"]  # the model is the source run's
EVAL = ["--json", "--max-examples", "8", "--num-t", "2", "--batch-size", "8"]
#: words of a key that make it a timing / machine field, not a metric
UNSTABLE_WORDS = {
    "time", "times", "timestamp", "walltime", "runtime", "seconds", "second", "secs", "sec", "s", "ms", "rate",
    "wall", "eta", "elapsed", "duration", "speed", "throughput", "date", "host", "hostname", "pid",
    "memory", "mem", "rss", "peak",
}  # fmt: skip


def unstable(key: str) -> bool:
    return any(w in UNSTABLE_WORDS for w in re.split(r"[^a-z0-9]+", key.lower()))


def commands() -> list[tuple[str, list[str], list[str]]]:
    """(name, argv after `tcsm`, files whose metrics to collect), in dependency order."""
    return [
        ("quickstart", ["quickstart", "-o", "qs", *FIXED], ["qs/quickstart.json"]),
        ("demo_grid", ["demo", "grid", "-o", "grid", "--size", "test", "--samples", "512", "--steps", "8", "--seed", "0",
                       "--pretrain", "train.steps=200", *FIXED, "--finetune", "train.steps=50", *FIXED],
         ["grid/metrics.json"]),
        ("demo_grid_full", ["demo", "grid", "-o", "grid_full", "--seed", "0", "--pretrain", *FIXED, "--finetune", *FIXED],
         ["grid_full/metrics.json"]),
        ("train_text", ["train", "-o", "src", *TEXT, *TRAIN, *TINY], ["src/summary.json"]),
        ("train_synthetic", ["train", "-o", "syn", *TRAIN, *TINY], ["syn/summary.json"]),
        ("train_causal", ["train", "-c", "clean-causal", "-o", "ar", *TEXT, *TRAIN, *TINY], ["ar/summary.json"]),
        ("finetune_reward", ["finetune", "reward", "-k", "src", "--reward", "vader", "--prompt", "Once upon a time,",
                             "-o", "ft_reward", "--steps", "3", "-B", "2", "--eval-samples", "0", *RECIPE],
         ["ft_reward/summary.json"]),
        ("pairs", ["pairs", "--from", "src", "--reward", "vader", "--prompt", "Once upon a time,", "-n", "16",
                   "--group", "4", "--steps", "4", "-o", "pairs.jsonl"], ["pairs.jsonl"]),
        ("finetune_preference", ["finetune", "preference", "--from", "src", "--pairs", "pairs.jsonl", "--loss", "paper",
                                 "--beta", "1", "-o", "ft_pref", "--steps", "3", "--eval-samples", "0", *RECIPE,
                                 "train.batch_size=1"], ["ft_pref/summary.json"]),
        ("finetune_dre", ["finetune", "dre", "--from", "syn", "--loss", "bce", "-n", "2", "-o", "ft_dre", "--steps", "3",
                          "--eval-examples", "4", *RECIPE], ["ft_dre/summary.json"]),
        ("finetune_sft", ["finetune", "sft", "--from", "src", "--data", "chats.jsonl", "--chat-template", "tmpl.jinja",
                          "-o", "ft_sft", "--steps", "3", "data.pad=.", "data.valid_frac=0.25", *RECIPE],
         ["ft_sft/summary.json"]),
        ("distill", ["distill", "--teacher", "ar", "--estimator", "topk_ngram", "-k", "8", "-o", "student", "--steps", "3",
                     "--eval-samples", "2", "--eval-steps", "2", *RECIPE], ["student/summary.json"]),
        *[(f"eval_{run}", ["eval", run, *EVAL], [])
          for run in ("src", "syn", "ar", "ft_reward", "ft_pref", "ft_dre", "ft_sft", "student")],
    ]  # fmt: skip


def write_inputs(work: Path) -> None:
    """The text, chats and chat template the runs read (as tests/test_readme.py writes them)."""
    (work / "book.txt").write_text(" ".join(itertools.islice(itertools.cycle(SENTENCES), 400)))
    chat = {
        "messages": [
            {"role": "user", "content": "the old man"},
            {"role": "assistant", "content": "sang a song"},
        ]
    }
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
    if path.suffix == ".jsonl":  # pairs: counts here, the file's digest under "digests"
        lines = path.read_text().splitlines()
        return {"records": float(len(lines)), "chars": float(sum(map(len, lines)))}
    return leaves(json.loads(path.read_text()))


def run_all(src: Path, work: Path, python: str, only: set[str] | None = None) -> dict:
    work.mkdir(parents=True, exist_ok=False)
    write_inputs(work)
    env = {**os.environ, "PYTHONPATH": str(src.resolve()), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore", "PYTHONHASHSEED": "0"}  # fmt: skip
    result: dict = {"src": str(src.resolve()), "python": python, "commands": {}, "metrics": {}, "excluded": {},
                    "digests": {}, "seconds": {}}  # fmt: skip
    start = time.time()
    for name, argv, files in commands():
        if only is not None and name not in only:
            continue
        t0 = time.time()
        done = subprocess.run(
            [python, "-m", "tcsm.cli", *argv], cwd=work, env=env, capture_output=True, text=True, check=False
        )
        result["seconds"][name] = round(time.time() - t0, 1)
        print(f"{name:22s} rc={done.returncode} {time.time() - t0:6.1f} s", flush=True)
        if done.returncode != 0:
            raise SystemExit(f"{name} failed: tcsm {' '.join(argv)}\n{done.stderr[-3000:]}")
        metrics: dict[str, float] = {}
        for f in files:
            metrics.update({f"{Path(f).name}:{k}": v for k, v in read_metrics(work / f).items()})
            if f.endswith(".jsonl"):
                result["digests"][f"{name}:{f}"] = hashlib.sha256((work / f).read_bytes()).hexdigest()
        if name.startswith("eval_"):
            metrics.update(leaves(json.loads(done.stdout[done.stdout.index("{") :])))
        result["commands"][name] = "tcsm " + " ".join(argv)
        result["metrics"][name] = {k: v for k, v in metrics.items() if not unstable(k)}
        result["excluded"][name] = {k: v for k, v in metrics.items() if unstable(k)}
    result["seconds"]["total"] = round(time.time() - start, 1)
    return result


def _same(x: float | None, y: float | None, tol: float) -> bool:
    if x is None or y is None:
        return False
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return abs(x - y) <= tol or abs(x - y) <= tol * max(abs(x), abs(y))


def compare(a: dict, b: dict, tol: float, only: set[str] | None = None) -> int:
    """Print every compared metric (before, after, |diff|) and return 1 if any differs beyond tol (absolute or
    relative) or is missing on one side."""
    bad = n = 0
    print(f"{'command':22s} {'metric':48s} {'before':>22s} {'after':>22s} {'|diff|':>10s}")
    for name in sorted(n for n in set(a["metrics"]) | set(b["metrics"]) if only is None or n in only):
        ma, mb = a["metrics"].get(name, {}), b["metrics"].get(name, {})
        for key in sorted(k for k in set(ma) | set(mb) if not unstable(k)):
            n += 1
            x, y = ma.get(key), mb.get(key)
            diff = abs(x - y) if x is not None and y is not None else math.nan
            ok = _same(x, y, tol)
            bad += not ok
            print(f"{name:22s} {key:48s} {x!r:>22} {y!r:>22} {diff:10.3g}{'' if ok else '  DIFF'}")
    da, db = a.get("digests"), b.get("digests")
    if da is not None and db is not None:
        for key in sorted(k for k in set(da) | set(db) if only is None or k.split(":")[0] in only):
            n += 1
            ok = da.get(key) == db.get(key)
            bad += not ok
            print(f"{'digest':22s} {key:48s} {str(da.get(key))[:16]:>22} {str(db.get(key))[:16]:>22} "
                  f"{'same' if ok else 'DIFF':>10s}")  # fmt: skip
    else:
        print("(digests not compared: a file lacks them)")
    print(f"{n} values over {len(set(a['metrics']) | set(b['metrics']))} commands: {n - bad} equal, {bad} different "
          f"(tolerance {tol:g}, absolute or relative; time/speed keys excluded)")  # fmt: skip
    return 1 if bad else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--src", type=Path, default=Path(__file__).resolve().parents[1] / "src", help="source tree to run"
    )
    p.add_argument("--out", type=Path, help="JSON file of the metrics")
    p.add_argument("--workdir", type=Path, help="scratch folder for the runs (must not exist)")
    p.add_argument("--python", default=sys.executable, help="interpreter with tcsm's dependencies")
    p.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    p.add_argument("--tol", type=float, default=1e-6, help="tolerance of --compare (absolute or relative)")
    p.add_argument("--only", metavar="NAMES", help="comma-separated commands to run or compare (default: all)")
    args = p.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    if args.compare:
        return compare(*(json.loads(f.read_text()) for f in args.compare), args.tol, only)
    if not args.out or not args.workdir:
        p.error("give --out and --workdir (or --compare A B)")
    result = run_all(args.src, args.workdir, args.python, only)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out} ({result['seconds']['total']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
