"""Synthetic uniform-source L_score variants with the pre-training quality benchmark's synthetic budget.

One variant per call: trains with `benchmarks/pretrain_quality.py`'s `run_variant` (the `synthetic` preset, uniform
source, time conditioning, 600 steps × batch 64, fp32, 1 thread) plus the given config overrides, evaluates the
valid bounds on 1000 test sequences × 4 t-samples (eval seed 1234), prints one JSON line and appends it to --out.
Used for the kernel-tilt comparison in docs/benchmarks.md ("Uniform L_score: the kernel-tilted estimator"):

    .venv/bin/python benchmarks/uniform_score_tilt.py NAME --seed 0 objective.loss=score objective.kwargs.tilt=false
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pretrain_quality as pq

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("name")
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--steps", type=int, default=600)
ap.add_argument("--eval-seqs", type=int, default=1000)
ap.add_argument("--runs", default="runs/bench/uniform_score_tilt")
ap.add_argument("--out", default="benchmarks/results/uniform_score_tilt.jsonl")
ap.add_argument("overrides", nargs="*")
a = ap.parse_intermixed_args()
ns = argparse.Namespace(threads=1, seed=a.seed, synthetic_steps=a.steps, synthetic_precision="fp32",
                        synthetic_eval_seqs=a.eval_seqs, eval_batch=64, num_t=4, eval_seed=1234, eval_precision="bf16",
                        eval_seqs=256)
ov = ["path.source=uniform", "model.time_conditioning=true", "train.log_every=10", *a.overrides]
rec = pq.run_variant(f"{a.name}-s{a.seed}", "synthetic", ov, a.name, ns, Path(a.runs))
out = {"name": rec["name"], "seed": a.seed, "overrides": rec["overrides"], "train_wall_s": rec["train_wall_s"],
       "bounds": rec["bounds"]}
print(json.dumps(out), flush=True)
Path(a.out).parent.mkdir(parents=True, exist_ok=True)
with open(a.out, "a") as f:
    f.write(json.dumps(out) + "\n")
