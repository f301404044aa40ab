"""The matrix products a decoder can give its rows, on the CPU: for each linear shape, whether a row's result is
bit-identical whatever the number of rows multiplied with it (batch invariance), and the CPU time of one product
for N sequences of one token each. Three products:

- `whole`: `F.linear` over all N rows (MKL; another kernel, another summation order, at 1-3 rows than at 4 and up);
- `per-sequence`: one batched call whose entries are the sequences (`models.causal._per_sequence`: a
  matrix-vector product per row, invariant by construction);
- `onednn-packed`: oneDNN with the weight reordered once for a batch of 64 (`torch.ops.mkldnn`), not used by tcsm.

One thread, fp32, median of `--repeats` timings of `--calls` products each, configurations interleaved.

    python benchmarks/row_products.py --out runs/row_products.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

#: (d_in, d_out): the small AR preset's qkv / fc / proj / head, then wider layers
SHAPES = [(128, 384), (128, 512), (512, 128), (256, 768), (512, 1536), (768, 2304), (3072, 768)]
ROWS = [1, 2, 3, 4, 5, 8, 16, 63, 64, 256]


def products(W, b):
    import torch
    import torch.nn.functional as F

    out = {
        "whole": lambda x: F.linear(x, W, b),
        "per-sequence": lambda x: torch.baddbmm(b, x.unsqueeze(1), W.t().expand(x.shape[0], -1, -1)).squeeze(1),
    }
    if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        packed = torch.ops.mkldnn._reorder_linear_weight(W, 64)
        out["onednn-packed"] = lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
    return out


def invariant(f, X) -> bool:
    """Whether every row of f(X[:m]) equals f of that row alone, for every m in ROWS."""
    import torch

    alone = torch.cat([f(X[i : i + 1]) for i in range(X.shape[0])])
    return all(torch.equal(f(X[:m]), alone[:m]) for m in ROWS)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,8,64", help="comma-separated sequence counts to time")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    batches = [int(b) for b in a.batches.split(",")]
    rows = {}
    for din, dout in SHAPES:
        lin = torch.nn.Linear(din, dout)
        W, b = lin.weight.detach(), lin.bias.detach()
        fs = products(W, b)
        X = torch.randn(max(ROWS), din)
        times = {(name, B): [] for name in fs for B in batches}
        for _ in range(a.repeats):
            for B in batches:
                x = torch.randn(B, din)
                for name, f in fs.items():
                    for _ in range(3):
                        f(x)
                    c = time.process_time()
                    for _ in range(a.calls):
                        f(x)
                    times[(name, B)].append((time.process_time() - c) / a.calls * 1e6)
        for name, f in fs.items():
            med = {B: statistics.median(times[(name, B)]) for B in batches}
            rows[f"{din}x{dout} {name}"] = {"invariant": invariant(f, X), "us": med}
            print(f"{din:>5} -> {dout:<5} {name:<14} invariant {rows[f'{din}x{dout} {name}']['invariant']!s:<5} "
                  + "  ".join(f"N={B}: {med[B]:8.1f} us" for B in batches), flush=True)  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.1f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rows": rows, "load": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
