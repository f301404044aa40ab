"""Generative perplexity and sample entropy against the number of sampling steps (docs/evaluation.md).

Needs a diffusion checkpoint and a causal scorer LM trained on the same data. Either pass them
(`--checkpoint`, `--reference`), or let the script train small ones on text8-prefix with the project's
Trainer (`--train-steps`, `--ref-train-steps`; a few CPU minutes each, into `--work-dir`). For each K in
`--steps` it draws `--num-samples` sequences with one seed, then scores them with the reference (gen-PPL) and
computes their unigram entropy. The same two numbers for real test sequences of the same length are the
dashed "data" lines: a good sampler approaches them from above (gen-PPL) and from below (entropy).

    nice -n 10 .venv/bin/python benchmarks/genppl_vs_steps.py --work-dir runs/genppl-bench \
        --steps 4,8,16,32,64,128,256,1024 --num-samples 64 \
        --out benchmarks/results/genppl_vs_steps.json --plot docs/img/genppl_vs_steps.png
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

TEXT8 = "../shared/data/text8/text8_prefix.txt.gz"


def _data(seq_len: int) -> dict:
    return {"kind": "text8", "split": "prefix", "path": TEXT8, "seq_len": seq_len}


def _train(base: dict, run_dir: Path, log) -> Path:
    from tcsm.builders.config import load_config
    from tcsm.train.trainer import Trainer

    if (run_dir / "checkpoints").is_dir():
        log(f"reusing {run_dir}")
        return run_dir
    t0 = time.perf_counter()
    Trainer.from_config(load_config(base=base), run_dir, log=log).fit()
    log(f"trained {run_dir} in {time.perf_counter() - t0:.0f}s")
    return run_dir


def diffusion_config(args) -> dict:
    """A small time-independent masked denoiser (MDLM-style: the cache applies) on text8-prefix."""
    return {
        "description": "genppl_vs_steps benchmark: small masked denoiser on text8-prefix",
        "data": _data(args.length),
        "model": {"preset": "tiny", "d_model": 128, "n_layers": 2, "n_heads": 4, "cond_dim": 32,
                  "max_len": args.length, "time_conditioning": False},
        "path": {"source": "masked", "schedule": "linear"},
        "objective": {"loss": "distrib"},
        "optim": {"lr": 2e-3, "warmup": 200, "decay": "cosine", "min_lr_ratio": 0.1},
        "train": {"steps": args.train_steps, "batch_size": 32, "ema": 0.999, "log_every": 100,
                  "eval_every": 0, "eval_examples": 128, "sample_every": 0, "save_every": 0,
                  "progress": False, "tensorboard": False, "seed": args.seed},
        "eval": {"num_t": 4, "batch_size": 32},
        "sample": {"num": 2, "steps": 128},
    }


def reference_config(args) -> dict:
    """A small causal transformer on the same data: the judge of the samples."""
    return {
        "description": "genppl_vs_steps benchmark: causal scorer LM on text8-prefix",
        "data": _data(args.length),
        "model": {"name": "causal", "preset": "small", "max_len": args.length},
        "objective": {"name": "clean_lm"},
        "optim": {"lr": 2e-3, "warmup": 200, "decay": "cosine", "min_lr_ratio": 0.1},
        "train": {"steps": args.ref_train_steps, "batch_size": 32, "ema": 0.999, "log_every": 100,
                  "eval_every": 0, "eval_examples": 128, "sample_every": 0, "save_every": 0,
                  "progress": False, "tensorboard": False, "seed": args.seed + 1},
        "eval": {"batch_size": 32},
        "sample": {"num": 0},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="diffusion run/checkpoint (default: train one in --work-dir)")
    ap.add_argument("--reference", help="causal reference run or HF directory (default: train one)")
    ap.add_argument("--work-dir", default="runs/genppl-bench")
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--train-steps", type=int, default=3000)
    ap.add_argument("--ref-train-steps", type=int, default=2000)
    ap.add_argument("--steps", default="4,8,16,32,64,128,256,1024")
    ap.add_argument("--num-samples", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    def log(msg: str) -> None:
        print(msg, flush=True)

    from tcsm.builders.loading import load_checkpoint, load_scorer_lm
    from tcsm.evaluation import generative_perplexity, sample_entropy
    from tcsm.evaluation.report import plot_genppl_vs_steps, write_report
    from tcsm.sampling import may_cache, sample

    work = Path(args.work_dir)
    t_train = {}
    if args.checkpoint is None:
        t0 = time.perf_counter()
        args.checkpoint = str(_train(diffusion_config(args), work / "diffusion", log))
        t_train["diffusion_s"] = time.perf_counter() - t0
    if args.reference is None:
        t0 = time.perf_counter()
        args.reference = str(_train(reference_config(args), work / "reference", log))
        t_train["reference_s"] = time.perf_counter() - t0

    device = torch.device("cpu")
    ckpt = load_checkpoint(args.checkpoint, device=device)
    path, data = ckpt.build_path(), ckpt.build_data()
    ref = load_scorer_lm(args.reference, device)
    L = int(ckpt.data_info["seq_len"])
    time_independent = may_cache(ckpt.model, path)

    # The data's own values: real test sequences of the same length under the same reference.
    real = data.test[: args.num_samples].long()
    data_ppl = generative_perplexity(ref, token_ids=real, batch_size=args.batch_size).gen_ppl
    data_ent = sample_entropy(real)["entropy_mean"]
    log(f"data (test, {real.shape[0]} x {L}): gen-PPL {data_ppl:.3f}, entropy {data_ent:.3f} nats")

    rows = []
    for K in (int(k) for k in args.steps.split(",")):
        g = torch.Generator().manual_seed(args.seed)
        t0, outs, calls = time.perf_counter(), [], 0
        for s in range(0, args.num_samples, args.batch_size):
            x, st = sample(ckpt.model, path, batch_size=min(args.batch_size, args.num_samples - s), length=L,
                           num_steps=K, generator=g, time_independent=time_independent, device=device,
                           return_stats=True)
            outs.append(x)
            calls += st.num_calls
        seconds = time.perf_counter() - t0
        x = torch.cat(outs)
        res = generative_perplexity(ref, token_ids=x, batch_size=args.batch_size)
        ent = sample_entropy(x)["entropy_mean"]
        row = {"steps": K, "method": st.method, "gen_ppl": res.gen_ppl, "nll_nats_per_token": res.nll_nats_per_token,
               "entropy_mean": ent, "num_samples": int(x.shape[0]), "network_calls": calls, "sample_seconds": seconds,
               "data_gen_ppl": data_ppl, "data_entropy": data_ent, "example": data.decode(x[0])[:120]}
        rows.append(row)
        log(f"K={K:5d}: gen-PPL {res.gen_ppl:7.3f}  entropy {ent:.3f}  ({calls} calls, {seconds:.1f}s)  "
            f"| {row['example'][:60]}")

    result = {
        "checkpoint": str(ckpt.directory), "step": ckpt.step, "weights": ckpt.weights, "data": data.label,
        "reference": ref.name, "length": L, "seed": args.seed, "train_seconds": t_train,
        "data_gen_ppl": data_ppl, "data_entropy": data_ent, "genppl": rows,
    }
    if args.out:
        write_report(args.out, result)
    if args.plot:
        plot_genppl_vs_steps(rows, args.plot, title=f"{data.label}, L={L}: masked ancestral sampler (cached)")
    print(json.dumps({k: v for k, v in result.items() if k != "genppl"}, indent=1))


if __name__ == "__main__":
    main()
