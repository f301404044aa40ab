"""CPU cost of the block denoiser against the full-sequence one (same `small` trunk, random weights: speed only).

Training: one forward + backward of the one-pass block forward ([x_t; x_1] under the block mask) against a
full-sequence step, for several block lengths, with and without time conditioning. Decoding: one full-sequence
forward against one cached `denoise` call of the last block and one `extend_cache` by a block. One thread; the
minimum of a few `time.process_time()` repeats after a warm-up.

    .venv/bin/python benchmarks/block_model_speed.py
"""

from __future__ import annotations

import time

import torch

from tcsm.models import build_denoiser
from tcsm.models.blocks import build_block_denoiser


def _min_cpu(fn, n: int) -> float:
    fn()
    best = float("inf")
    for _ in range(n):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return best


def training(L: int = 256, B: int = 16) -> None:
    for tc in (False, True):
        kw = {"vocab_size": 27, "num_states": 28, "time_conditioning": tc, "max_len": L}
        torch.manual_seed(0)
        full = build_denoiser("small", **kw).train()
        x, x1, t = torch.randint(0, 28, (B, L)), torch.randint(0, 27, (B, L)), torch.rand(B)
        a = _min_cpu(lambda f=full, x=x, t=t: f(x, t).logsumexp(-1).sum().backward(), 3)
        row = [f"time conditioning {tc}: full sequence {a:.3f} CPU-s"]
        for k in (4, 16, 64, L):
            blk = build_block_denoiser("small", k, **kw).train()
            tp = torch.rand(B, L // k).repeat_interleave(k, 1)
            b = _min_cpu(lambda f=blk, x=x, tp=tp, x1=x1: f(x, tp, x1=x1).logsumexp(-1).sum().backward(), 3)
            row.append(f"k={k} {b:.3f} ({b / a:.2f}x)")
        print("; ".join(row), flush=True)


@torch.no_grad()
def decoding(L: int = 256, k: int = 16) -> None:
    for B in (1, 16):
        torch.manual_seed(0)
        kw = {"vocab_size": 27, "num_states": 28, "time_conditioning": False, "max_len": L}
        full = build_denoiser("small", **kw).eval()
        blk = build_block_denoiser("small", k, **kw).eval()
        x, t = torch.randint(0, 27, (B, L)), torch.rand(B)
        a = _min_cpu(lambda f=full, x=x, t=t: f(x, t), 5)
        cache = blk.new_cache(B)
        blk.extend_cache(cache, x[:, : L - k])
        d = _min_cpu(lambda f=blk, x=x, t=t, c=cache: f.denoise(x[:, L - k :], t, c), 5)
        grow = blk.new_cache(B)
        blk.extend_cache(grow, x[:, :128])

        def extend(blk=blk, grow=grow, x=x):
            grow.length = 128
            blk.extend_cache(grow, x[:, 128 : 128 + k])

        e = _min_cpu(extend, 5)
        print(f"B={B}: full-sequence forward (L={L}) {a * 1e3:.1f} ms; cached denoise of one block (k={k}, "
              f"{L - k} cached) {d * 1e3:.1f} ms ({a / d:.1f}x cheaper); extend_cache by one block {e * 1e3:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()  # --help: no measuring
    torch.set_num_threads(1)
    training()
    decoding()
