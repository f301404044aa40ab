"""Host reads, tensor ops and CPU time of one block decode, per source tree, engine, in-block sampler and number of
blocks: whether a block decode reads device values on the host once per block (they grow with the blocks) or only
before the first block and after the last (they do not), and what the eager path's host work per block is.

Host reads are the calls that bring a tensor's value to the host (bool(), item(), tolist(), nonzero(), int(),
float(), a tensor as a Python index), counted on the CPU, where every tensor is a host tensor (on a GPU each one
of them on a device tensor is a synchronisation); tensor ops are the aten calls of the decode (a dispatch mode
counts them); the time is the median CPU time (`time.process_time`) of `--repeats` decodes, without the counting
(a tree's decodes run together, so on a loaded machine the times scatter: `decode_cpu.py --paired` compares speed).
Random tiny block model (k = 16, V = 27, fp32), batch 1, one thread. The trees take turns in one process, their
`tcsm` modules swapped, as `decode_cpu.py --paired` does.

    python benchmarks/block_host_reads.py --srcs /tmp/base/src,src --blocks 2,6 --repeats 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def measure(method: str, engine: str, blocks: int, repeats: int) -> dict:
    """{reads, ops, ms_per_block} of a block decode with the `tcsm` that imports now."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    import tcsm
    from tcsm.models.blocks import build_block_denoiser
    from tcsm.sampling.settings import draw, sample_settings

    k, V = 16, 27
    L = k * blocks
    torch.manual_seed(0)
    model = build_block_denoiser("tiny", k, vocab_size=V, num_states=V + 1, max_len=L, check_inputs=False).eval()
    path = tcsm.MaskedPath(vocab_size=V, block_length=k)
    settings = sample_settings({}, steps=4, method=method, engine=engine)

    def run(seed):
        with torch.no_grad():
            return draw(model, path, 1, L, settings, generator=torch.Generator().manual_seed(seed))[0]

    run(0)
    reads = {"n": 0}
    originals = {}
    for name in ("__bool__", "item", "tolist", "nonzero", "__int__", "__float__", "__index__"):
        originals[name] = original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, **kw):
            reads["n"] += 1
            return _original(self, *a, **kw)

        setattr(torch.Tensor, name, counted)
    try:
        run(1)
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)
    ops = {"n": 0}

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops["n"] += 1
            return func(*args, **(kwargs or {}))

    with Count():
        run(1)
    times = []
    for r in range(repeats):
        c0 = time.process_time()
        run(2 + r)
        times.append(time.process_time() - c0)
    return {"reads": reads["n"], "ops": ops["n"], "ms_per_block": 1e3 * statistics.median(times) / blocks}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--srcs", default="src", help="comma-separated source trees (PYTHONPATH of each)")
    ap.add_argument("--blocks", default="2,6", help="comma-separated numbers of blocks of 16 positions")
    ap.add_argument("--engines", default="eager,graph", help="comma-separated sample.engine values")
    ap.add_argument("--methods", default="ancestral,confidence,threshold", help="comma-separated in-block samplers")
    ap.add_argument("--repeats", type=int, default=5, help="timed decodes per configuration (median)")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    srcs = a.srcs.split(",")
    rows, turn = [], 0
    for method in a.methods.split(","):
        for engine in a.engines.split(","):
            for blocks in (int(b) for b in a.blocks.split(",")):
                turn += 1
                for s in srcs if turn % 2 else srcs[::-1]:  # the first tree alternates
                    for name in [m for m in sys.modules if m == "tcsm" or m.startswith("tcsm.")]:
                        del sys.modules[name]
                    sys.path[:] = [os.path.abspath(s)] + [p for p in sys.path if p not in map(os.path.abspath, srcs)]
                    rows.append((method, engine, blocks, s, measure(method, engine, blocks, a.repeats)))
                    r = rows[-1][-1]
                    print(f"{method} {engine} {blocks} blocks {s}: {r['reads']} reads, {r['ops']} ops, "
                          f"{r['ms_per_block']:.2f} CPU-ms/block (load {os.getloadavg()[0]:.1f})", flush=True)  # fmt: skip
    print("| method | engine | blocks | " + " | ".join(f"{s}: reads, ops, CPU-ms/block" for s in srcs) + " |")
    print("|---" * (3 + len(srcs)) + "|")
    for i in range(0, len(rows), len(srcs)):
        method, engine, blocks = rows[i][:3]
        by_tree = {s: r for *_, s, r in rows[i : i + len(srcs)]}
        cells = [f"{by_tree[s]['reads']}, {by_tree[s]['ops']:,}, {by_tree[s]['ms_per_block']:.2f}" for s in srcs]
        print(f"| {method} | {engine} | {blocks} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
