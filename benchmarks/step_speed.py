"""A tcsm training step against a hand-written PyTorch masked-diffusion loop of the same shape, and against the
machine's matmul peak — measured so that a loaded, shared machine cannot fake the answer.

Every configuration is timed in the same rounds (interleaved, start rotated), each visit for about the same
duration (`--visit-s`), with CPU time (`time.process_time`) beside wall time and the load average at both ends.
With one thread, CPU time is what the step costs; wall time also counts the waiting a busy machine imposes.

* `tcsm`: `Trainer(components, cfg).train_step()` — the library's real step (data fetch, masked L_distrib with
  κ_t weighting, backward, gradient clipping, fused AdamW), `small` denoiser (4 × 256, 4 heads), EMA off;
* `tcsm+compile`: the same with `train.compile=true` (torch.compile of the model);
* `hand-written`: a self-contained bidirectional transformer with adaLN time conditioning of the same sizes,
  written the way a user would (nn.Linear, F.scaled_dot_product_attention, LayerNorm), MDLM's masked
  cross-entropy with 1/t weight, clipping, `torch.optim.AdamW()` with its defaults;
* `matmul`: back-to-back [B·L, d] × [d, 4d] matmuls (the MLP's shape) for the same duration: the peak.

MFU = model FLOPs per step (`tcsm.models.flops_per_token`, PaLM accounting) ÷ (CPU seconds per step × peak),
where the peak is matmul FLOPs ÷ matmul CPU seconds in the same rounds and dtype.

    .venv/bin/python benchmarks/step_speed.py --out benchmarks/results/step_speed.json
    .venv/bin/python benchmarks/step_speed.py --report                      # markdown of --out
    .venv/bin/python benchmarks/step_speed.py --rounds 1 --visit-s 0.2 --batch 2 --seq-len 16 --no-compile  # smoke
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

V = 27  # text8's clean vocabulary


# --------------------------------------------------------------------------------------------- hand-written


class Block(nn.Module):
    def __init__(self, d, heads, cond):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d, elementwise_affine=False), nn.LayerNorm(d, elementwise_affine=False)
        self.qkv, self.proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.ada = nn.Linear(cond, 6 * d)

    def forward(self, x, c):
        s1, a1, g1, s2, a2, g2 = self.ada(F.silu(c))[:, None].chunk(6, dim=-1)
        h = self.ln1(x) * (1 + a1) + s1
        B, L, D = h.shape
        q, k, v = self.qkv(h).view(B, L, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, D)
        x = x + g1 * self.proj(y)
        h = self.ln2(x) * (1 + a2) + s2
        return x + g2 * self.fc2(F.gelu(self.fc1(h), approximate="tanh"))


class HandWritten(nn.Module):
    def __init__(self, d=256, layers=4, heads=4, cond=128, max_len=256):
        super().__init__()
        self.embed, self.pos = nn.Embedding(V + 1, d), nn.Parameter(torch.zeros(max_len, d))
        self.t_mlp = nn.Sequential(nn.Linear(256, cond), nn.SiLU(), nn.Linear(cond, cond))
        self.blocks = nn.ModuleList(Block(d, heads, cond) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, V)
        self.register_buffer("freqs", torch.exp(-math.log(1e4) * torch.arange(128) / 128))

    def forward(self, xt, t):
        arg = 1000 * t[:, None] * self.freqs
        c = self.t_mlp(torch.cat([arg.cos(), arg.sin()], -1))
        x = self.embed(xt) + self.pos[: xt.shape[1]]
        for b in self.blocks:
            x = b(x, c)
        return self.head(self.ln(x)).float()


def hand_written_step(batches, precision, model=None, device="cpu", compile_model=False):
    """The loop a user would write; `batches` yields clean [B, L] ids on `device`."""
    model = (model or HandWritten()).to(device)
    forward = torch.compile(model) if compile_model else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    it = iter(batches)
    device_type = torch.device(device).type

    def step():
        x1 = next(it)
        t = torch.rand(x1.shape[0], device=device).clamp_min(1e-3)
        masked = torch.rand(x1.shape, device=device) < (1 - t)[:, None]  # linear schedule: α_t = t
        xt = torch.where(masked, V, x1)
        with torch.autocast(device_type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = forward(xt, t)
        nll = F.cross_entropy(logits.transpose(1, 2), x1, reduction="none")
        loss = ((nll * masked).sum(1) / t).mean() / x1.shape[1]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


# --------------------------------------------------------------------------------------------- tcsm


def tcsm_step(train_tokens, args, precision, compile_model):
    from tcsm.builders import Components, load_config
    from tcsm.core.batch import Batch  # noqa: F401  (the trainer feeds Batch-compatible tensors)
    from tcsm.data.base import CharTokenizer, DataBundle
    from tcsm.models import build_denoiser
    from tcsm.objectives import Objective
    from tcsm.paths import make_path
    from tcsm.train import Trainer

    cfg = load_config("synthetic", [
        f"train.batch_size={args.batch}", f"train.precision={precision}", "train.ema=0", "train.threads=0",
        f"train.compile={str(compile_model).lower()}", "train.steps=1000000", "optim.warmup=1", "train.progress=false",
    ])
    path = make_path("masked", V, "linear")
    data = DataBundle("random", V, args.seq_len, train_tokens, train_tokens[:1], train_tokens[:1],
                      CharTokenizer("abcdefghijklmnopqrstuvwxyz "))
    model = build_denoiser("small", vocab_size=V, num_states=V + 1)
    parts = Components(data, path, model, None, Objective(path, loss="distrib"))
    trainer = Trainer(parts, cfg, None, log=lambda s: None)
    return trainer.train_step, model.cfg


# --------------------------------------------------------------------------------------------- timing


def matmul_block(rows, d, dtype):
    a, b = torch.randn(rows, d).to(dtype), torch.randn(d, 4 * d).to(dtype)
    flops = 2.0 * rows * d * 4 * d

    def step():
        torch.matmul(a, b)

    return step, flops


def timed_visit(fn, visit_s):
    """Run fn repeatedly for about visit_s wall seconds; (calls, wall s, CPU s)."""
    n, w0, c0 = 0, time.perf_counter(), time.process_time()
    while True:
        fn()
        n += 1
        w = time.perf_counter() - w0
        if w >= visit_s:
            return n, w, time.process_time() - c0


def rounds(timers, n_rounds, visit_s):
    out = {k: [] for k in timers}
    keys = list(timers)
    for r in range(n_rounds):
        for k in keys[r % len(keys):] + keys[: r % len(keys)]:
            calls, wall, cpu = timed_visit(timers[k], visit_s)
            out[k].append({"calls": calls, "wall_s": wall / calls, "cpu_s": cpu / calls})
        print(f"round {r + 1}/{n_rounds} done, load {os.getloadavg()[0]:.2f}", flush=True)
    return out


def summarise(raw, flops_step, flops_mm, precisions, labels):
    res = {}
    for p in precisions:
        mm_cpu = [x["cpu_s"] for x in raw[("matmul", p)]]
        peak = [flops_mm / c for c in mm_cpu]
        res[p] = {"matmul_peak_gflops_cpu": statistics.median(peak) / 1e9}
        for lab in labels:
            rows = raw.get((lab, p))
            if not rows:
                continue
            cpu = [x["cpu_s"] for x in rows]
            wall = [x["wall_s"] for x in rows]
            res[p][lab] = {
                "cpu_ms": 1e3 * statistics.median(cpu),
                "wall_ms": 1e3 * statistics.median(wall),
                "mfu_cpu": statistics.median([flops_step / c / pk for c, pk in zip(cpu, peak)]),
            }
        hw = raw.get(("hand-written", p))
        for lab in labels:
            if lab != "hand-written" and raw.get((lab, p)) and hw:
                ratios = [a["cpu_s"] / b["cpu_s"] for a, b in zip(raw[(lab, p)], hw)]
                res[p][lab]["cpu_ratio_to_hand_written"] = statistics.median(ratios)
    return res


def report(res):
    a = res["meta"]["args"]
    lines = [(f"`small` denoiser (4 × 256), batch {a['batch']} × length {a['seq_len']}, V = {V}, 1 thread; "
             f"{a['rounds']} interleaved rounds of ~{a['visit_s']} s per configuration; load average "
             f"{res['meta']['loadavg_start'][0]:.2f} → {res['meta']['loadavg_end'][0]:.2f}."), "",
             "| precision | configuration | CPU ms/step | wall ms/step | MFU (CPU time) | CPU-time ratio to hand-written |",
             "|---|---|---|---|---|---|"]
    for p, r in res["summary"].items():
        for lab, v in r.items():
            if isinstance(v, dict):
                ratio = v.get("cpu_ratio_to_hand_written")
                lines.append(f"| {p} | {lab} | {v['cpu_ms']:.0f} | {v['wall_ms']:.0f} | {100 * v['mfu_cpu']:.1f}% | "
                             f"{'' if ratio is None else f'{ratio:.2f}'} |")
        lines.append(f"| {p} | matmul peak | | | {r['matmul_peak_gflops_cpu']:.1f} GFLOP/s | |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/step_speed.json")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--visit-s", type=float, default=3.0, help="seconds per configuration per round")
    ap.add_argument("--precisions", default="bf16,fp32")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile configuration")
    ap.add_argument("--report", action="store_true", help="print the markdown table of --out and exit")
    args = ap.parse_args(argv)
    if args.report:
        print(report(json.loads(Path(args.out).read_text())))
        return
    torch.set_num_threads(1)
    torch.manual_seed(0)
    from tcsm.models import flops_per_token

    precisions = args.precisions.split(",")
    meta = {"command": " ".join([os.path.basename(sys.executable), *sys.argv]), "torch": torch.__version__,
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores (shared)", "threads": 1,
            "loadavg_start": os.getloadavg(), "args": vars(args)}
    tokens = torch.randint(0, V, (4096, args.seq_len), dtype=torch.long)
    stream = (tokens[torch.randint(0, 4096, (args.batch,))] for _ in iter(int, 1))
    timers, cfg = {}, None
    labels = ["tcsm", "hand-written"] + ([] if args.no_compile else ["tcsm+compile"])
    for p in precisions:
        timers[("tcsm", p)], cfg = tcsm_step(tokens, args, p, False)
        if not args.no_compile:
            timers[("tcsm+compile", p)], _ = tcsm_step(tokens, args, p, True)
        timers[("hand-written", p)] = hand_written_step(stream, p)
        timers[("matmul", p)], flops_mm = matmul_block(args.batch * args.seq_len, 256,
                                                       torch.bfloat16 if p == "bf16" else torch.float32)
    for fn in timers.values():  # warm-up (allocations, optimizer state, compilation)
        for _ in range(3):
            fn()
    flops_step = flops_per_token(cfg, args.seq_len) * args.batch * args.seq_len
    raw = rounds(timers, args.rounds, args.visit_s)
    meta["loadavg_end"] = os.getloadavg()
    res = {"meta": meta, "flops_per_step": flops_step, "summary": summarise(raw, flops_step, flops_mm, precisions, labels),
           "raw": {f"{k[0]}|{k[1]}": v for k, v in raw.items()}}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(report(res))


if __name__ == "__main__":
    main()
