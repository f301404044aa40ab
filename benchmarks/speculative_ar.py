"""Tokens per CPU-second at batch 1: speculative decoding of an AR target with its KV-cached verifier
(`tcsm.sampling.rollback_cache`) and n-gram drafters (`tcsm.sampling.ngram`) counted on the target's training data
or on draws of the target itself (MATH.md §6.4),
against the target's own cached AR samplers, which have the same output law (p^AR at temperature 1).

Baselines: `sample_ar` (what `tcsm sample` runs for an AR run: `decode_ar`, eager on the CPU, one row at batch 1,
its linears per sequence for batch invariance) and a bare one-row loop (`decode` of one token against the static cache,
then a draw), the cheapest exact sampler of this model. Speculative configurations: n-gram order and draft length
k, the cached verifier, and once the uncached one (the whole prefix recomputed every pass). One sequence at a time,
configurations interleaved in rounds (order reversed every other round) after `--warmup` untimed sequences each, one
torch thread, CPU time by
`time.process_time` beside wall time, the 1-minute load average before and after every round.

    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python benchmarks/speculative_ar.py \\
        --target AR_RUN --out benchmarks/results/speculative_ar.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def bare_loop(model, L: int, V: int, g):
    """The cheapest exact sampler of an AR model at batch 1: one `decode` of one token against its static cache,
    then a draw, L times; the sequence [1, L]."""
    import torch

    from tcsm.sampling.common import categorical

    with torch.no_grad():
        cache = model.new_cache(1, "cpu")
        x = torch.zeros(1, L, dtype=torch.long)
        tok = torch.full((1, 1), int(model.bos_id))
        for j in range(L):
            lp = torch.log_softmax(model.decode(tok, cache)[:, -1, :V].double(), -1)
            x[:, j] = categorical(lp, g)
            tok = x[:, j : j + 1]
    return x


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="the AR target's run / checkpoint directory")
    ap.add_argument("--orders", default="3", help="n-gram orders of the drafters counted on the training data")
    ap.add_argument("--sample-orders", default="4,5", help="n-gram orders of the drafters counted on draws of the "
                    "target ('' for none)")
    ap.add_argument("--samples", type=int, default=4096, help="target draws the second kind of drafter counts "
                    "(batched, 256 a call; their CPU time is reported)")
    ap.add_argument("--draft-lengths", default="4,8", help="draft lengths k")
    ap.add_argument("--uncached-k", type=int, default=4, help="k of one uncached configuration (0: none)")
    ap.add_argument("--sequences", type=int, default=4, help="sequences per configuration and round (batch 1)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1, help="untimed sequences per configuration first (they fill "
                    "the n-gram drafters' memo of q per context, as a long-running sampler has it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="JSON file to write")
    args = ap.parse_args()

    import torch

    from tcsm.builders.loading import load_checkpoint
    from tcsm.sampling.ngram import NGramDraft
    from tcsm.sampling.speculative import speculative_decode
    from tcsm.targets.ar import sample_ar

    torch.set_num_threads(1)
    ckpt = load_checkpoint(args.target)
    model, path = ckpt.model.eval(), ckpt.build_path()
    L, V = int(ckpt.data_info["seq_len"]), int(path.vocab_size)
    c0 = time.process_time()
    train = ckpt.build_data().train.long()
    tables = {f"data {o}-gram": NGramDraft(train, V, order=o) for o in map(int, args.orders.split(",") if args.orders else [])}
    build_cpu = {"data": time.process_time() - c0}
    if args.sample_orders:
        c0 = time.process_time()
        g = torch.Generator().manual_seed(args.seed + 7)
        draws = torch.cat([sample_ar(model, 256, L, generator=g, engine="eager") for _ in range(args.samples // 256)])
        build_cpu["sample"] = time.process_time() - c0
        c0 = time.process_time()
        for o in map(int, args.sample_orders.split(",")):
            tables[f"{draws.shape[0]} draws {o}-gram"] = NGramDraft(draws, V, order=o)
        build_cpu["count_draws"] = time.process_time() - c0
    c0 = time.process_time()
    memo = {name: t.precompute() for name, t in tables.items()}  # q of the longest contexts, where they fit
    build_cpu["precompute"] = time.process_time() - c0
    print(f"drafters built: {build_cpu} CPU-s; contexts precomputed: {memo}", flush=True)

    def own(g):
        return sample_ar(model, 1, L, generator=g, engine="eager"), None

    def bare(g):
        return bare_loop(model, L, V, g), None

    def spec(table, k, cached):
        def go(g):
            return speculative_decode(model, path, 1, L, drafter=tables[table], draft_length=k, generator=g,
                                      cached=cached)  # fmt: skip
        return go

    configs = {"sample_ar (decode_ar)": own, "bare one-row cached loop": bare}
    for t in tables:
        for k in map(int, args.draft_lengths.split(",")):
            configs[f"speculative, cached, {t}, k={k}"] = spec(t, k, True)
    if args.uncached_k:
        t = list(tables)[-1]
        configs[f"speculative, uncached, {t}, k={args.uncached_k}"] = spec(t, args.uncached_k, False)
    for name, go in configs.items():
        for i in range(args.warmup):
            go(torch.Generator().manual_seed(10**6 + i))
    keys = ("cpu", "wall", "passes", "drafted", "accepted", "n")
    acc = {name: dict.fromkeys(keys, 0.0) for name in configs}
    loads = [os.getloadavg()[0]]
    for r in range(args.rounds):
        for name in (list(configs) if r % 2 == 0 else list(reversed(configs))):
            g = torch.Generator().manual_seed(args.seed + 1000 * r)
            a = acc[name]
            for _ in range(args.sequences):
                c0, w0 = time.process_time(), time.perf_counter()
                _, st = configs[name](g)
                a["cpu"] += time.process_time() - c0
                a["wall"] += time.perf_counter() - w0
                a["n"] += 1
                if st is None:
                    a["passes"] += L
                else:
                    a["passes"] += st.counts["sequence_passes"]
                    a["drafted"] += st.counts["drafted"]
                    a["accepted"] += st.counts["accepted"]
            print(f"round {r} {name}: {a['cpu']:.2f} CPU-s so far", flush=True)
        loads.append(os.getloadavg()[0])
    rows = []
    own_name, bare_name = list(configs)[:2]
    base = {name: acc[name]["n"] * L / acc[name]["cpu"] for name in (own_name, bare_name)}
    for name, a in acc.items():
        n = a["n"]
        tps = n * L / a["cpu"]
        row = {"sampler": name, "passes_per_sequence": a["passes"] / n,
               "acceptance": a["accepted"] / a["drafted"] if a["drafted"] else None,
               "tokens_per_cpu_s": tps, "tokens_per_wall_s": n * L / a["wall"], "sequences": n,
               "vs_sample_ar": tps / base[own_name], "vs_bare_loop": tps / base[bare_name],
               "fewer_passes": L / (a["passes"] / n)}  # fmt: skip
        rows.append(row)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    out = {"target": str(ckpt.directory), "target_step": ckpt.step,
           "target_params": sum(p.numel() for p in model.parameters()), "L": L, "V": V,
           "train_tokens": train.numel(), "drafter_build_cpu_s": build_cpu, "contexts_precomputed": memo, "rounds": args.rounds,
           "sequences": args.sequences, "warmup": args.warmup, "loadavg_1min": loads, "rows": rows}  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
