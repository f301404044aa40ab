"""Training speed benchmark: tokens/s, model FLOP utilisation, scaling with length and batch, loss overheads.

All measurements are taken side by side in one process: every repetition round visits every configuration once
(interleaved), and the reported value is the median over rounds, so slow drifts of a shared machine hit all
configurations alike. A training step is forward + loss + backward + AdamW update of the `small` denoiser on
random text8-sized tokens (V = 27), with t, x_t drawn as in training (MATH.md §3.4).

* peak: this machine's dense matmul FLOP/s per dtype (fp32, bf16), measured here with the same thread count;
* MFU = model FLOPs per second (tcsm.models.flops_per_token × tokens/s) ÷ that peak, same dtype;
* scaling: step time for sequence lengths and batch sizes, as ratios to the reference (B, L);
* overheads: step time (and loss-only time: loss + backward to the logits) of each loss ÷ plain cross-entropy.

Usage (see benchmarks/README.md):

    .venv/bin/python benchmarks/train_speed.py --out benchmarks/results/train_speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

V = 27  # text8 clean vocabulary


def autocast(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def matmul_timer(dtype: torch.dtype, shape, repeat: int = 3):
    """Seconds of one [n, k] @ [k, m] matmul (2nkm FLOPs), best of `repeat` back-to-back calls per visit."""
    n, k, m = shape
    a, b = torch.randn(n, k).to(dtype), torch.randn(k, m).to(dtype)
    torch.matmul(a, b)  # warm-up

    def visit() -> float:
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            best = min(best, time.perf_counter() - t0)
        return best

    return visit


class PlainCE:
    """The reference: masked x_t, then unweighted cross-entropy at every position (no TCSM machinery)."""

    def __init__(self, path):
        self.path = path

    def __call__(self, model, x1, generator=None):
        t = torch.rand(x1.shape[0], generator=generator)
        xt = self.path.draw_xt(x1, t, generator)
        logits = model(xt, t)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x1.reshape(-1)), {}

    def loss_from_logits(self, logits, x1, xt, t):
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x1.reshape(-1))


def objectives(paths):
    """name → (objective(model, x1, generator) → (loss, metrics), path kind)."""
    from tcsm.objectives import Objective
    from tcsm.objectives.sedd import ScoreEntropyObjective

    m, u = paths["masked"], paths["uniform"]
    return {
        "plain CE": (PlainCE(m), "masked"),
        "masked distrib KL": (Objective(m, loss="distrib"), "masked"),
        "masked score GKL": (Objective(m, loss="score"), "masked"),
        "masked score squared": (Objective(m, loss="score", divergence="squared"), "masked"),
        "masked score IS": (Objective(m, loss="score", divergence="is"), "masked"),
        "masked score logistic": (Objective(m, loss="score", divergence="logistic"), "masked"),
        "uniform distrib KL": (Objective(u, loss="distrib"), "uniform"),
        "uniform score GKL": (Objective(u, loss="score"), "uniform"),
        "uniform SEDD-style (bound B)": (ScoreEntropyObjective(u, bound="reversal"), "uniform"),
        "uniform DFM bound (A)": (ScoreEntropyObjective(u, bound="dfm"), "uniform"),
    }


def build(paths, kind, seq_len):
    from tcsm.models import build_denoiser

    return build_denoiser("small", vocab_size=V, num_states=paths[kind].num_states, max_len=max(256, seq_len),
                          time_conditioning=True, check_inputs=False)


def step_timer(model, objective, x1, precision, seed):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(seed)

    def step() -> float:
        t0 = time.perf_counter()
        with autocast(precision):
            loss, _ = objective(model, x1, generator=g)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    step()  # warm-up: allocations and AdamW state
    return step


def loss_only_timer(objective, logits0, x1, path, precision, seed):
    """Loss + backward to fixed logits (the model excluded): the loss's own cost."""
    from tcsm.objectives.sedd import ScoreEntropyObjective  # noqa: F401 (objectives share loss_from_batch)
    from tcsm.targets import DataTarget

    g = torch.Generator().manual_seed(seed)
    t = torch.rand(x1.shape[0], generator=g) * 0.98 + 0.01
    batch = DataTarget()(x1, t, path, g)

    def step() -> float:
        logits = logits0.clone().requires_grad_(True)
        t0 = time.perf_counter()
        with autocast(precision):
            if isinstance(objective, PlainCE):
                loss = objective.loss_from_logits(logits, x1, batch.xt, t)
            else:
                loss, _ = objective.loss_from_batch(logits, batch)
        loss.backward()
        return time.perf_counter() - t0

    step()
    return step


def interleave(timers: dict, rounds: int) -> dict:
    """Median seconds per timer, visiting every timer once per round (rotating the start each round)."""
    times = {k: [] for k in timers}
    keys = list(timers)
    for r in range(rounds):
        for k in keys[r % len(keys):] + keys[: r % len(keys)]:
            times[k].append(timers[k]())
    return {k: {"median_s": statistics.median(v), "all_s": [round(x, 5) for x in v]} for k, v in times.items()}


