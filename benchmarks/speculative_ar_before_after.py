"""Tokens per CPU-second at batch 1 of speculative decoding of an AR target, this tree's `speculative_decode`
against an earlier version of `tcsm/sampling/speculative.py` (a file from git, loaded beside it on this tree's other
modules), with the same n-gram drafters and the bare one-row cached loop as the reference; every configuration
interleaved in the same process, so the load hits them alike. Both versions draw the same tokens for a seed, which
the script checks (passes and acceptance per configuration must agree).

    git show 196db60:src/tcsm/sampling/speculative.py > /tmp/speculative_before.py
    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python benchmarks/speculative_ar_before_after.py \\
        --target AR_RUN --before /tmp/speculative_before.py --out benchmarks/results/speculative_ar_before_after.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

from speculative_ar import bare_loop  # this script's folder is on sys.path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="the AR target's run / checkpoint directory")
    ap.add_argument("--before", required=True, help="an earlier speculative.py (from `git show`)")
    ap.add_argument("--orders", default="3", help="n-gram orders counted on the training data")
    ap.add_argument("--draft-lengths", default="4,8", help="draft lengths k")
    ap.add_argument("--sequences", type=int, default=4, help="sequences per configuration and round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="JSON file to write")
    args = ap.parse_args()

    import torch

    from tcsm.builders.loading import load_checkpoint
    from tcsm.sampling import registry
    from tcsm.sampling.ngram import NGramDraft
    from tcsm.sampling.speculative import speculative_decode

    spec = importlib.util.spec_from_file_location("speculative_before", args.before)
    before = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    register, registry.register_sampler = registry.register_sampler, lambda cls: cls  # its sampler: this tree's
    spec.loader.exec_module(before)
    registry.register_sampler = register
    torch.set_num_threads(1)
    ckpt = load_checkpoint(args.target)
    model, path = ckpt.model.eval(), ckpt.build_path()
    L, V = int(ckpt.data_info["seq_len"]), int(path.vocab_size)
    train = ckpt.build_data().train.long()
    tables = {f"data {o}-gram": NGramDraft(train, V, order=o) for o in map(int, args.orders.split(","))}
    for t in tables.values():
        t.precompute()

    def bare(g):
        bare_loop(model, L, V, g)

    def run(fn, table, k):
        def go(g):
            return fn(model, path, 1, L, drafter=tables[table], draft_length=k, generator=g)[1]
        return go

    configs = {"bare one-row cached loop": bare}
    for t in tables:
        for k in map(int, args.draft_lengths.split(",")):
            configs[f"before, {t}, k={k}"] = run(before.speculative_decode, t, k)
            configs[f"after, {t}, k={k}"] = run(speculative_decode, t, k)
    for go in configs.values():
        go(torch.Generator().manual_seed(10**6))
    acc = {name: {"cpu": 0.0, "n": 0, "passes": 0, "accepted": 0} for name in configs}
    loads = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for name in (list(configs) if r % 2 == 0 else list(reversed(configs))):
            g = torch.Generator().manual_seed(args.seed + 1000 * r)
            for _ in range(args.sequences):
                c0 = time.process_time()
                st = configs[name](g)
                acc[name]["cpu"] += time.process_time() - c0
                acc[name]["n"] += 1
                if st is not None:
                    acc[name]["passes"] += st.counts["sequence_passes"]
                    acc[name]["accepted"] += st.counts["accepted"]
        loads.append(os.getloadavg()[0])
    base = acc["bare one-row cached loop"]
    bare_tps = base["n"] * L / base["cpu"]
    rows = []
    for name, a in acc.items():
        tps = a["n"] * L / a["cpu"]
        row = {"sampler": name, "tokens_per_cpu_s": tps, "vs_bare_loop": tps / bare_tps,
               "passes_per_sequence": a["passes"] / a["n"] if a["passes"] else L,
               "cpu_ms_per_pass": 1000 * a["cpu"] / a["passes"] if a["passes"] else 1000 * a["cpu"] / (a["n"] * L)}
        rows.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    for name in configs:
        if name.startswith("before"):
            same = {k: acc[name][k] for k in ("passes", "accepted")}
            other = {k: acc[name.replace("before", "after", 1)][k] for k in ("passes", "accepted")}
            if same != other:
                raise SystemExit(f"{name}: the versions drew different tokens ({same} vs {other})")
    out = {"target": str(ckpt.directory), "before": args.before, "rounds": args.rounds, "sequences": args.sequences,
           "loadavg_1min": loads, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
