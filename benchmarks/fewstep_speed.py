"""Tokens per CPU-second of a teacher and its few-step students (docs/benchmarks.md, "Few-step distillation: ..."):
each (model, steps) drawn at several row chunk sizes (`chunk_size`: rows a network call), the configurations taking
turns in every round (their order reversed every other round), one thread, `time.process_time` with the wall time
and the load average beside it. The tokens of a draw do not depend on its chunk size (each row draws from its own
stream); the script checks that.

    OMP_NUM_THREADS=1 python benchmarks/fewstep_speed.py --model teacher=runs/teacher:64 \\
        --model student=runs/student:8,4 --num 256 --chunks 256,32 --rounds 3 --out runs/fewstep_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", required=True, metavar="NAME=RUN:STEPS[,STEPS]",
                    help="a run and the step counts to draw it at (repeatable)")
    ap.add_argument("--num", type=int, default=256, help="sequences a draw")
    ap.add_argument("--chunks", default="256,32", help="rows a network call (comma-separated)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = _args(argv)
    import torch

    torch.set_num_threads(1)
    from tcsm.builders.loading import load_checkpoint
    from tcsm.sampling.settings import draw, sample_settings

    configs, models = [], {}
    for spec in args.model:
        name, rest = spec.split("=", 1)
        run, steps = rest.rsplit(":", 1)
        models[name] = load_checkpoint(run)
        configs += [(name, int(k), int(c)) for k in steps.split(",") for c in args.chunks.split(",")]
    cpu = {c: [] for c in configs}
    wall = {c: [] for c in configs}
    tokens: dict = {}
    loads = [os.getloadavg()[0]]
    with torch.no_grad():
        for r in range(args.rounds):
            for name, K, chunk in configs if r % 2 == 0 else configs[::-1]:
                ck = models[name]
                path, L = ck.build_path(), int(ck.data_info["seq_len"])
                g = torch.Generator().manual_seed(args.seed + r)
                c0, w0 = time.process_time(), time.perf_counter()
                x, _ = draw(ck.model, path, args.num, L, sample_settings(ck.config.sample, steps=K), generator=g,
                            chunk_size=chunk)  # fmt: skip
                cpu[name, K, chunk].append(x.numel() / (time.process_time() - c0))
                wall[name, K, chunk].append(x.numel() / (time.perf_counter() - w0))
                first = tokens.setdefault((name, K, r), x)
                if not torch.equal(first, x):
                    raise SystemExit(f"{name} at {K} steps drew other tokens at chunk size {chunk}")
            loads.append(os.getloadavg()[0])
            print(f"round {r}: " + ", ".join(f"{n}@{k}/{c} {cpu[n, k, c][-1]:.0f}" for n, k, c in configs), flush=True)
    rows = [{"model": n, "steps": k, "chunk": c, "tok_per_cpu_s": statistics.median(cpu[n, k, c]),
             "tok_per_cpu_s_rounds": cpu[n, k, c], "tok_per_wall_s": statistics.median(wall[n, k, c])}
            for n, k, c in configs]  # fmt: skip
    print(f"load average {min(loads):.1f}..{max(loads):.1f}")
    print("| model | steps | rows a call | tokens / CPU-s (median) | per round |\n|---|---|---|---|---|")
    for row in rows:
        per = ", ".join(f"{v:.0f}" for v in row["tok_per_cpu_s_rounds"])
        print(f"| {row['model']} | {row['steps']} | {row['chunk']} | {row['tok_per_cpu_s']:,.0f} | {per} |")
    result = {"args": vars(args), "rows": rows, "load": loads}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
