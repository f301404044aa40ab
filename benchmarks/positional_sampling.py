"""Tokens per CPU-second of the masked ancestral sampler with a denoiser that offers "positions" (called per step on
the rows that reveal, projected at the revealed positions only) against the same denoiser as a callable that declares
nothing (the full call: MDLM's cache for a time-independent model, every unfinished row every step for a
time-conditioned one), in one process, the two taking turns (order reversed every other round), one thread, random
weights (which positions a step reveals depends on the schedule and the seed only). Both draw the same tokens; the
script checks that.

    OMP_NUM_THREADS=1 python benchmarks/positional_sampling.py --time-conditioning --steps 1024 --length 256 \\
        --batch 4 --vocab 27 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import time


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--vocab", type=int, default=27)
    ap.add_argument("--length", type=int, default=256)
    ap.add_argument("--steps", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--time-conditioning", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None, help="JSON lines file to append the rounds to")
    return ap.parse_args(argv)


class Undeclared:
    """The model as a callable that declares nothing (its `cfg` kept, so the cache rule reads it)."""

    def __init__(self, model):
        self.model, self.cfg = model, model.cfg

    def __call__(self, xt, t):
        return self.model(xt, t)


def main(argv=None):
    args = _args(argv)
    import torch

    torch.set_num_threads(1)
    import tcsm
    from tcsm.models import build_denoiser
    from tcsm.sampling import sample

    V, L = args.vocab, args.length
    torch.manual_seed(0)
    model = build_denoiser(args.preset, vocab_size=V, num_states=V + 1, max_len=L,
                           time_conditioning=args.time_conditioning).eval()  # fmt: skip
    path = tcsm.MaskedPath(vocab_size=V, schedule=tcsm.LogLinearSchedule())
    pair = [("positions", model), ("full call", Undeclared(model))]
    for r in range(args.rounds):
        drawn = []
        for name, m in pair if r % 2 == 0 else pair[::-1]:
            c0, w0 = time.process_time(), time.perf_counter()
            with torch.no_grad():
                x, st = sample(m, path, batch_size=args.batch, length=L, num_steps=args.steps, seed=r, return_stats=True)
            cpu = time.process_time() - c0
            drawn.append(x)
            row = {"round": r, "sampler": name, "tok_per_cpu_s": x.numel() / cpu, "cpu_s": cpu,
                   "wall_s": time.perf_counter() - w0, "calls": st.num_calls, "row_calls": st.num_rows,
                   "load": os.getloadavg()[0], **{k: v for k, v in vars(args).items() if k not in ("out", "rounds")}}  # fmt: skip
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")
        if not torch.equal(*drawn):
            raise SystemExit("the two samplers drew different tokens")


if __name__ == "__main__":
    main()
