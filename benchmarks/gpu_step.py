"""The GPU path of a tcsm training step, measured on the GPU it runs on: the `text8-paper` preset (12 × 768,
12 heads, length 256) in bf16 with fused AdamW, flash SDPA and torch.compile.

In the same interleaved rounds, each configuration for about `--visit-s` seconds (CUDA-synchronised at both ends
of a visit, wall time; host CPU time beside it):

* `tcsm` / `tcsm+compile`: `Trainer.train_step()` of a `text8-paper` run on text8-prefix (data fetch, masked
  L_distrib with κ_t weighting, backward, clipping, fused AdamW; EMA off, as the hand-written loop has none);
* `hand-written` / `hand-written+compile`: `step_speed.py`'s self-contained loop at the same sizes (nn.Linear,
  F.scaled_dot_product_attention, LayerNorm, MDLM's masked cross-entropy with 1/t weight, clipping,
  `torch.optim.AdamW()` with its defaults);
* `tcsm block k=16 sdpa` / `... flex` (+compile): the same run as a block model (`path.block_length=16`, MATH.md
  §9), its one pass over [x_t; x_1] (2L − k tokens) under the block mask given to SDPA as an explicit boolean mask
  (`model.attention=sdpa`: no flash kernel) or as FlexAttention block masks (`model.attention=flex`); compiled
  only, unless --no-compile; flex only on a GPU (FlexAttention has no backward pass on a CPU);
* `dense peak`: back-to-back 8192 × 8192 × 8192 bf16 matmuls; `mlp matmul`: [B·L, d] × [d, 4d], the MLP's shape.

MFU = model FLOPs per step (`tcsm.models.flops_per_token`, PaLM accounting) ÷ (step seconds × dense peak of the
same rounds). For a block step the FLOPs are `tcsm.models.blocks.block_flops_per_sequence`: every matmul of the
one pass (2L − k tokens through all layers but the last, the L noisy ones through the last and the head) and the
attention products of the query-key pairs the mask allows ("unmasked"; the table's MFU); the JSON and the table
also give the dense-equivalent MFU, every pair of the pass counted (what SDPA with an explicit mask computes).
Tokens/s counts the B·L data tokens of a step for every row. Also checked: no host sync in a step (`torch.cuda.set_sync_debug_mode("error")` over steps after
warm-up), which SDPA kernel the model's attention can run (flash forced), the validation bound and denoiser
distributions under bf16 against fp32 on the partly trained model, and the sampler's per-call time in bf16 vs fp32.

    python3 benchmarks/gpu_step.py --data ../shared/data/text8/text8_prefix.txt.gz --out benchmarks/results/gpu_step.json
    python3 benchmarks/gpu_step.py --seq-len 1024 --batch 32 --out benchmarks/results/gpu_step_1024.json
    python3 benchmarks/gpu_step.py --report                    # markdown of --out
    .venv/bin/python benchmarks/gpu_step.py --smoke --data <text8 file> --out /tmp/gpu_step_smoke.json
        # a few seconds on a CPU: tiny preset, L = 32, block length 8, one short round, no compile; checks the
        # script, measures nothing
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_speed import HandWritten, hand_written_step


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_trainer(args, compile_model: bool, attention: str | None = None):
    """The `text8-paper` run; with `attention` (sdpa | flex) as a block model of `--block-length`."""
    from tcsm.builders import load_config
    from tcsm.train import Trainer

    block = [] if attention is None else [f"path.block_length={args.block_length}", f"model.attention={attention}"]
    cfg = load_config("text8-paper", [
        f"data.path={args.data}", "data.split=prefix", f"data.seq_len={args.seq_len}", f"model.preset={args.preset}",
        f"model.max_len={args.seq_len}", f"train.batch_size={args.batch}", f"train.precision={args.precision}", "train.ema=0",
        f"train.device={args.device}", f"train.compile={str(compile_model).lower()}", "optim.warmup=1",
        "train.progress=false", *block,
    ])
    return Trainer.from_config(cfg, None, log=lambda s: None)


def block_attentions(device) -> list[str]:
    """The block step's attention backends this device can train: FlexAttention has no backward pass on a CPU."""
    return ["sdpa", "flex"] if device.type == "cuda" else ["sdpa"]


