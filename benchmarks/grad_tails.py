"""Gradient norms of masked L_distrib and masked L_score (GKL) at the same trained model, batch by batch.

Why masked L_score trains slowly at the quality table's budget: its per-position gradient carries 1/m_z, so a
few positions the model finds unlikely dominate a batch's gradient. This measures it directly — both losses
(κ_t-weighted, as trained) on the same batches and (t, x_t) draws, at one checkpoint, without clipping.

    .venv/bin/python benchmarks/grad_tails.py runs/bench/quality_budget/tcsm-masked-distrib --batches 64 \\
        --out benchmarks/results/grad_tails.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

from tcsm.builders.loading import load_checkpoint
from tcsm.objectives import Objective


def grad_norm(model, objective, x1, seed) -> float:
    model.zero_grad(set_to_none=True)
    loss, _ = objective(model, x1, generator=torch.Generator().manual_seed(seed))
    loss.backward()
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", help="a masked-path run (its final weights, EMA when kept)")
    ap.add_argument("--batches", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    ckpt = load_checkpoint(args.run)
    model, path = ckpt.model, ckpt.build_path()
    if path.kind != "masked":
        sys.exit(f"error: {args.run} is a {path.kind}-path run; this compares the masked losses")
    data = ckpt.build_data()
    model.train()
    g = torch.Generator().manual_seed(0)
    losses = {"L_distrib (KL)": Objective(path, loss="distrib"), "L_score (GKL)": Objective(path, loss="score")}
    norms = {k: [] for k in losses}
    for b in range(args.batches):
        x1 = data.get_batch("train", torch.randint(0, data.train.shape[0], (args.batch,), generator=g))
        for name, obj in losses.items():
            norms[name].append(grad_norm(model, obj, x1, seed=b))  # same seed: same t and x_t for both
    q = lambda v, p: sorted(v)[min(len(v) - 1, int(p * len(v)))]
    summary = {k: {"median": statistics.median(v), "p90": q(v, 0.9), "max": max(v)} for k, v in norms.items()}
    ratio = [s / d for s, d in zip(norms["L_score (GKL)"], norms["L_distrib (KL)"])]
    summary["score / distrib, same batch"] = {"median": statistics.median(ratio), "p90": q(ratio, 0.9), "max": max(ratio)}
    res = {"run": args.run, "step": ckpt.step, "weights": ckpt.weights, "batches": args.batches,
           "batch": args.batch, "summary": summary, "norms": norms}
    print(f"{args.run} (step {ckpt.step}, {ckpt.weights} weights), {args.batches} batches of {args.batch}:")
    for k, v in summary.items():
        print(f"  {k:28s} median {v['median']:.3g}  p90 {v['p90']:.3g}  max {v['max']:.3g}")
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
