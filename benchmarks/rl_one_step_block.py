"""Which one-step RL form tracks the exact log-likelihood of a block model, by exact enumeration.

On a tiny p_1 over {0..V−1}^L (random Dirichlet tables), the exact block posterior (`tcsm.evaluation.exact.
ExactBlockDenoiser`: the best any block model can be) is scored by `OneStepEstimate` (prompt_mask_prob = 0) in the
two forms a block model can take:

* "blocks" — what tcsm computes on a block model: each completion block at the source, the blocks before it clean,
  ℓ = Σ_b Σ_{i ∈ b} log p(x^i | x^{<b});
* "source" — every completion token at the source at once (a one-block model of the same p_1), ℓ = Σ_i log p(x^i |
  prompt), d1's form on a full-sequence model;

against the exact log p(completion | prompt), over every sequence, weighted by p_1: the mean absolute gap (nats per
sequence) and the correlation of ℓ with the exact value among the completions of one prompt (what group-relative
advantages compare), averaged over prompts with p_1 weights.

    python benchmarks/rl_one_step_block.py --vocab 3 --length 6 --block 2 --prompt 2 --seeds 10
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time


def _weighted_corr(a, b, w):
    w = w / w.sum()
    ma, mb = (w * a).sum(), (w * b).sum()
    cov = (w * (a - ma) * (b - mb)).sum()
    va, vb = (w * (a - ma) ** 2).sum(), (w * (b - mb) ** 2).sum()
    return float(cov / (va * vb).sqrt()) if va > 0 and vb > 0 else float("nan")


def measure(V: int, L: int, k: int, P: int, seed: int, concentration: float) -> dict:
    import torch

    from tcsm.evaluation.exact import EnumerableDistribution, ExactBlockDenoiser
    from tcsm.paths import make_path
    from tcsm.posttrain.rl.estimators import OneStepEstimate

    dist = EnumerableDistribution.random(V, L, seed=seed, concentration=concentration)
    x = dist.states
    cond = torch.zeros_like(x, dtype=torch.bool)
    cond[:, :P] = True
    exact_joint = dist.log_probs
    prompt_idx = (x[:, :P] * (V ** torch.arange(P - 1, -1, -1))).sum(-1)
    prompt_mass = torch.zeros(V**P, dtype=torch.float64).index_add_(0, prompt_idx, dist.probs)
    exact = exact_joint - prompt_mass[prompt_idx].log()  # log p(completion | prompt)
    out = {}
    for form, block in (("blocks", k), ("source", L)):
        path = make_path("masked", V, "linear", block_length=block)
        model = ExactBlockDenoiser(dist, path, block)
        est = OneStepEstimate(path, prompt_mask_prob=0.0)
        with torch.no_grad():
            ell = est(model, x, cond).double()
        w = dist.probs
        gap = float((w * (ell - exact).abs()).sum())
        corr = [_weighted_corr(ell[prompt_idx == j], exact[prompt_idx == j], w[prompt_idx == j]) for j in range(V**P)]
        mass = prompt_mass
        ok = [(c, float(m)) for c, m in zip(corr, mass) if not math.isnan(c)]
        out[form] = {"mean_abs_gap_nats": gap, "within_prompt_corr": sum(c * m for c, m in ok) / sum(m for _, m in ok),
                     "max_abs_gap_nats": float((ell - exact).abs().max())}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=3)
    ap.add_argument("--length", type=int, default=6)
    ap.add_argument("--block", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=2, help="prompt tokens (a whole number of blocks)")
    ap.add_argument("--seeds", type=int, default=10, help="random p_1 tables")
    ap.add_argument("--concentration", type=float, nargs="+", default=[0.3, 1.0])
    ap.add_argument("--out", default=None, help="JSON results file")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    wall, cpu = time.perf_counter(), time.process_time()
    rows = []
    for c in args.concentration:
        for s in range(args.seeds):
            rows.append({"concentration": c, "seed": s, **measure(args.vocab, args.length, args.block, args.prompt, s, c)})
    summary = {}
    for c in args.concentration:
        sel = [r for r in rows if r["concentration"] == c]
        summary[str(c)] = {form: {key: sum(r[form][key] for r in sel) / len(sel) for key in sel[0][form]}
                           for form in ("blocks", "source")}
    res = {"args": vars(args), "summary": summary, "rows": rows, "wall_s": time.perf_counter() - wall,
           "cpu_s": time.process_time() - cpu, "loadavg": os.getloadavg()}
    print(json.dumps({k: res[k] for k in ("summary", "wall_s", "cpu_s", "loadavg")}, indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
