"""CPU time of one draw of a joint student (a denoiser with a step head) with its joint step, for comparing two source
trees side by side: run it once per tree in alternating rounds, with PYTHONPATH naming the tree (docs/benchmarks.md,
"Few-step distillation: the teacher's rollout in lock step"). Prints one JSON line; `tokens_sum` checks that both
trees drew the same tokens.

    for r in 1 2 3; do for tree in /path/old /path/new; do OMP_NUM_THREADS=1 PYTHONPATH=$tree/src \\
        python benchmarks/joint_step_speed.py --student runs/fsj8 --label $(basename $tree); done; done
"""

from __future__ import annotations

import argparse
import json
import os
import time


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--student", required=True, help="the joint student run")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--num", type=int, default=256, help="sequences a draw")
    ap.add_argument("--length", type=int, default=None, help="sequence length (default: the model's max_len)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=None, help="JSON lines file to append the result to")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = _args(argv)
    import torch

    torch.set_num_threads(1)
    from tcsm.builders.loading import load_checkpoint
    from tcsm.paths import make_path
    from tcsm.sampling.settings import draw, sample_settings

    model = load_checkpoint(args.student).model
    path = make_path("masked", model.cfg.vocab_size)
    length = args.length or int(model.cfg.max_len)
    settings = sample_settings({}, steps=args.steps)
    with torch.no_grad():
        draw(model, path, 16, length, settings, generator=torch.Generator().manual_seed(args.seed))  # warm-up
        c0, t0 = time.process_time(), time.perf_counter()
        x, stats = draw(model, path, args.num, length, settings, generator=torch.Generator().manual_seed(args.seed))
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    result = {"label": args.label, "method": stats.method, "steps": args.steps, "num": args.num, "length": length,
              "cpu_s": cpu, "wall_s": wall, "tokens_per_cpu_s": args.num * length / cpu,
              "head_calls": stats.counts.get("head_calls"), "tokens_sum": int(x.sum()), "loadavg": os.getloadavg()}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(result) + "\n")
    return result


if __name__ == "__main__":
    main()
