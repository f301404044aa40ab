"""Decoding speed on the CPU of two source trees side by side (e.g. before and after a change to the decoders):
tokens per CPU-second of full-sequence cached ancestral, the confidence decoding order, block decoding (k = 16) with
its KV cache (ancestral, and the confidence order inside the blocks: block-confidence) and AR with its KV cache
(batch-invariant, and `ar-whole` with one product over all rows), at batch 1 and 8 (AR also at 64), `small` preset,
random weights, L = 256, fp32, one thread.
Each round runs every tree in a fresh process (trees alternate, so machine load hits them alike); a process warms up
with one decode per configuration, then times `--repeats` decodes per configuration (`time.process_time`, median;
wall time beside it).

    python benchmarks/decode_cpu.py --srcs /tmp/base/src,src --rounds 3 --out runs/decode_cpu.json
    python benchmarks/decode_cpu.py --srcs /tmp/base/src,src --only block,ar --batches 1 --repeats 3 --rounds 2
    python benchmarks/decode_cpu.py --srcs /tmp/base/src,src --paired --only full,confidence --rounds 4

`--paired` runs every tree in one process instead, alternating decode by decode: on a shared machine the
fresh-process rounds differ by up to 1.3x between processes of the same tree, which the paired rounds do not see.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

#: (decoder, batch, steps): full-sequence cached ancestral and the confidence decoding order (full-sequence model,
#: steps in all), block decoding (steps per block of 16; ancestral, or the confidence order: block-confidence), AR
#: (one token per call)
CONFIGS = [("full", 1, 64), ("block", 1, 4), ("ar", 1, 0), ("confidence", 1, 64), ("full", 8, 64), ("block", 8, 4),
           ("ar", 8, 0), ("confidence", 8, 64), ("ar", 64, 0), ("block-confidence", 1, 4),
           ("block-confidence", 8, 4), ("ar-whole", 1, 0), ("ar-whole", 8, 0), ("ar-whole", 64, 0)]  # fmt: skip
#: "ar-whole": AR outside `batch_invariance` (`sample.batch_invariant=false`: one product over all rows); on a tree
#: without that switch, plain AR


def decoders(length: int, engine: str = "auto", vocab: int = 27):
    """run(decoder, batch, steps, seed) → tokens, for the `tcsm` that imports now (random weights, seeded), the
    diffusion decoders under `sample.engine=engine`, over a vocabulary of `vocab` tokens."""
    import torch

    import tcsm
    from tcsm.models import build_denoiser
    from tcsm.models.blocks import build_block_denoiser
    from tcsm.models.lm_families import build_lm
    from tcsm.sampling.settings import draw, sample_settings
    from tcsm.targets.ar import sample_ar

    V, L, k = int(vocab), length, 16
    kw = {"vocab_size": V, "num_states": V + 1, "time_conditioning": False, "max_len": L}
    torch.manual_seed(0)
    full = build_denoiser("small", **kw).eval()
    blk = build_block_denoiser("small", k, **kw).eval()
    ar = build_lm("causal", "small", vocab_size=V, max_len=L).eval()
    path = tcsm.MaskedPath(vocab_size=V, schedule=tcsm.LogLinearSchedule())
    bpath = tcsm.MaskedPath(vocab_size=V, schedule=tcsm.LogLinearSchedule(), block_length=k)

    def run(name, B, steps, seed):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            if name.startswith("ar"):
                try:
                    from tcsm.models.layers import batch_invariance
                except ImportError:  # a tree from before the switch
                    from contextlib import nullcontext as batch_invariance
                with batch_invariance(name == "ar"):
                    return sample_ar(ar, B, L, g)
            model, p = (blk, bpath) if name.startswith("block") else (full, path)
            method = "confidence" if name.endswith("confidence") else "ancestral"
            settings = sample_settings({}, steps=steps, method=method, engine=engine)
            return draw(model, p, B, L, settings, generator=g)[0]

    return run


def child(length: int, configs, repeats: int, engine: str = "auto", vocab: int = 27) -> dict:
    import torch

    torch.set_num_threads(1)
    run = decoders(length, engine, vocab)
    out = {}
    for c in configs:
        run(*c, seed=0)
    for c in configs:
        cpu, wall = [], []
        for rep in range(repeats):
            c0, w0 = time.process_time(), time.perf_counter()
            x = run(*c, seed=1 + rep)
            cpu.append(x.numel() / (time.process_time() - c0))
            wall.append(x.numel() / (time.perf_counter() - w0))
        out[f"{c[0]} B={c[1]}"] = {"tok_per_cpu_s": statistics.median(cpu), "tok_per_wall_s": statistics.median(wall)}
    return out


def paired(srcs, length: int, configs, rounds: int, engine: str = "auto", vocab: int = 27) -> dict:
    """Tokens per CPU-second of every tree in this one process, decode by decode: for each configuration the trees
    take turns (their order reversed every round), the `tcsm` modules swapped between them, so that machine load and
    allocator state hit them alike. Round 0 warms each tree up first."""
    import torch

    torch.set_num_threads(1)
    res = {s: {} for s in srcs}
    for r in range(rounds):
        for c in configs:
            for s in srcs if r % 2 == 0 else srcs[::-1]:
                for name in [m for m in sys.modules if m == "tcsm" or m.startswith("tcsm.")]:
                    del sys.modules[name]
                sys.path[:] = [os.path.abspath(s)] + [p for p in sys.path if p not in map(os.path.abspath, srcs)]
                run = decoders(length, engine, vocab)
                if r == 0:
                    run(*c, seed=0)
                c0 = time.process_time()
                x = run(*c, seed=1 + r)
                res[s].setdefault(f"{c[0]} B={c[1]}", []).append(x.numel() / (time.process_time() - c0))
            print(f"round {r} {c[0]} B={c[1]}: " + ", ".join(f"{res[s][f'{c[0]} B={c[1]}'][-1]:.0f}" for s in srcs)
                  + f" (load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--srcs", default="src", help="comma-separated source trees (PYTHONPATH of each run)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--only", default=None, help="comma-separated decoder names of CONFIGS to run (full, block, block-confidence, ar, ar-whole, confidence)")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes of CONFIGS to run")
    ap.add_argument("--repeats", type=int, default=1, help="timed decodes per configuration in a process (median)")
    ap.add_argument("--paired", action="store_true",
                    help="every tree in one process, alternating decode by decode (one decode per tree and round)")
    ap.add_argument("--engine", default="auto", choices=["auto", "eager", "graph"],
                    help="sample.engine of the diffusion decoders (auto: eager on the CPU; graph: the engine's "
                         "fixed-shape calls, run eagerly on the CPU)")
    ap.add_argument("--vocab", type=int, default=27, help="vocabulary size of the random models (27: text8's)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    only = None if a.only is None else a.only.split(",")
    sizes = None if a.batches is None else [int(b) for b in a.batches.split(",")]
    configs = [c for c in CONFIGS if (only is None or c[0] in only) and (sizes is None or c[1] in sizes)]
    if a.child:
        print(json.dumps(child(a.length, configs, a.repeats, a.engine, a.vocab)))
        return 0
    srcs = a.srcs.split(",")
    loads = []
    if a.paired:
        per = paired(srcs, a.length, configs, a.rounds, a.engine, a.vocab)  # {tree: {decoder: [tok/CPU-s per round]}}
        loads.append(os.getloadavg()[0])
    else:
        runs = {s: [] for s in srcs}
        for r in range(a.rounds):
            for s in srcs:
                env = dict(os.environ, PYTHONPATH=os.path.abspath(s), OMP_NUM_THREADS="1")
                cmd = [sys.executable, __file__, "--child", "--length", str(a.length), "--repeats", str(a.repeats),
                       "--engine", a.engine, "--vocab", str(a.vocab)]  # fmt: skip
                cmd += ([] if a.only is None else ["--only", a.only]) + ([] if a.batches is None else ["--batches", a.batches])
                p = subprocess.run(cmd, env=env,
                                   capture_output=True, text=True, check=True)  # fmt: skip
                runs[s].append(json.loads(p.stdout.strip().splitlines()[-1]))
                loads.append(os.getloadavg()[0])
                print(f"round {r} {s}: " + ", ".join(f"{k} {v['tok_per_cpu_s']:.0f}" for k, v in runs[s][-1].items()),
                      flush=True)  # fmt: skip
        per = {s: {k: [run[k]["tok_per_cpu_s"] for run in runs[s]] for k in runs[s][0]} for s in srcs}
    print(f"load average during the runs: {min(loads):.1f}..{max(loads):.1f}")
    two = len(srcs) == 2
    print("| decoder | " + " | ".join(f"{s} tok/CPU-s" for s in srcs) + (" | ratio | ratios by round |" if two else " |"))
    print("|---" * (len(srcs) + 1 + 2 * two) + "|")
    table = {}
    for k in per[srcs[0]]:
        med = [statistics.median(per[s][k]) for s in srcs]
        table[k] = med
        rounds = [b / a for a, b in zip(per[srcs[0]][k], per[srcs[1]][k])] if two else []
        ratio = f" | {med[1] / med[0]:.2f} | {', '.join(f'{q:.2f}' for q in rounds)}" if two else ""
        print(f"| {k} | " + " | ".join(f"{m:,.0f}" for m in med) + ratio + " |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"srcs": srcs, "paired": a.paired, "runs": per, "median": table, "load": loads}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
