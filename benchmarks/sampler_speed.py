"""Wall time and network calls of the cached vs uncached masked sampler (MDLM cache, MATH.md §6.2).

For a time-independent masked denoiser, m_θ(· | x_t) depends only on x_t, so a step that reveals nothing can
reuse the previous output: at most L + 1 evaluations per sequence instead of K. This script measures, for
each number of steps K, both samplers side by side in one process (alternating repeats, same seeds), and
reports the ratio. Both runs consume the same random stream, so their samples must be identical; the script
checks this.

The denoiser is randomly initialised. Timing does not depend on what the weights are, and which positions
are revealed at each step depends only on the schedule and the seed.

    nice -n 10 .venv/bin/python benchmarks/sampler_speed.py --steps 64,256,1024 --length 256 \
        --batch-size 4 --preset small --vocab 27 --repeats 3 --out benchmarks/results/sampler_speed.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from tcsm.models import build_denoiser
from tcsm.paths import MaskedPath
from tcsm.sampling import sample


def run_once(model, path, *, K, L, B, seed, cached, device):
    g = torch.Generator(device=device).manual_seed(seed)
    t0 = time.perf_counter()
    x, st = sample(model, path, batch_size=B, length=L, num_steps=K, generator=g, time_independent=cached,
                   device=device, return_stats=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0, x, st


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", default="64,256,1024")
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--vocab", type=int, default=27, help="clean vocabulary size V (27 = text8)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    model = build_denoiser(args.preset, vocab_size=args.vocab, num_states=args.vocab + 1, max_len=args.length,
                           time_conditioning=False).to(device).eval()
    path = MaskedPath(args.vocab)
    L, B = args.length, args.batch_size
    run_once(model, path, K=4, L=L, B=B, seed=0, cached=False, device=device)  # warm-up (allocator, kernels)

    rows = []
    for K in (int(k) for k in args.steps.split(",")):
        times = {True: [], False: []}
        stats, outs = {}, {}
        for r in range(args.repeats):
            for cached in (True, False) if r % 2 == 0 else (False, True):  # alternate which mode goes first
                dt, x, st = run_once(model, path, K=K, L=L, B=B, seed=args.seed + r, cached=cached, device=device)
                times[cached].append(dt)
                stats[cached], outs[(cached, r)] = st, x
        identical = all(torch.equal(outs[(True, r)], outs[(False, r)]) for r in range(args.repeats))
        tc, tu = statistics.median(times[True]), statistics.median(times[False])
        row = {
            "steps": K,
            "cached_s": tc,
            "uncached_s": tu,
            "speedup": tu / tc,
            "cached_calls": stats[True].num_calls,
            "uncached_calls": stats[False].num_calls,
            "cached_evals_per_seq": stats[True].num_rows / B,
            "uncached_evals_per_seq": stats[False].num_rows / B,
            "identical_samples": identical,
        }
        rows.append(row)
        print(f"K={K:5d}  cached {tc:7.2f}s ({row['cached_calls']} calls, {row['cached_evals_per_seq']:.0f} "
              f"evals/seq)  uncached {tu:7.2f}s ({row['uncached_calls']} calls)  speed-up x{row['speedup']:.2f}  "
              f"identical={identical}", flush=True)
    result = {
        "config": {**vars(args), "model_parameters": sum(p.numel() for p in model.parameters()),
                   "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine()},
        "rows": rows,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