def report(res: dict) -> str:
    """Markdown tables of docs/benchmarks.md from a results file."""
    a = res["meta"]["args"]
    B, L, p = a["batch"], a["seq_len"], a["precision"]
    m = res["mfu"]
    shapes = list(m["fp32"]["matmul_flops_per_s_by_shape"])
    lines = [(f"`small` preset (4 × 256, {m['model_flops_per_token'] / 1e6:.1f} MFLOP/token for training at L = {L}), "
              f"batch {B} × length {L}, {res['meta']['threads']} thread(s). Matmul peak = best of the shapes "
              f"{', '.join(shapes)} (n×k×m) in the same rounds, same dtype."), "",
             "| precision | ms/step | tokens/s | model GFLOP/s | matmul peak GFLOP/s | MFU | matmul GFLOP/s by shape |",
             "|---|---|---|---|---|---|---|"]
    for prec in ("fp32", "bf16"):
        r = m[prec]
        by = ", ".join(f"{v / 1e9:.1f}" for v in r["matmul_flops_per_s_by_shape"].values())
        lines.append(f"| {prec} | {1e3 * r['step_s']:.0f} | {r['tokens_per_s']:.0f} | {r['model_flops_per_s'] / 1e9:.2f} | "
                     f"{r['matmul_peak_flops_per_s'] / 1e9:.1f} | {100 * r['mfu']:.1f}% | {by} |")
    lines += ["", f"Step time against sequence length and batch size ({p}; ratio to batch {B} × length {L}):", "",
              "| sweep | batch | length | ms/step | ratio | tokens/s | model GFLOP/s |", "|---|---|---|---|---|---|---|"]
    for r in sorted(res["scaling"], key=lambda r: (r["axis"] == "B", r["batch"], r["seq_len"])):
        sweep = "length" if r["axis"] == "L" else "batch"
        lines.append(f"| {sweep} | {r['batch']} | {r['seq_len']} | {1e3 * r['step_s']:.0f} | {r['ratio_to_ref']:.2f} | "
                     f"{r['tokens_per_s']:.0f} | {r['model_flops_per_s'] / 1e9:.2f} |")
    lines += ["", f"Loss overheads ({p}, batch {B} × length {L}), each ÷ plain cross-entropy:", "",
              "| loss | step ratio | loss + backward alone (ms) | loss-alone ratio |", "|---|---|---|---|"]
    for r in res["overheads"]:
        lines.append(f"| {r['loss']} | {r['step_ratio']:.3f} | {r['loss_only_ms']:.2f} | {r['loss_only_ratio']:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/train_speed.json")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16, help="reference batch")
    ap.add_argument("--seq-len", type=int, default=128, help="reference sequence length")
    ap.add_argument("--lengths", default="64,128,256,512")
    ap.add_argument("--batches", default="4,8,16,32")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved repetitions per measurement")
    ap.add_argument("--precision", default="bf16", help="precision of the scaling and overhead sections")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report", action="store_true", help="print the markdown tables of --out and exit")
    args = ap.parse_args(argv)
    if args.report:
        print(report(json.loads(Path(args.out).read_text())))
        return
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    from tcsm.models import flops_per_token
    from tcsm.paths import make_path

    t_start = time.perf_counter()
    paths = {k: make_path(k, V, "linear") for k in ("masked", "uniform")}
    res = {"meta": {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]), "torch": torch.__version__,
        "threads": args.threads, "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores (shared)",
        "loadavg_start": os.getloadavg(), "args": vars(args)}}
    g = torch.Generator().manual_seed(args.seed)
    B, L = args.batch, args.seq_len

    def tokens(b, length):
        return torch.randint(0, V, (b, length), generator=g)

    # 1. MFU of `small` (masked distrib, the default objective), fp32 vs bf16. Each round times the matmuls and a
    # training step of both dtypes back to back, so each round's ratio sees one load level. The matmul rate
    # depends on the shape (large operands fall out of cache), so the peak is the best of the model's own
    # matmul shapes and a cache-resident one.
    shapes = [(B * L, 256, 1024), (B * L, 1024, 256), (B * L, 256, 256), (256, 256, 1024)]
    obj = objectives(paths)["masked distrib KL"][0]
    model = build(paths, "masked", L)
    fpt = flops_per_token(model.cfg, L)
    x1 = tokens(B, L)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    timers = {("matmul", p, sh): matmul_timer(dt, sh) for p, dt in dtypes.items() for sh in shapes}
    timers |= {("step", p): step_timer(model, obj, x1, p, args.seed) for p in dtypes}
    med = interleave(timers, 2 * args.rounds)
    res["mfu"] = {"matmul_shapes": [list(sh) for sh in shapes], "model_flops_per_token": fpt}
    for p in dtypes:
        steps = med[("step", p)]["all_s"]
        rates = {sh: [2.0 * sh[0] * sh[1] * sh[2] / x for x in med[("matmul", p, sh)]["all_s"]] for sh in shapes}
        peak_rounds = [max(rates[sh][r] for sh in shapes) for r in range(len(steps))]
        mfu_rounds = [fpt * B * L / st / pk for st, pk in zip(steps, peak_rounds)]
        tps = B * L / med[("step", p)]["median_s"]
        res["mfu"][p] = {
            "step_s": med[("step", p)]["median_s"], "tokens_per_s": tps, "model_flops_per_s": fpt * tps,
            "matmul_peak_flops_per_s": statistics.median(peak_rounds),
            "matmul_flops_per_s_by_shape": {"x".join(map(str, sh)): statistics.median(v) for sh, v in rates.items()},
            "mfu": statistics.median(mfu_rounds), "step_all_s": steps,
        }
        r = res["mfu"][p]
        by = ", ".join(f"{k}: {v / 1e9:.1f}" for k, v in r["matmul_flops_per_s_by_shape"].items())
        print(f"[mfu] {p}: {tps:.0f} tok/s, {fpt * tps / 1e9:.2f} GFLOP/s model, matmul peak "
              f"{r['matmul_peak_flops_per_s'] / 1e9:.1f} GFLOP/s ({by}), MFU {100 * r['mfu']:.1f}%", flush=True)
    del timers

    # 2. scaling with sequence length (batch fixed) and batch size (length fixed).
    lengths = [int(x) for x in args.lengths.split(",")]
    batches = [int(x) for x in args.batches.split(",")]
    long_model = build(paths, "masked", max(lengths))
    configs = {("L", n): (B, n) for n in lengths} | {("B", b): (b, L) for b in batches}
    timers = {}
    for key, (b, n) in configs.items():
        if key in timers:
            continue
        timers[key] = step_timer(long_model, obj, tokens(b, n), args.precision, args.seed)
    med = interleave(timers, args.rounds)
    ref = med[("L", L)]["median_s"] if ("L", L) in med else None
    res["scaling"] = []
    for (axis, v), m in med.items():
        b, n = configs[(axis, v)]
        row = {"axis": axis, "batch": b, "seq_len": n, "step_s": m["median_s"], "tokens_per_s": b * n / m["median_s"],
               "ratio_to_ref": m["median_s"] / ref if ref else None,
               "model_flops_per_s": flops_per_token(long_model.cfg, n) * b * n / m["median_s"]}
        res["scaling"].append(row)
        print(f"[scaling] B={b} L={n}: {m['median_s'] * 1e3:.0f} ms/step, {row['tokens_per_s']:.0f} tok/s", flush=True)
    del timers, long_model

    # 3. loss overheads: full training steps and the loss alone, each ÷ plain cross-entropy.
    objs = objectives(paths)
    models = {k: build(paths, k, L) for k in ("masked", "uniform")}
    models["uniform"].load_state_dict(
        {k: v for k, v in models["masked"].state_dict().items() if not k.startswith("embed")}, strict=False)
    x1 = tokens(B, L)
    step_timers = {n: step_timer(models[kind], o, x1, args.precision, args.seed) for n, (o, kind) in objs.items()}
    with torch.no_grad(), autocast(args.precision):
        logits0 = models["masked"](paths["masked"].draw_xt(x1, torch.full((B,), 0.5), g), torch.full((B,), 0.5)).float()
    loss_timers = {n: loss_only_timer(o, logits0, x1, paths[kind], args.precision, args.seed)
                   for n, (o, kind) in objs.items()}
    med_step = interleave(step_timers, args.rounds)
    med_loss = interleave(loss_timers, 4 * args.rounds)  # cheap: more rounds
    ce_step, ce_loss = med_step["plain CE"]["median_s"], med_loss["plain CE"]["median_s"]
    res["overheads"] = []
    for n in objs:
        row = {"loss": n, "step_s": med_step[n]["median_s"], "step_ratio": med_step[n]["median_s"] / ce_step,
               "loss_only_ms": 1e3 * med_loss[n]["median_s"], "loss_only_ratio": med_loss[n]["median_s"] / ce_loss}
        res["overheads"].append(row)
        print(f"[overhead] {n}: step ×{row['step_ratio']:.3f}, loss-only {row['loss_only_ms']:.2f} ms "
              f"(×{row['loss_only_ratio']:.2f})", flush=True)
    res["meta"]["loadavg_end"] = os.getloadavg()
    res["meta"]["wall_s"] = round(time.perf_counter() - t_start, 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"wrote {out} in {res['meta']['wall_s']} s", flush=True)


if __name__ == "__main__":
    main()
