"""Peak memory per process and step time of DDP, FSDP and FSDP + activation checkpointing on 2 CPU processes (gloo),
at two model sizes, and FSDP's losses against DDP's on the same seeds.

    python scripts/bench_fsdp.py --rounds 2 --steps 4 --out runs/bench_fsdp.jsonl

Each (configuration, size) runs as its own `torchrun --standalone --nproc_per_node 2` job, so a process's peak
resident memory (ru_maxrss) is that configuration's; configurations are interleaved in rounds so that a change in
the machine's load hits all of them alike. Every job records its wall time, CPU time (time.process_time) and the
1-minute load average. Memory is reported as the peak RSS minus the RSS before the model was built (the Python,
torch and data baseline). CPU offload is an accelerator feature (train.cpu_offload refuses a CPU device): not run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SIZES = {  # name -> model overrides (synthetic data, V = 8, length 128)
    "d256x4": ["model.d_model=256", "model.n_layers=4", "model.n_heads=4", "model.cond_dim=128"],
    "d512x8": ["model.d_model=512", "model.n_layers=8", "model.n_heads=8", "model.cond_dim=128"],
}
CONFIGS = {
    "ddp": ["train.strategy=ddp"],
    "fsdp": ["train.strategy=fsdp"],
    "fsdp+ac": ["train.strategy=fsdp", "train.activation_checkpointing=true"],
    # bf16: autocast under DDP; under FSDP bf16 gathered weights with fp32 gradient reduction (MixedPrecisionPolicy)
    "ddp-bf16": ["train.strategy=ddp", "train.precision=bf16"],
    "fsdp-bf16": ["train.strategy=fsdp", "train.precision=bf16"],
}
DEFAULT_CONFIGS = ["ddp", "fsdp", "fsdp+ac"]
COMMON = [
    "data.seq_len=128",
    "model.max_len=128",
    "data.num_train=512",
    "data.num_valid=16",
    "data.num_test=16",
    "train.batch_size=16",
    "train.micro_batch=4",  # 2 micro-batches per rank: gradient accumulation is part of the step
    "train.precision=fp32",  # a configuration's own train.precision comes later and wins
    "train.device=cpu",
    "train.threads=1",
    "train.progress=false",
    "train.tensorboard=false",
    "train.eval_every=0",
    "sample.num=0",
    "train.ema=0",
]


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def worker(args) -> None:
    import torch.distributed as dist

    from tcsm.builders.config import load_config
    from tcsm.models import count_parameters
    from tcsm.train.distributed import all_reduce_mean, barrier, setup_distributed
    from tcsm.train.trainer import Trainer

    base_rss = _rss_mb()
    env = setup_distributed("cpu")
    overrides = COMMON + SIZES[args.size] + CONFIGS[args.config] + [f"train.steps={args.steps + 1}"]
    trainer = Trainer.from_config(load_config("synthetic", overrides), None, env=env, log=lambda s: None)
    trainer.train_step()  # warm-up (first-call allocations, FSDP's lazy init)
    barrier(env)
    wall, cpu = time.perf_counter(), time.process_time()
    losses = []
    for _ in range(args.steps):
        m = trainer.train_step()
        losses.append(all_reduce_mean({"loss": float(m["loss"])}, env)["loss"])
    barrier(env)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    mine = {
        "rank": env.rank,
        "base_rss_mb": base_rss,
        "peak_rss_mb": peak,
        "step_s": wall / args.steps,
        "cpu_s_per_step": cpu / args.steps,
    }
    rows = [None] * env.world_size
    dist.all_gather_object(rows, mine)
    if env.is_main:
        out = {
            "config": args.config,
            "size": args.size,
            "params_m": count_parameters(trainer.model) / 1e6,
            "round": args.round,
            "load1": os.getloadavg()[0],
            "losses": losses,
            "ranks": rows,
        }
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(out) + "\n")


def drive(args) -> None:
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    for r in range(args.rounds):
        for size in args.sizes:
            for config in args.configs:
                cmd = [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    "--nproc_per_node=2",
                    __file__,
                    "--worker",
                    "--config",
                    config,
                    "--size",
                    size,
                    "--steps",
                    str(args.steps),
                    "--round",
                    str(r),
                    "--out",
                    args.out,
                ]
                done = subprocess.run(cmd, check=False, env=env, cwd=ROOT, capture_output=True, text=True)
                if done.returncode:
                    sys.exit(f"{config} {size} failed:\n{done.stderr[-3000:]}")
                print(f"round {r} {size} {config} done (load {os.getloadavg()[0]:.1f})", flush=True)
    summarize(args.out)


def summarize(path: str) -> None:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    print(
        "| size | params | strategy | peak RSS − base, MB/process | step s (median) | CPU s/step/process | "
        "max loss diff vs DDP | load (1 min) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for size in dict.fromkeys(r["size"] for r in rows):
        for config in dict.fromkeys(r["config"] for r in rows):
            base = "ddp-bf16" if config.endswith("-bf16") else "ddp"  # losses compared at the same precision
            ddp = [r for r in rows if r["size"] == size and r["config"] == base]
            rs = [r for r in rows if r["size"] == size and r["config"] == config]
            if not rs:
                continue
            mem = max(x["peak_rss_mb"] - x["base_rss_mb"] for r in rs for x in r["ranks"])
            step = statistics.median(max(x["step_s"] for x in r["ranks"]) for r in rs)
            cpu = statistics.median(statistics.mean(x["cpu_s_per_step"] for x in r["ranks"]) for r in rs)
            diff = max(
                (
                    abs(a - b)
                    for r in rs
                    for d in ddp
                    if d["round"] == r["round"]
                    for a, b in zip(r["losses"], d["losses"])
                ),
                default=float("nan"),
            )
            load = statistics.mean(r["load1"] for r in rs)
            print(
                f"| {size} | {rs[0]['params_m']:.2f}M | {config} | {mem:.0f} | {step:.3f} | {cpu:.3f} | "
                f"{diff:.2e} | {load:.1f} |"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", default="ddp", choices=list(CONFIGS))
    p.add_argument("--size", default="d256x4", choices=list(SIZES))
    p.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, choices=list(CONFIGS))
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    p.add_argument("--steps", type=int, default=4, help="timed steps per job (after one warm-up step)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", default="runs/bench_fsdp.jsonl")
    p.add_argument("--summarize", action="store_true", help="only print the table of an existing --out file")
    args = p.parse_args()
    if args.worker:
        worker(args)
    elif args.summarize:
        summarize(args.out)
    else:
        drive(args)


if __name__ == "__main__":
    main()