def hand_written(trainer, args, compile_model: bool):
    m = trainer.model.cfg
    model = HandWritten(d=m.d_model, layers=m.n_layers, heads=m.n_heads, cond=m.cond_dim, max_len=m.max_len)
    train = trainer.data.train.to(trainer.device, torch.long)
    stream = (train[torch.randint(0, train.shape[0], (args.batch,), device=trainer.device)] for _ in iter(int, 1))
    return hand_written_step(stream, "bf16", model=model, device=trainer.device, compile_model=compile_model)


def matmul(rows, inner, cols, device):
    a = torch.randn(rows, inner, device=device, dtype=torch.bfloat16)
    b = torch.randn(inner, cols, device=device, dtype=torch.bfloat16)
    return (lambda: torch.matmul(a, b)), 2.0 * rows * inner * cols


def calls_for(fn, device, visit_s):
    sync(device)
    w0 = time.perf_counter()
    for _ in range(3):
        fn()
    sync(device)
    return max(3, round(visit_s / ((time.perf_counter() - w0) / 3)))


def visit(fn, n, device):
    sync(device)
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(n):
        fn()
    sync(device)
    return {"calls": n, "wall_s": (time.perf_counter() - w0) / n, "cpu_s": (time.process_time() - c0) / n}


def sync_points(fn, device, steps=3):
    """{} when `steps` calls make no host sync, else {"file:line <- caller ...": count} for each sync PyTorch's
    sync debug mode reports (it sees stream/device synchronisations, blocking copies, `.item()`, `nonzero`)."""
    if device.type != "cuda":
        return {"not checked": "CPU"}
    seen: dict[str, int] = {}

    def record(message, category, filename, lineno, file=None, line=None):
        if "called a synchronizing" not in str(message):  # not e.g. the mode's own "prototype" notice
            return
        frames = [f for f in traceback.extract_stack()[:-1] if "warnings" not in f.filename]
        where = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(frames[-5:]))
        seen[where] = seen.get(where, 0) + 1

    sync(device)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sync(device)
    return seen


def profile(fn, device, steps=5, rows=18) -> str:
    """The kernels (and ops) that take the device's time over `steps` calls, as PyTorch's profiler table."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as prof

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with prof(activities=acts) as p:
        for _ in range(steps):
            fn()
        sync(device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return p.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60)


def flash_usable(trainer) -> str:
    """Run the model's forward with SDPA restricted to the flash kernel: 'yes', or why not."""
    if trainer.device.type != "cuda":
        return "not checked (CPU)"
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tcsm.models.kinds import kind_of

    x = trainer.data.get_batch("valid", torch.arange(2), trainer.device)
    clean = {"x1": x} if kind_of(trainer.model).blocks else {}  # a block model's one pass reads x_1 too
    try:
        with torch.no_grad(), sdpa_kernel([SDPBackend.FLASH_ATTENTION]), torch.autocast("cuda", torch.bfloat16):
            trainer.model(x, torch.full((2,), 0.5, device=trainer.device), **clean)
        return "yes"
    except RuntimeError as e:
        return "no: " + str(e).splitlines()[0]


