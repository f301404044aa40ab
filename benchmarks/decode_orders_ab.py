"""The eager decoding-order loop's own CPU cost, two versions of `sampling/decoding.py` A/B in one process.

The denoiser returns fixed logits (no network), so what is timed is the loop itself: its draws from the rows'
streams, scores, selections and updates. `--base` names another tree's `src`; its `tcsm/sampling/decoding.py` is
loaded beside this tree's and both run on this tree's other modules, so the comparison is meaningful only when the
trees differ in that file alone. The two alternate in `--rounds` rounds of `--per-round` decodes each (the first
of the pair alternates too), one thread, `time.process_time`; both must draw the same tokens (checked first).
Medians of the rounds, per decode.

    python benchmarks/decode_orders_ab.py --base /work/main/src
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the other tree's src directory")
    ap.add_argument("--methods", default="confidence,threshold")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--length", type=int, default=16, help="positions of a decode (a block of a block model)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--per-round", type=int, default=25)
    a = ap.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    import tcsm.sampling.decoding as this
    from tcsm.paths import MaskedPath

    spec = importlib.util.spec_from_file_location("base_decoding", Path(a.base) / "tcsm/sampling/decoding.py")
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    V, L = 27, a.length
    path = MaskedPath(V)
    logits = torch.randn(1, L, V, generator=torch.Generator().manual_seed(0))

    def denoiser(x, t):
        return logits.expand(x.shape[0], L, V)

    print("| order | batch | base ms/decode | this tree ms/decode | speed ratio |\n|---|---|---|---|---|")
    for B in (int(b) for b in a.batches.split(",")):
        for method in a.methods.split(","):

            def run(mod, seed, B=B, method=method):
                return mod.decode(denoiser, path, batch_size=B, length=L, num_steps=a.steps, method=method,
                                  threshold=0.3, generator=torch.Generator().manual_seed(seed))[0]  # fmt: skip

            for s in range(10):
                if not torch.equal(run(base, s), run(this, s)):
                    raise SystemExit(f"{method} B={B}: the two versions draw different tokens")
            t = {"base": [], "this": []}
            for r in range(a.rounds):
                pair = (("base", base), ("this", this))
                for name, mod in pair if r % 2 else pair[::-1]:
                    c0 = time.process_time()
                    for s in range(a.per_round):
                        run(mod, s)
                    t[name].append((time.process_time() - c0) / a.per_round * 1e3)
            b, m = statistics.median(t["base"]), statistics.median(t["this"])
            print(f"| {method} | {B} | {b:.3f} | {m:.3f} | {b / m:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
