"""Decoding on one GPU: the decode engine (`sample.engine=graph`: static caches, captured CUDA graphs) beside the
eager path, for full-sequence, block (k = 16; ancestral, and the confidence order inside the blocks:
block-confidence), AR and DiffusionGemma decoders at batch 1 and 16, L = 1024, random
weights of the `text8` preset (85M parameters) under bf16 autocast; speed only.

For each configuration and engine, in interleaved rounds (round 0 warms up and captures): tokens/s of wall time
(CUDA-synchronised) and of process CPU time, network calls per sequence, the share of them the engine ran as one
captured step (denoiser call, draws and update of the block), and the GPU-busy share (profiler kernel time ÷ wall
of one profiled decode). DiffusionGemma (tcsm's sampler, `--dg-size`) runs through the engine's fixed-shape cache
beside its own DynamicCache path. Also: a host-sync check (`torch.cuda.set_sync_debug_mode("warn")` over one engine decode, as
benchmarks/gpu_step.py does, and where the first sync happens under mode "error") and a law check (total variation between the unigram frequencies of the two engines'
samples, pooled over rounds). The full-sequence sampler has no engine path: it runs eagerly in both columns. The AR
eager column generates the last `--ar-tokens` tokens after a prefilled prompt (the eager path needs ~60 ms per
token on an H200 and would not fit the run's budget); the engine column does the same and the whole sequence.
`--budget-s` stops starting rounds once it is spent (the table says how many rounds ran).

    python benchmarks/decode_gpu.py --out decode_gpu.json          # one GPU, about 5 minutes
    python benchmarks/decode_gpu.py --device cpu --smoke           # tiny sizes on the CPU (the suite runs this)
    python benchmarks/decode_gpu.py --device cpu --dtype fp32 --decoders dg --dg-size small --length 256 \
        --batches 1,8 --dg-steps 8                                 # DiffusionGemma, engine vs eager, on a CPU
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (a CPU check of the script)")
    ap.add_argument("--preset", default="text8")
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=27)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--full-steps", type=int, default=256, help="full-sequence steps (about the block decoder's calls)")
    ap.add_argument("--block-steps", type=int, default=4, help="steps per block")
    ap.add_argument("--ar-tokens", type=int, default=128, help="AR tokens generated after a prefilled prompt")
    ap.add_argument("--dg-steps", type=int, default=8, help="DiffusionGemma steps per 32-token canvas")
    ap.add_argument("--no-dg", action="store_true", help="leave out DiffusionGemma")
    ap.add_argument("--dg-size", default="mid", choices=sorted(DG_SIZES),
                    help="DiffusionGemma instance: mid = the reference 8 x 1024 MoE 8x2 (284M); small, tiny for CPUs")
    ap.add_argument("--decoders", default="full,block,block-confidence,ar,dg",
                    help="which decoders to run (comma-separated)")
    ap.add_argument("--rounds", type=int, default=2, help="timed rounds after the warm-up round")
    ap.add_argument("--budget-s", type=float, default=270.0)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.smoke:
        a.preset, a.length, a.block, a.batches, a.dg_size = "tiny", 32, 4, "1,2", "tiny"
        a.full_steps, a.block_steps, a.ar_tokens, a.dg_steps, a.rounds = 8, 2, 8, 2, 1
    return a


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def build(a, dev):
    """{name: (model, path)} of the decoders, random weights."""
    import tcsm
    from tcsm.models import build_denoiser
    from tcsm.models.blocks import build_block_denoiser
    from tcsm.models.lm import LM_PRESETS
    from tcsm.models.lm_families import build_lm
    from tcsm.models.transformer import PRESETS

    V, L, k = a.vocab, a.length, a.block
    kw = {"vocab_size": V, "num_states": V + 1, "time_conditioning": False, "max_len": L}
    torch.manual_seed(0)
    path = tcsm.MaskedPath(vocab_size=V, schedule=tcsm.LogLinearSchedule())
    block_path = tcsm.MaskedPath(vocab_size=V, schedule=tcsm.LogLinearSchedule(), block_length=k)
    sizes = {n: v for n, v in PRESETS[a.preset].items() if n in ("d_model", "n_layers", "n_heads")}
    ar_preset = a.preset if a.preset in LM_PRESETS else sizes
    wanted = set(a.decoders.split(","))
    models = {}
    if "full" in wanted:
        models["full"] = (build_denoiser(a.preset, **kw).to(dev).eval(), path)
    if wanted & {"block", "block-confidence"}:  # one block model: ancestral and the confidence order inside blocks
        block = (build_block_denoiser(a.preset, k, **kw).to(dev).eval(), block_path)
        models.update({n: block for n in ("block", "block-confidence") if n in wanted})
    if "ar" in wanted:
        models["ar"] = (build_lm("causal", ar_preset, vocab_size=V, max_len=L).to(dev).eval(), None)
        with torch.no_grad():  # the AR head starts at zero (uniform); give it random conditionals like the others
            models["ar"][0].head.weight.normal_(0, 0.02)
    if not a.no_dg and "dg" in wanted:
        dg = build_dg(a.dg_size, dev)
        if dg is not None:
            models["dg"] = (dg, tcsm.UniformPath(vocab_size=dg.vocab_size, block_length=dg.block_length))
    return models


#: DiffusionGemma instances: (hidden size, layers, heads, canvas length)
DG_SIZES = {"tiny": (64, 2, 2, 8), "small": (256, 4, 4, 32), "mid": (1024, 8, 8, 32)}


def build_dg(size: str, dev):
    """A random DiffusionGemma of `DG_SIZES` (mid: the reference measurement's 8 layers x 1024, MoE 8x2; its
    experts run transformers' default grouped_mm, which reads nothing on the host), or None where transformers
    has no DiffusionGemma."""
    try:
        from transformers import (
            DiffusionGemmaConfig,
            DiffusionGemmaForBlockDiffusion,
            DiffusionGemmaTextConfig,
        )
    except ImportError:
        print("DiffusionGemma left out: this transformers has none (it needs >= 5.24)", flush=True)
        return None
    from tcsm.models.diffusion_gemma import DiffusionGemmaDenoiser

    V = 512
    h, n, heads, canvas = DG_SIZES[size]
    text = DiffusionGemmaTextConfig(
        vocab_size=V, hidden_size=h, intermediate_size=2 * h, num_hidden_layers=n, num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2), head_dim=h // heads, max_position_embeddings=4096,
        sliding_window=256, global_head_dim=h // heads, num_experts=8, top_k_experts=2, moe_intermediate_size=h,
        layer_types=["sliding_attention"] * (n - 1) + ["full_attention"], pad_token_id=0, eos_token_id=1,
        bos_token_id=2,
    )  # fmt: skip
    vision = {"model_type": "gemma4_vision", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                  "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16}  # fmt: skip
    cfg = DiffusionGemmaConfig(text_config=text.to_dict(), vision_config=vision, canvas_length=canvas,
                               boi_token_id=V - 4, eoi_token_id=V - 3, image_token_id=V - 2)  # fmt: skip
    torch.manual_seed(0)
    return DiffusionGemmaDenoiser(DiffusionGemmaForBlockDiffusion(cfg)).to(dev).eval()


def configurations(a, models):
    """(decoder, batch, engine) in visiting order: the two engines of a decoder side by side."""
    out = []
    for B in (int(b) for b in a.batches.split(",")):
        for name in models:
            engines = ("eager",) if name == "full" else ("eager", "graph")
            out += [(name, B, e) for e in engines]
            if name == "ar":
                out.append(("ar-whole", B, "graph"))
    return out


def decode(a, models, conf, dev, seed):
    """(tokens generated [B, n], calls per sequence, the share of them run as one captured step: call, draws and
    update) of one decode."""
    from tcsm.sampling.settings import draw, sample_settings
    from tcsm.targets.ar import sample_ar

    name, B, engine = conf
    if engine == "graph" and dev.type == "cuda":
        engine = "auto"  # graphs on CUDA, and a failed capture falls back to eager calls with a warning
    g = torch.Generator(device=dev).manual_seed(seed)
    L = a.length
    if name in ("ar", "ar-whole"):
        model = models["ar"][0]
        P = 0 if name == "ar-whole" else L - a.ar_tokens
        prefix = torch.randint(0, a.vocab, (B, P), device=dev, generator=g) if P else None
        x = sample_ar(model, B, L, g, dev, prefix=prefix, engine=engine)
        return x[:, P:], L - P, None
    model, path = models[name]
    steps = {"full": a.full_steps, "block": a.block_steps, "block-confidence": a.block_steps, "dg": a.dg_steps}[name]
    method = "confidence" if name == "block-confidence" else "ancestral"
    settings = sample_settings({}, steps=steps, method=method, engine=engine)
    prompt = torch.tensor([2, 5, 6, 7], device=dev) if name == "dg" else None
    x, st = draw(model, path, B, L, settings, generator=g, device=dev, prompt=prompt)
    return x, float(st.num_calls), st.counts.get("captured_steps", 0) / max(st.num_calls, 1)


def busy_share(fn, dev) -> float | None:
    """Profiler kernel time ÷ wall time of one call of fn (None off CUDA)."""
    if dev.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    sync(dev)
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        sync(dev)
    wall = time.perf_counter() - t0
    kernels = sum(e.self_device_time_total for e in prof.key_averages()
                  if e.device_type == torch.autograd.DeviceType.CUDA)  # fmt: skip
    return kernels / 1e6 / wall


def host_syncs(fn, dev) -> int | None:
    """Synchronising calls seen by `torch.cuda.set_sync_debug_mode("warn")` during one call of fn."""
    if dev.type != "cuda":
        return None
    seen = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
        seen = sum("synchroniz" in str(w.message).lower() for w in caught)
    return seen


def first_sync(fn, dev) -> str | None:
    """Where one call of fn first synchronises with the host under `torch.cuda.set_sync_debug_mode("error")` (the
    innermost tcsm frame of the error), "none" when it never does; None off CUDA."""
    if dev.type != "cuda":
        return None
    import traceback

    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except RuntimeError as e:
        frames = [f for f in traceback.extract_tb(e.__traceback__) if "tcsm" in f.filename]
        where = f"{frames[-1].filename.split('src/')[-1]}:{frames[-1].lineno} {frames[-1].line}" if frames else "?"
        return f"{where} ({str(e).splitlines()[0][:80]})"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return "none"


def tv_unigram(xs, ys, V) -> float:
    p = torch.bincount(torch.cat([x.flatten() for x in xs]).cpu(), minlength=V).double()
    q = torch.bincount(torch.cat([y.flatten() for y in ys]).cpu(), minlength=V).double()
    return float(0.5 * (p / p.sum() - q / q.sum()).abs().sum())


def main(argv=None):
    a = parse_args(argv)
    dev = torch.device(a.device)
    if dev.type == "cpu":
        torch.set_num_threads(1)
    models = build(a, dev)
    confs = configurations(a, models)
    cast = torch.autocast(dev.type, torch.bfloat16) if a.dtype == "bf16" else torch.autocast(dev.type, enabled=False)
    speeds, cpu_speeds = {c: [] for c in confs}, {c: [] for c in confs}
    calls, captured, samples = {}, {}, {c: [] for c in confs}
    start, rounds_run = time.perf_counter(), 0
    for r in range(a.rounds + 1):
        if r > 1 and time.perf_counter() - start > a.budget_s:
            print(f"budget of {a.budget_s:.0f} s spent: stopping after {rounds_run} timed rounds", flush=True)
            break
        for c in confs:
            sync(dev)
            t0, c0 = time.perf_counter(), time.process_time()
            with torch.no_grad(), cast:
                x, n_calls, share = decode(a, models, c, dev, seed=r)
            sync(dev)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            calls[c], captured[c] = n_calls, share
            if r:
                speeds[c].append(x.numel() / wall)
                cpu_speeds[c].append(x.numel() / cpu)
                samples[c].append(x)
            print(f"round {r} {c[0]:8s} B={c[1]:2d} {c[2]:5s}: {x.numel() / wall:10.1f} tok/s ({wall:.3f} s), "
                  f"{x.numel() / cpu:10.1f} tok/CPU-s, calls/seq {n_calls:.0f}, load {os.getloadavg()[0]:.1f}",
                  flush=True)  # fmt: skip
        rounds_run = r
    rows = []
    for c in confs:
        def once(c=c):
            with torch.no_grad(), cast:
                decode(a, models, c, dev, seed=99)

        busy = busy_share(once, dev)
        syncs = host_syncs(once, dev) if c[2] == "graph" else None
        first = first_sync(once, dev) if c[2] == "graph" else None
        eager = (c[0], c[1], "eager")  # ar-whole has no eager twin (its eager run would not fit the budget)
        V = a.vocab if c[0] != "dg" else models["dg"][0].vocab_size
        tv = tv_unigram(samples[c], samples[eager], V) if c[2] == "graph" and samples.get(eager) else None
        rows.append({"decoder": c[0], "batch": c[1], "engine": c[2], "calls_per_seq": calls[c],
                     "tokens_per_s": statistics.median(speeds[c]) if speeds[c] else None, "gpu_busy": busy,
                     "tokens_per_cpu_s": statistics.median(cpu_speeds[c]) if cpu_speeds[c] else None,
                     "captured_steps": captured[c],
                     "host_syncs": syncs, "first_sync": first, "tv_unigram_vs_eager": tv})  # fmt: skip
    meta = {"device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "torch": torch.__version__,
            "preset": a.preset, "length": a.length, "block": a.block, "dtype": a.dtype, "rounds": rounds_run,
            "dg_size": a.dg_size, "threads": torch.get_num_threads(),
            "wall_s": round(time.perf_counter() - start, 1)}  # fmt: skip
    print(json.dumps(meta))
    print("| decoder | batch | engine | calls/seq | captured steps | tokens/s | tokens/CPU-s | GPU busy | host syncs "
          "| TV unigram vs eager |")
    print("|---|---|---|---|---|---|---|---|---|---|")

    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    for w in rows:
        print(f"| {w['decoder']} | {w['batch']} | {w['engine']} | {w['calls_per_seq']:.0f} | "
              f"{fmt(w['captured_steps'], '.0%')} | {fmt(w['tokens_per_s'], ',.0f')} | "
              f"{fmt(w['tokens_per_cpu_s'], ',.0f')} | {fmt(w['gpu_busy'], '.1%')} | {fmt(w['host_syncs'], 'd')} | "
              f"{fmt(w['tv_unigram_vs_eager'], '.3f')} |")  # fmt: skip
    for w in rows:
        if w["first_sync"] is not None:
            print(f"first host sync, {w['decoder']} B={w['batch']} (sync debug mode error): {w['first_sync']}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
