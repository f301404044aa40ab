"""Speculative decoding (MATH.md §6.4) against the target's own exact one-position-per-step sampler, on the synthetic
chain of `decoding_exact.py` (V = 2, L = 8, p(x) ∝ exp(1.5 · #{i: x_i = x_{i+1}})) with the exact posterior denoiser
as the target: sequential target passes and target rows per sequence, acceptance rate, CPU seconds, and the TV of
the draws to p_1 (both samplers are exact here, so both sit at the sampling floor).

The baseline is the `random` decoding order with K = L steps (one uniformly chosen position per call: the law
speculative decoding keeps with reveal_order=random). Drafters: the target itself (`self`, no extra pass) and a
deliberately poor one (the exact denoiser of the chain without coupling, i.e. uniform tokens: one drafter pass).
Configurations are interleaved in rounds; CPU time by `time.process_time`, one thread.

    .venv/bin/python benchmarks/speculative.py --out benchmarks/results/speculative_chain.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import time
from pathlib import Path


def markov_chain(length: int, coupling: float):
    import torch

    from tcsm.evaluation.exact import EnumerableDistribution

    states = list(itertools.product(range(2), repeat=length))
    w = [math.exp(coupling * sum(s[i] == s[i + 1] for i in range(length - 1))) for s in states]
    return EnumerableDistribution(torch.tensor(w), 2, length)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", "--num-samples", type=int, default=4000, help="sequences per configuration and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--draft-lengths", default="1,2,4,8")
    ap.add_argument("--batch-one", type=int, default=100, help="sequences drawn one at a time (batch 1) per round")
    ap.add_argument("--out", help="JSON file to write")
    ap.add_argument("--row-cost", action="store_true",
                    help="instead: CPU seconds of one pass of R rows (R = 1, 2, 3, 5, 9) of a 3 x 128 masked denoiser at L = 128, "
                         "V = 27 (untrained weights: timing only), i.e. what a verifier pass of k+1 rows costs at batch 1")
    args = ap.parse_args()
    if args.row_cost:
        return row_cost(args)

    import torch

    from tcsm.paths import MaskedPath
    from tcsm.sampling.decoding import decode
    from tcsm.sampling.speculative import speculative_decode

    torch.set_num_threads(1)
    L = 8
    dist, poor = markov_chain(L, 1.5), markov_chain(L, 0.0)
    path = MaskedPath(2)
    target, drafter = dist.denoiser(path), poor.denoiser(path)

    def tv(x):
        emp = torch.bincount(dist.index(x), minlength=dist.states.shape[0]).double() / x.shape[0]
        return 0.5 * float((emp - dist.probs).abs().sum())

    def baseline(n, g):
        x, st = decode(target, path, batch_size=n, length=L, num_steps=L, method="random", generator=g)
        return x, {"passes": L * n, "rows": int(st.row_calls.sum()), "drafted": 0, "accepted": 0, "draft_passes": 0}

    def spec(k, order, d):
        def f(n, g):
            x, st = speculative_decode(target, path, n, L, drafter=d, draft_length=k, order=order, generator=g)
            c = st.counts
            return x, {"passes": c["sequence_passes"], "rows": st.num_rows, "drafted": c["drafted"],
                       "accepted": c["accepted"], "draft_passes": c["draft_calls"] if d is None else c["draft_rows"]}
        return f

    configs = {"one position per step (random order, K = L)": baseline}
    for k in map(int, args.draft_lengths.split(",")):
        configs[f"speculative, self, random, k={k}"] = spec(k, "random", None)
        configs[f"speculative, self, left_to_right, k={k}"] = spec(k, "left_to_right", None)
    configs["speculative, poor drafter, random, k=2"] = spec(2, "random", drafter)

    acc = {name: {"passes": 0, "rows": 0, "drafted": 0, "accepted": 0, "draft_passes": 0, "n": 0, "cpu": 0.0,
                  "wall": 0.0, "tv": [], "cpu1": 0.0, "n1": 0} for name in configs}  # fmt: skip
    for r in range(args.rounds):
        names = list(configs) if r % 2 == 0 else list(reversed(configs))
        for name in names:
            g = torch.Generator().manual_seed(1000 * r + 1)
            c0, w0 = time.process_time(), time.perf_counter()
            x, counts = configs[name](args.num_samples, g)
            a = acc[name]
            a["cpu"] += time.process_time() - c0
            a["wall"] += time.perf_counter() - w0
            a["n"] += args.num_samples
            a["tv"].append(tv(x))
            for key, v in counts.items():
                a[key] += v
            c0 = time.process_time()
            for _ in range(args.batch_one):
                configs[name](1, g)
            a["cpu1"] += time.process_time() - c0
            a["n1"] += args.batch_one
    rows = []
    base = acc[next(iter(configs))]
    for name, a in acc.items():
        n = a["n"]
        row = {"sampler": name, "passes_per_sequence": a["passes"] / n, "rows_per_sequence": a["rows"] / n,
               "acceptance": a["accepted"] / a["drafted"] if a["drafted"] else None,
               "drafter_passes_per_sequence": a["draft_passes"] / n if "poor" in name else 0.0,
               "tokens_per_cpu_s": n * L / a["cpu"], "tokens_per_cpu_s_batch1": a["n1"] * L / a["cpu1"],
               "tv_to_p1": sum(a["tv"]) / len(a["tv"]),
               "fewer_passes": (base["passes"] / base["n"]) / (a["passes"] / n)}  # fmt: skip
        row["speedup_cpu_batch1"] = row["tokens_per_cpu_s_batch1"] / (base["n1"] * L / base["cpu1"])
        rows.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({
            "source": "markov chain V=2 L=8 coupling 1.5, exact posterior denoiser as target",
            "num_samples": args.num_samples, "rounds": args.rounds, "batch_one": args.batch_one,
            "loadavg": os.getloadavg(), "rows": rows}, indent=1) + "\n")  # fmt: skip


def row_cost(args) -> None:
    import torch

    from tcsm.models.transformer import build_denoiser

    torch.set_num_threads(1)
    model = build_denoiser("tiny", d_model=128, n_layers=3, n_heads=4, max_len=128, vocab_size=27, num_states=28,
                           time_conditioning=False).eval()  # fmt: skip
    g = torch.Generator().manual_seed(0)
    cost = {R: [] for R in (1, 2, 3, 5, 9)}
    with torch.no_grad():
        for r in range(args.rounds):
            for R in ((1, 2, 3, 5, 9) if r % 2 == 0 else (9, 5, 3, 2, 1)):
                x = torch.randint(0, 28, (R, 128), generator=g)
                t = torch.zeros(R)
                c0 = time.process_time()
                for _ in range(5):
                    model(x, t)
                cost[R].append((time.process_time() - c0) / 5)
    out = {R: sorted(v)[len(v) // 2] for R, v in cost.items()}
    for R, c in out.items():
        print(json.dumps({"rows": R, "cpu_s_per_pass": round(c, 5), "relative_to_one_row": round(c / out[1], 3)}))
    if args.out:
        Path(args.out).write_text(json.dumps({"model": "3 x 128 masked denoiser, L=128, V=27, untrained", "rounds":
                                              args.rounds, "loadavg": os.getloadavg(), "cpu_s_per_pass": out}, indent=1) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