def numerics(trainer, args) -> dict:
    """bf16 against fp32 on the (partly trained) tcsm model: the validation bound, and per-token
    KL(p_fp32 ‖ p_bf16) of the denoiser at random t, plus the sampler's time per call in each precision."""
    from tcsm.sampling import sample

    dev, model = trainer.device, trainer.model.eval()
    out = {}
    for p in ("fp32", "bf16"):
        out[f"valid_bound_{p}"] = trainer.validate(max_examples=args.eval_examples, precision=p)
    g = torch.Generator(device=dev).manual_seed(0)
    x1 = trainer.data.get_batch("valid", torch.arange(min(64, trainer.data.valid.shape[0])), dev)
    t = torch.rand(x1.shape[0], device=dev, generator=g)
    xt = trainer.path.draw_xt(x1, t, generator=g)
    with torch.no_grad():
        lp32 = torch.log_softmax(model(xt, t), -1)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            lp16 = torch.log_softmax(model(xt, t), -1)
    kl = (lp32.exp() * (lp32 - lp16)).sum(-1)
    out["kl_fp32_bf16_nats_per_token"] = {"mean": float(kl.mean()), "max": float(kl.max())}
    out["max_abs_logprob_diff"] = float((lp32 - lp16).abs().max())
    times = {}
    for r in range(args.rounds):
        for p in (("fp32", "bf16") if r % 2 == 0 else ("bf16", "fp32")):
            sync(dev)
            w0 = time.perf_counter()
            sample(model, trainer.path, batch_size=args.sample_batch, length=args.seq_len, num_steps=args.sample_steps,
                   seed=r, device=dev, precision=p, method="euler")
            sync(dev)
            times.setdefault(p, []).append((time.perf_counter() - w0) / args.sample_steps)
    out["sampler_ms_per_step"] = {p: 1e3 * statistics.median(v) for p, v in times.items()}
    out["sampler"] = {"batch": args.sample_batch, "steps": args.sample_steps, "method": "euler"}
    model.train()
    return out


def report(res):
    m, a = res["meta"], res["meta"]["args"]
    s = res["summary"]
    lines = [(f"{m['gpu']}, torch {m['torch']}; `{a['preset']}` denoiser ({res['params'] / 1e6:.1f}M parameters), "
              f"batch {a['batch']} × length {a['seq_len']} on text8-prefix, {a.get('precision', 'bf16')}; "
              f"{a['rounds']} interleaved rounds of "
              f"~{a['visit_s']} s per configuration. Dense bf16 peak ({a['peak_size']}³ matmul, same rounds): "
              f"{s['dense_peak_tflops']:.0f} TFLOP/s; MLP-shape matmul: {s['mlp_matmul_tflops']:.0f} TFLOP/s."), "",
             ("| configuration | ms/step | tokens/s | MFU (dense peak) | ratio to hand-written (eager) | "
              "ratio to hand-written+compile | host syncs per step | block: MFU, every pair counted |"),
             "|---|---|---|---|---|---|---|---|"]
    for lab, v in s["steps"].items():
        r1, r2 = v.get("ratio_to_hand-written"), v.get("ratio_to_hand-written+compile")
        syncs = res["host_syncs"].get(lab, {})
        if "not checked" in syncs:
            syncs = "not checked (CPU)"
        else:
            syncs = f"{sum(syncs.values()) / res['meta']['sync_steps']:.1f}" if syncs else "none"
        every_pair = v.get("mfu_dense_pairs")
        lines.append(f"| {lab} | {v['wall_ms']:.1f} | {v['tokens_per_s']:,.0f} | {100 * v['mfu']:.1f}% | "
                     f"{'' if r1 is None else f'{r1:.2f}'} | {'' if r2 is None else f'{r2:.2f}'} | "
                     f"{syncs} | {'' if every_pair is None else f'{100 * every_pair:.1f}%'} |")
    block = s.get("block")
    if block:
        lines += ["", (f"Block step (k = {a['block_length']}; FLOPs per step {block['flops_unmasked']:.3g} unmasked, "
                       f"{block['flops_dense']:.3g} every pair, against {res['flops_per_step']:.3g} for the "
                       f"full-sequence step): " + "; ".join(block["lines"]) + ".")]
    n = res.get("numerics", {})
    if n:
        b32, b16 = n["valid_bound_fp32"], n["valid_bound_bf16"]
        lines += ["", f"Flash SDPA usable for the model's attention: {res['flash']}."]
        if "flash_block_sdpa" in res:
            lines.append(f"Flash SDPA usable for the block model's one pass (explicit mask): {res['flash_block_sdpa']}.")
        lines.append(f"Validation bound of the partly trained tcsm model ({a['eval_examples']} sequences): "
                     f"fp32 {b32['bpc']:.4f}, bf16 {b16['bpc']:.4f} bpc.")
        if "kl_fp32_bf16_nats_per_token" in n:
            kl = n["kl_fp32_bf16_nats_per_token"]
            lines.append(f"KL(p_fp32 ‖ p_bf16) per token: mean {kl['mean']:.2e}, max {kl['max']:.2e} nats; "
                         f"max |Δ log p| {n['max_abs_logprob_diff']:.3f}.")
        sm = n["sampler_ms_per_step"]
        lines.append(f"Sampler (Euler, batch {n['sampler']['batch']}, {n['sampler']['steps']} steps): "
                     f"{sm['fp32']:.2f} ms/step fp32, {sm['bf16']:.2f} bf16 ({sm['fp32'] / sm['bf16']:.2f}×).")
    return "\n".join(lines)


