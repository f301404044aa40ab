"""The decoding orders against exact enumeration: TV(law of the samples, p_1) with the exact denoiser, for orders
that reveal several positions per step (where none is exact), under the random tie rule of
`tcsm.sampling.decoding` and under the former leftmost rule (`--leftmost` patches it back in, to measure it).

The source is a stationary 2-symbol Markov chain of length 8 (every position alike, neighbours correlated:
p(x) ∝ exp(1.5 · #{i: x_i = x_{i+1}})), so at the first steps the exact denoiser's scores tie at every position.

    .venv/bin/python benchmarks/decoding_exact.py --out benchmarks/results/decoding_exact.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "sampling"))
from test_samplers import empirical, exact_denoiser, tv

from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.paths import MaskedPath
from tcsm.sampling import decoding


def _leftmost_top_n(scores, eligible, n, generator=None):
    """The former rule: the n highest scores, ties to the leftmost position (a stable sort)."""
    s = scores.masked_fill(~eligible, -torch.inf)
    order = s.argsort(dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(s.shape[-1]).expand_as(order))
    return eligible & (rank < n.unsqueeze(-1))


def markov_chain(length: int = 8, coupling: float = 1.5) -> EnumerableDistribution:
    states = list(itertools.product(range(2), repeat=length))
    w = [math.exp(coupling * sum(s[i] == s[i + 1] for i in range(length - 1))) for s in states]
    return EnumerableDistribution(torch.tensor(w), 2, length)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", default="2,4", help="comma-separated numbers of steps")
    ap.add_argument("-n", "--num-samples", type=int, default=20000)
    ap.add_argument("--out", help="JSON file to write")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist = markov_chain()
    path = MaskedPath(2)
    rows = []
    for rule in ("random", "leftmost"):
        decoding._top_n = _leftmost_top_n if rule == "leftmost" else _top_n
        for K in map(int, args.steps.split(",")):
            row = {"ties": rule, "steps": K}
            for method in ("random", "margin", "entropy", "ancestral"):
                x, _ = decoding.decode(exact_denoiser(dist, path), path, batch_size=args.num_samples, length=dist.length,
                                       num_steps=K, method=method, generator=torch.Generator().manual_seed(0))  # fmt: skip
                row[method] = round(tv(empirical(dist, x), dist.probs), 4)
            print(json.dumps(row), flush=True)
            rows.append(row)
    decoding._top_n = _top_n
    if args.out:
        Path(args.out).write_text(json.dumps({"source": "markov chain V=2 L=8 coupling 1.5",
                                              "num_samples": args.num_samples, "tv": rows}, indent=1) + "\n")  # fmt: skip


_top_n = decoding._top_n

if __name__ == "__main__":
    main()
