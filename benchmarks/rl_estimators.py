"""Bias and variance of the RL sequence log-likelihood estimators (`tcsm.posttrain.rl`) against the exact
log p(completion | prompt), by enumeration on a tiny masked source with the exact-posterior denoiser (the helpers of
tests/posttrain/rl/test_estimators.py): 6 sequences, 2000 draws each.

    PYTHONPATH=src .venv/bin/python benchmarks/rl_estimators.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "posttrain" / "rl"))
import test_estimators as te  # the enumeration helpers of the tests


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    path = te.make_path("masked", te.V, "linear")
    dist = te.EnumerableDistribution.random(te.V, te.L, seed=3, concentration=0.7)
    x = dist.sample(6, torch.Generator().manual_seed(1))
    cond = torch.zeros(6, te.L, dtype=torch.bool)
    cond[:, : te.P] = True
    model = dist.denoiser(path)
    exact = te.exact_completion(dist, x)

    def row(name, est, n=2000):
        mean, _, var = te.mc(est, model, x, cond, n)
        print(f"{name:28s} bias {float((mean - exact).mean()):+.4f} (max |bias| {float((mean - exact).abs().max()):.4f})"
              f"  variance {float(var.mean()):.4f}", flush=True)  # fmt: skip

    row("elbo num_t=1", te.ELBOEstimate(path, num_t=1))
    row("elbo num_t=4", te.ELBOEstimate(path, num_t=4))
    row("one_step p_mask=0", te.OneStepEstimate(path, 0.0))
    row("one_step p_mask=0.15", te.OneStepEstimate(path, 0.15))
    for beta in (1.0, 2.0):
        for k in (1, 4, 16):
            row(f"eubo beta={beta} num_t={k}",
                lambda m, xx, c, g, s, k=k, b=beta: te.eubo(m, xx, path, num_t=k, beta=b, generator=g, cond_mask=c))  # fmt: skip
        print(f"eubo beta={beta} limit (enumerated)  bias {float((te.eubo_limit(dist, x, beta) - exact).mean()):+.4f}")
    print("exact log p(completion | prompt), mean:", float(exact.mean()))


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()  # --help: no measuring
    main()