def summarise(raw, flops, tokens_step, peak_flops, mlp_flops):
    """Medians over the rounds; `flops`: label → (model FLOPs per step, or for a block step (unmasked, every
    pair))."""
    peak = [peak_flops / x["wall_s"] for x in raw["dense peak"]]
    steps = {}
    for lab, rows in raw.items():
        if "matmul" in lab or lab == "dense peak":
            continue
        wall = [x["wall_s"] for x in rows]
        counted = flops[lab] if isinstance(flops[lab], tuple) else (flops[lab],)
        steps[lab] = {"wall_ms": 1e3 * statistics.median(wall), "cpu_ms": 1e3 * statistics.median(x["cpu_s"] for x in rows),
                      "tokens_per_s": tokens_step / statistics.median(wall),
                      "mfu": statistics.median(counted[0] / w / pk for w, pk in zip(wall, peak))}
        if len(counted) > 1:
            steps[lab]["mfu_dense_pairs"] = statistics.median(counted[1] / w / pk for w, pk in zip(wall, peak))
        for ref in ("hand-written", "hand-written+compile"):
            if ref in raw and lab != ref:
                steps[lab][f"ratio_to_{ref}"] = statistics.median(
                    a["wall_s"] / b["wall_s"] for a, b in zip(rows, raw[ref]))
    out = {"dense_peak_tflops": statistics.median(peak) / 1e12,
           "mlp_matmul_tflops": statistics.median(mlp_flops / x["wall_s"] for x in raw["mlp matmul"]) / 1e12,
           "steps": steps}
    blocks = [lab for lab in steps if "mfu_dense_pairs" in steps[lab]]
    if blocks:
        out["block"] = block_summary(raw, steps, blocks, flops)
    return out


