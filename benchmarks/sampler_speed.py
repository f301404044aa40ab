"""CPU time, wall time and network calls of the cached vs uncached masked sampler (MDLM cache, MATH.md §6.2),
and of bf16 vs fp32 denoiser calls.

For a time-independent masked denoiser, m_θ(· | x_t) depends only on x_t, so a step that reveals nothing can
reuse the previous output: at most L + 1 evaluations per sequence instead of K. This script measures, for
each number of steps K, both samplers side by side in one process (alternating repeats, same seeds), and
reports the ratio. Both runs consume the same random stream, so their samples must be identical; the script
checks this.

The denoiser is randomly initialised. Timing does not depend on what the weights are, and which positions
are revealed at each step depends only on the schedule and the seed. The thread count is pinned (default 1);
every repeat runs the compared modes back to back (alternating which goes first), and ratios are taken per
repeat and then the median, so the machine's load hits both sides alike. CPU time (`time.process_time`) is
reported beside wall time, with the load average at both ends.

    .venv/bin/python benchmarks/sampler_speed.py --steps 64,256,1024 --length 256 \
        --batch-size 4 --preset small --vocab 27 --repeats 3 --out benchmarks/results/sampler_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from tcsm.models import build_denoiser
from tcsm.paths import MaskedPath
from tcsm.sampling import sample


def run_once(model, path, *, K, L, B, seed, cached, device, precision="fp32"):
    """((wall s, CPU s), samples, stats) of one sampler run."""
    g = torch.Generator(device=device).manual_seed(seed)
    t0, c0 = time.perf_counter(), time.process_time()
    x, st = sample(model, path, batch_size=B, length=L, num_steps=K, generator=g, time_independent=cached,
                   device=device, return_stats=True, precision=precision)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0, time.process_time() - c0), x, st


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", default="64,256,1024")
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--vocab", type=int, default=27, help="clean vocabulary size V (27 = text8)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--precision-steps", type=int, default=64, help="K of the bf16-vs-fp32 comparison (0: skip)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()
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
        tc, tu = (statistics.median(w for w, _ in times[c]) for c in (True, False))
        cpu_ratio = statistics.median(u[1] / c[1] for c, u in zip(times[True], times[False]))
        row = {
            "steps": K,
            "cached_s": tc,
            "uncached_s": tu,
            "cached_cpu_s": statistics.median(c for _, c in times[True]),
            "uncached_cpu_s": statistics.median(c for _, c in times[False]),
            "speedup": tu / tc,
            "speedup_cpu": cpu_ratio,
            "cached_calls": stats[True].num_calls,
            "uncached_calls": stats[False].num_calls,
            "cached_evals_per_seq": stats[True].num_rows / B,
            "uncached_evals_per_seq": stats[False].num_rows / B,
            "identical_samples": identical,
        }
        rows.append(row)
        print(f"K={K:5d}  cached {tc:7.2f}s ({row['cached_calls']} calls, {row['cached_evals_per_seq']:.0f} "
              f"evals/seq)  uncached {tu:7.2f}s ({row['uncached_calls']} calls)  speed-up x{row['speedup']:.2f} "
              f"wall, x{cpu_ratio:.2f} CPU  identical={identical}", flush=True)
    precision = None
    if args.precision_steps:
        K = args.precision_steps
        runs = {"fp32": [], "bf16": []}
        for r in range(args.repeats):
            for p in ("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32"):
                dt, x, st = run_once(model, path, K=K, L=L, B=B, seed=args.seed + r, cached=False, device=device,
                                     precision=p)
                runs[p].append((dt, st.num_calls, x))
        per_call = {p: [d[1] / n for d, n, _ in v] for p, v in runs.items()}
        agree = statistics.median(float((a[2] == b[2]).float().mean()) for a, b in zip(runs["fp32"], runs["bf16"]))
        precision = {
            "steps": K,
            "fp32_cpu_s_per_call": statistics.median(per_call["fp32"]),
            "bf16_cpu_s_per_call": statistics.median(per_call["bf16"]),
            "speedup_cpu_per_call": statistics.median(a / b for a, b in zip(per_call["fp32"], per_call["bf16"])),
            "token_agreement": agree,
        }
        print(f"bf16 vs fp32 (K={K}, uncached): x{precision['speedup_cpu_per_call']:.2f} CPU time per call, "
              f"{100 * agree:.2f}% of tokens identical", flush=True)
    result = {
        "config": {**vars(args), "model_parameters": sum(p.numel() for p in model.parameters()),
                   "torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.machine(),
                   "loadavg_start": load_start, "loadavg_end": os.getloadavg()},
        "rows": rows,
        "precision": precision,
    }
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
