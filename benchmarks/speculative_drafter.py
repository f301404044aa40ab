"""Tokens per CPU-second at batch 1: speculative decoding of a masked target (MATH.md §6.4) with a small separate
drafter and with the self-drafter, against the target's own exact one-position-per-step sampler (`random` order,
K = L), which has the same output law.

Every configuration draws one sequence at a time (batch 1) through `tcsm.sampling.draw`, the call `tcsm sample` and
`tcsm eval --genppl` make; configurations are interleaved in rounds (the order reversed every other round), one torch
thread, CPU time by `time.process_time`. Reported per configuration: sequential target passes, target rows, drafter
passes per sequence, acceptance, tokens per CPU-second and its ratio to the baseline. `--row-cost` adds what one
pass of R rows of the target costs against one row, and one drafter pass: the ceiling of the verifier (below).

    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python benchmarks/speculative_drafter.py \\
        --target TARGET_RUN --drafter DRAFTER_RUN --out benchmarks/results/speculative_drafter.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="the masked target's run / checkpoint directory")
    ap.add_argument("--drafter", action="append", default=[], help="a drafter's run / checkpoint / exported "
                    "directory (repeatable)")
    ap.add_argument("--draft-lengths", default="2,4,8", help="k for the separate drafters")
    ap.add_argument("--self-draft-lengths", default="4", help="k for the self-drafter ('' for none)")
    ap.add_argument("--sequences", type=int, default=4, help="sequences per configuration and round (batch 1)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--row-cost", action="store_true", help="also time passes of R = 1..9 target rows and one "
                    "drafter row")
    ap.add_argument("--out", help="JSON file to write")
    args = ap.parse_args()

    import torch

    from tcsm.builders.loading import load_checkpoint, load_drafter
    from tcsm.sampling.settings import draw, sample_settings

    torch.set_num_threads(1)
    ckpt = load_checkpoint(args.target)
    model, path = ckpt.model, ckpt.build_path()
    L = int(ckpt.data_info["seq_len"])
    drafters = {d: load_drafter(d, "cpu", path.vocab_size) for d in args.drafter}

    def params(m):
        return sum(p.numel() for p in m.parameters())

    configs = {"one position per step (random, K = L)": (sample_settings(ckpt.config.sample, method="random",
                                                                           steps=L), None)}  # fmt: skip
    for k in [int(s) for s in args.self_draft_lengths.split(",") if s]:
        configs[f"speculative, self, k={k}"] = (sample_settings(ckpt.config.sample, method="speculative",
                                                                draft_length=k), None)  # fmt: skip
    for d, dm in drafters.items():
        for k in map(int, args.draft_lengths.split(",")):
            configs[f"speculative, drafter {Path(d).name}, k={k}"] = (
                sample_settings(ckpt.config.sample, method="speculative", draft_length=k, drafter=d), dm)
    keys = ("cpu", "wall", "passes", "rows", "draft_calls", "drafted", "accepted", "n")
    acc = {name: dict.fromkeys(keys, 0.0) for name in configs}
    loads = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for name in (list(configs) if r % 2 == 0 else list(reversed(configs))):
            settings, dm = configs[name]
            g = torch.Generator().manual_seed(args.seed + 1000 * r)
            a = acc[name]
            for _ in range(args.sequences):
                c0, w0 = time.process_time(), time.perf_counter()
                _, st = draw(model, path, 1, L, settings, generator=g, drafter_model=dm)
                a["cpu"] += time.process_time() - c0
                a["wall"] += time.perf_counter() - w0
                a["n"] += 1
                c = getattr(st, "counts", {})
                a["passes"] += c.get("sequence_passes", st.num_calls)
                a["rows"] += int(st.row_calls.sum()) if st.row_calls is not None else st.num_calls
                for key in ("draft_calls", "drafted", "accepted"):
                    a[key] += c.get(key, 0)
            print(f"round {r} {name}: {a['cpu']:.1f} CPU-s so far", flush=True)
        loads.append(os.getloadavg()[0])
    rows, base = [], None
    for name, a in acc.items():
        n = a["n"]
        row = {"sampler": name, "passes_per_sequence": a["passes"] / n, "target_rows_per_sequence": a["rows"] / n,
               "drafter_passes_per_sequence": a["draft_calls"] / n,
               "acceptance": a["accepted"] / a["drafted"] if a["drafted"] else None,
               "tokens_per_cpu_s": n * L / a["cpu"], "tokens_per_wall_s": n * L / a["wall"], "sequences": n}
        base = base or row
        row["tokens_per_cpu_s_vs_baseline"] = row["tokens_per_cpu_s"] / base["tokens_per_cpu_s"]
        row["fewer_passes"] = base["passes_per_sequence"] / row["passes_per_sequence"]
        rows.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    out = {"target": str(ckpt.directory), "target_step": ckpt.step, "target_params": params(model),
           "drafters": {d: params(m) for d, m in drafters.items()}, "L": L, "rounds": args.rounds,
           "sequences": args.sequences, "loadavg_1min": loads, "rows": rows}  # fmt: skip
    if args.row_cost:
        out["row_cost"] = row_cost(model, path, drafters, L, args.rounds)
        print(json.dumps(out["row_cost"]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


def row_cost(model, path, drafters, L, rounds):
    """Median CPU seconds of one pass of R rows of the target (all-mask inputs, t = 0) and of one drafter row."""
    import torch

    sizes = (1, 2, 3, 5, 9)
    cost = {f"target_{R}": [] for R in sizes} | {f"drafter {Path(d).name}": [] for d in drafters}
    mask = int(path.mask_id)
    with torch.no_grad():
        for r in range(rounds):
            jobs = [(f"target_{R}", model, R) for R in sizes] + [
                (f"drafter {Path(d).name}", m, 1) for d, m in drafters.items()]
            for name, m, R in (jobs if r % 2 == 0 else jobs[::-1]):
                x, t = torch.full((R, L), mask), torch.zeros(R)
                c0 = time.process_time()
                for _ in range(10):
                    m(x, t)
                cost[name].append((time.process_time() - c0) / 10)
    med = {k: sorted(v)[len(v) // 2] for k, v in cost.items()}
    one = med["target_1"]
    return {k: {"cpu_s": v, "relative_to_one_target_row": v / one} for k, v in med.items()}


if __name__ == "__main__":
    main()