def block_summary(raw, steps, blocks, flops) -> dict:
    """The block rows beside the full-sequence step of the same compilation: MFU each, flex against sdpa (ratio of
    step times, per round)."""
    lines = []
    for lab in blocks:
        full = "tcsm+compile" if lab.endswith("+compile") else "tcsm"
        lines.append(f"{lab} {100 * steps[lab]['mfu']:.1f}% MFU ({steps[lab]['wall_ms']:.1f} ms) against {full}'s "
                     f"{100 * steps[full]['mfu']:.1f}% ({steps[full]['wall_ms']:.1f} ms)")
    for lab in blocks:
        sdpa = lab.replace(" flex", " sdpa")
        if " flex" in lab and sdpa in raw:
            ratio = statistics.median(a["wall_s"] / b["wall_s"] for a, b in zip(raw[lab], raw[sdpa]))
            lines.append(f"{lab} takes {ratio:.2f}× the time of {sdpa}")
    unmasked, dense = flops[blocks[0]]
    return {"lines": lines, "flops_unmasked": unmasked, "flops_dense": dense}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="../shared/data/text8/text8_prefix.txt.gz")
    ap.add_argument("--out", default="benchmarks/results/gpu_step.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="text8")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--visit-s", type=float, default=2.0)
    ap.add_argument("--eval-examples", type=int, default=512)
    ap.add_argument("--sample-batch", type=int, default=16)
    ap.add_argument("--sample-steps", type=int, default=64)
    ap.add_argument("--peak-size", type=int, default=8192)
    ap.add_argument("--block-length", type=int, default=16,
                    help="block length k of the block-model step (0: no block step)")
    ap.add_argument("--precision", default="bf16", help="train.precision of every tcsm step")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--smoke", action="store_true",
                    help="a few seconds on the CPU (tiny preset, L = 32, k = 8, one short round, fp32, no compile): "
                         "checks the script, measures nothing")
    ap.add_argument("--profile", action="store_true", help="also print the profiler's kernel table of each step")
    ap.add_argument("--report", action="store_true", help="print the markdown table of --out and exit")
    args = ap.parse_args(argv)
    if args.smoke:
        args.device, args.preset, args.seq_len, args.batch, args.block_length = "cpu", "tiny", 32, 2, 8
        args.rounds, args.visit_s, args.no_compile, args.peak_size, args.precision = 1, 0.05, True, 256, "fp32"
        args.eval_examples, args.sample_batch, args.sample_steps = 4, 2, 2
    if args.report:
        print(report(json.loads(Path(args.out).read_text())))
        return
    torch.manual_seed(0)
    from tcsm.models import count_parameters, flops_per_token

    device = torch.device(args.device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.machine()})"
    meta = {"command": " ".join([os.path.basename(sys.executable), *sys.argv]), "torch": torch.__version__,
            "gpu": gpu, "args": vars(args), "sync_steps": 3, "loadavg_start": os.getloadavg()}
    print(meta, flush=True)
    compiles = [False] if args.no_compile else [False, True]
    timers, trainers = {}, {}
    for c in compiles:
        suffix = "+compile" if c else ""
        trainers[c] = build_trainer(args, c)
        timers["tcsm" + suffix] = trainers[c].train_step
        timers["hand-written" + suffix] = hand_written(trainers[c], args, c)
    trainer = trainers[False]
    tokens_step = args.batch * args.seq_len
    flops = {lab: flops_per_token(trainer.model.cfg, args.seq_len) * tokens_step for lab in timers}
    block_trainers = {}
    if args.block_length:  # the block model's step, compiled (as the preset trains), sdpa against flex
        from tcsm.models.blocks import block_flops_per_sequence

        for attention in block_attentions(device):
            lab = f"tcsm block k={args.block_length} {attention}" + ("" if args.no_compile else "+compile")
            block_trainers[attention] = build_trainer(args, not args.no_compile, attention)
            timers[lab] = block_trainers[attention].train_step
            cfg = block_trainers[attention].model.cfg
            flops[lab] = tuple(args.batch * block_flops_per_sequence(cfg, args.seq_len, counted)
                               for counted in ("unmasked", "dense"))
    d = trainer.model.cfg.d_model
    timers["dense peak"], peak_flops = matmul(args.peak_size, args.peak_size, args.peak_size, device)
    timers["mlp matmul"], mlp_flops = matmul(args.batch * args.seq_len, d, 4 * d, device)
    n_calls = {}
    for lab, fn in timers.items():  # warm-up: compilation, allocator, optimizer state
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        sync(device)
        n_calls[lab] = calls_for(fn, device, args.visit_s)
        print(f"warm-up {lab}: {time.perf_counter() - t0:.1f} s, {n_calls[lab]} calls per visit", flush=True)
    steps = [lab for lab in timers if "matmul" not in lab and lab != "dense peak"]
    syncs = {lab: sync_points(timers[lab], device) for lab in steps}
    print("host syncs:", json.dumps(syncs, indent=1), flush=True)
    profiles = {lab: profile(timers[lab], device) for lab in steps if args.profile}
    for lab, table in profiles.items():
        print(f"--- profile of {lab}\n{table}", flush=True)
    raw, keys = {k: [] for k in timers}, list(timers)
    for r in range(args.rounds):
        for k in keys[r % len(keys):] + keys[: r % len(keys)]:
            raw[k].append(visit(timers[k], n_calls[k], device))
        print(f"round {r + 1}/{args.rounds}", flush=True)
    res = {"meta": meta, "params": count_parameters(trainer.model), "flops_per_step": flops["tcsm"],
           "flops": flops, "summary": summarise(raw, flops, tokens_step, peak_flops, mlp_flops), "host_syncs": syncs,
           "profiles": profiles, "flash": flash_usable(trainer), "raw": raw}
    if "sdpa" in block_trainers:
        res["flash_block_sdpa"] = flash_usable(block_trainers["sdpa"])
    res["numerics"] = numerics(trainer, args)
    meta["loadavg_end"] = os.getloadavg()
    meta["max_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str))
    print(report(res))
    return res


if __name__ == "__main__":
    main()
