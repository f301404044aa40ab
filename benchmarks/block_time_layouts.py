"""Gradient variance of the layouts of a block model's per-block times on the antithetic grid.

A block path draws one time per (sequence, block): `ProbabilityPath.draw_times` takes B · nb times from the
objective's draw (antithetic by default: one shared offset, cells i / (B · nb)) and lays them out. The layouts:

* sequence-major (tcsm's): cell s · nb + b → the blocks of one sequence take neighbouring cells (correlated times);
* block-index-major: cell b · B + s → block b of every sequence in the b-th stretch of the grid;
* independent: an i.i.d. U(0, 1) time per block (one draw of size 1 per cell);
* per-block grid: an antithetic sweep of its own (own offset) per block index.

Each is marginally U(0, 1) per block, so each gives an unbiased gradient of the same loss; what differs is the
variance. A tiny block denoiser (tcsm's own, masked path, L_distrib) is first trained briefly on a synthetic Markov
source, then at fixed batches the gradient is drawn `--draws` times per layout (layouts interleaved draw by draw);
the figure is the trace of the gradient's covariance, Σ_params Var, averaged over the batches, and its ratio to the
sequence-major layout's.

    python benchmarks/block_time_layouts.py --length 16 --block 4 --batch 16 --batches 4 --draws 64
"""

from __future__ import annotations

import argparse
import json
import os
import time


def layouts():
    import torch

    def sequence_major(draw, B, nb):
        return draw(B * nb).view(B, nb)

    def block_major(draw, B, nb):
        return draw(B * nb).view(nb, B).T

    def independent(draw, B, nb):
        return torch.cat([draw(1) for _ in range(B * nb)]).view(B, nb)

    def per_block_grid(draw, B, nb):
        return torch.stack([draw(B) for _ in range(nb)], 1)

    return {"sequence-major": sequence_major, "block-index-major": block_major, "independent": independent,
            "per-block grid": per_block_grid}  # fmt: skip


def build(args):
    import torch

    from tcsm.builders.assemble import build_components
    from tcsm.builders.config import load_config

    cfg = load_config(None, [
        "model.d_model=32", "model.n_layers=2", "model.n_heads=2", "model.cond_dim=16", f"model.max_len={args.length}",
        f"data.seq_len={args.length}", f"data.vocab_size={args.vocab}", "data.num_train=2048", "data.num_valid=64",
        "data.num_test=64", f"path.block_length={args.block}", "path.source=masked", "train.device=cpu",
    ])  # fmt: skip
    torch.manual_seed(0)
    return build_components(cfg, torch.device("cpu"))


def grad(model, objective, x1, seed):
    import torch

    model.zero_grad(set_to_none=True)
    loss, _ = objective(model, x1, generator=torch.Generator().manual_seed(seed))
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).double()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=8)
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--batches", type=int, default=4, help="fixed batches the variance is averaged over")
    ap.add_argument("--draws", type=int, default=64, help="gradient draws per layout and batch")
    ap.add_argument("--train-steps", type=int, default=200, help="Adam steps before measuring")
    ap.add_argument("--out", default=None, help="JSON results file")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    wall, cpu = time.perf_counter(), time.process_time()
    parts = build(args)
    model, objective, data, path = parts.model, parts.objective, parts.data, parts.path
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    model.train()
    for step in range(args.train_steps):
        x1 = data.get_batch("train", torch.randint(0, data.train.shape[0], (32,), generator=g))
        loss, _ = objective(model, x1, generator=torch.Generator().manual_seed(10_000 + step))
        opt.zero_grad()
        loss.backward()
        opt.step()
    trained = time.perf_counter() - wall
    original = type(path).draw_times
    nb = args.length // args.block
    traces = {name: [] for name in layouts()}
    for b in range(args.batches):
        x1 = data.get_batch("valid", torch.arange(b * args.batch, (b + 1) * args.batch) % data.valid.shape[0])
        grads = {name: [] for name in layouts()}
        for d in range(args.draws):
            for name, lay in layouts().items():  # interleaved: the same load for every layout
                path.draw_times = lambda draw, B, L, lay=lay: path.position_times(lay(draw, B, nb), L)
                grads[name].append(grad(model, objective, x1, seed=1_000_000 * b + d))
        path.draw_times = original.__get__(path)
        for name, gs in grads.items():
            G = torch.stack(gs)
            traces[name].append(float(G.var(0, unbiased=True).sum()))
    ref = sum(traces["sequence-major"]) / args.batches
    summary = {name: {"grad_var_trace": sum(v) / len(v), "ratio_to_sequence_major": (sum(v) / len(v)) / ref,
                      "per_batch": v} for name, v in traces.items()}  # fmt: skip
    res = {"args": vars(args), "summary": summary, "train_wall_s": trained, "wall_s": time.perf_counter() - wall,
           "cpu_s": time.process_time() - cpu, "loadavg": os.getloadavg()}
    print(json.dumps(res, indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
