"""Does BD3-LM's clipped noise schedule lower the variance of small-block training? Measured, not assumed.

For a block-diffusion checkpoint (a run of `quality_budget.py --variant block-masked-4`, say) and fixed data, each
time range t ~ U[lo, hi] (`objective.t_range`; mask rates [β, ω] of BD3-LM are t ∈ [1 − ω, 1 − β] under the linear
schedule) draws `--draws` independent mini-batch estimates of the training loss and of its gradient at the same
weights. Reported per range: the loss estimate's mean and standard deviation, the gradient's noise
E‖g − ḡ‖² and its signal ‖ḡ‖², and their ratio (noise-to-signal: lower trains with less noise per step). The
clipped objective is a different objective (not the NELBO), so its mean loss is not comparable with the full
range's; the noise-to-signal ratio is. Configurations are interleaved in rounds; CPU time is recorded.

    .venv/bin/python benchmarks/block_clipping.py --run /work/qb_block/block-masked-4 \
        --ranges 0:1,0.2:0.7,0.05:0.55,0:0.5 --draws 48 --out benchmarks/results/block_clipping.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", required=True)
    ap.add_argument("--ranges", default="0:1,0.2:0.7,0.05:0.55,0:0.5", help="lo:hi time ranges")
    ap.add_argument("--draws", type=int, default=48, help="independent estimates per range")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=4, help="the draws are split into this many interleaved rounds")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from tcsm.builders.loading import load_checkpoint
    from tcsm.evaluation.report import write_report
    from tcsm.objectives import Objective

    ckpt = load_checkpoint(args.run, device="cpu")
    model, path, data = ckpt.model, ckpt.build_path(), ckpt.build_data()
    model.train()
    x1 = data.split("train")[: args.batch].long()
    ranges = [tuple(float(v) for v in r.split(":")) for r in args.ranges.split(",")]
    params = [p for p in model.parameters() if p.requires_grad]
    acc = {r: {"loss": [], "grads": [], "cpu_s": 0.0} for r in ranges}
    per_round = max(1, args.draws // args.rounds)
    for rnd in range(args.rounds):
        for r in ranges:
            obj = Objective(path, loss="distrib", weighting="kappa", t_range=None if r == (0.0, 1.0) else r)
            g = torch.Generator().manual_seed(10_000 * rnd + 17)
            c0 = time.process_time()
            for _ in range(per_round):
                model.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss, _ = obj(model, x1, g)
                loss.backward()
                acc[r]["loss"].append(float(loss))
                acc[r]["grads"].append(torch.cat([p.grad.reshape(-1).float() for p in params]))
            acc[r]["cpu_s"] += time.process_time() - c0
    rows = []
    for r in ranges:
        losses = torch.tensor(acc[r]["loss"], dtype=torch.float64)
        grads = torch.stack(acc[r]["grads"]).double()
        mean = grads.mean(0)
        noise = float(((grads - mean) ** 2).sum(-1).mean())
        signal = float((mean**2).sum())
        rows.append({"t_range": list(r), "mask_rates": [1 - r[1], 1 - r[0]], "loss_mean": float(losses.mean()),
                     "loss_sd": float(losses.std()), "grad_noise": noise, "grad_signal": signal,
                     "noise_to_signal": noise / max(signal, 1e-300), "draws": len(losses), "cpu_s": acc[r]["cpu_s"]})  # fmt: skip
        print(f"t ∈ [{r[0]:.2f}, {r[1]:.2f}] (mask rates [{1 - r[1]:.2f}, {1 - r[0]:.2f}]): loss {losses.mean():.4f} ± "
              f"{losses.std():.4f}  grad noise/signal {noise / max(signal, 1e-300):.3f}", flush=True)  # fmt: skip
    result = {"run": str(ckpt.directory), "step": ckpt.step, "block_length": path.block_length, "batch": args.batch,
              "threads": args.threads, "load_avg": os.getloadavg()[0], "command": " ".join(sys.argv), "rows": rows}  # fmt: skip
    if args.out:
        write_report(args.out, result)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))


if __name__ == "__main__":
    main()
