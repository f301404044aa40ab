"""Density-ratio post-training on text8-prefix at a small CPU scale (MATH.md §5.1, §6.3): a masked reference, the
strategy-(ii) energy model with BCE (≈ EDLM's NCE) on top of it, and a character AR model trained here as judge.

Reported: the energy model's BPC *estimate* (IS, log Ẑ from several sample counts; not a bound) beside the
reference's valid masked bound on the same sequences and (t, x_t) draws; gen-PPL under the AR judge and sample
entropy of the reference's plain sampler and of SIR (k candidates at every step, and EDLM's window) against the
number of sampling steps, with the same numbers for real test sequences. Every phase is saved to `--out` when it
ends and skipped on a re-run; the runs resume from their checkpoints.

    nohup nice -n 5 .venv/bin/python benchmarks/dre_text8.py --work-dir runs/bench/dre-text8 \\
        --out benchmarks/results/dre_text8.json > runs/bench/dre_text8.log 2>&1 &
    .venv/bin/python benchmarks/dre_text8.py --tiny --work-dir /tmp/dre8 --out /tmp/dre8.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from tcsm.builders.config import load_config
from tcsm.builders.loading import load_checkpoint, load_scorer_lm
from tcsm.evaluation import generative_perplexity, sample_entropy
from tcsm.posttrain.dre.likelihood import evaluate_energy_estimate
from tcsm.posttrain.dre.sir import sample_sir
from tcsm.recipes.dre.compose import dre_config
from tcsm.sampling import may_cache, sample
from tcsm.train.fit import fit

TEXT8 = "../shared/data/text8/text8_prefix.txt.gz"
QUIET = {"progress": False, "tensorboard": False, "threads": 1, "device": "cpu", "log_every": 50}


def _train(cfg, run_dir: Path) -> float:
    """Train (or resume) `cfg` into `run_dir`; wall seconds spent (0 when already done)."""
    if (run_dir / "summary.json").is_file():
        return 0.0
    t0 = time.perf_counter()
    fit(cfg, run_dir, resume=True if (run_dir / "checkpoints").is_dir() else None, log=lambda s: print(s, flush=True))
    return time.perf_counter() - t0


def reference_config(args):
    """A small time-independent masked denoiser (the MDLM cache applies) on text8-prefix."""
    return load_config(base={
        "description": "dre_text8: masked reference on text8-prefix",
        "data": {"kind": "text8", "split": "prefix", "path": TEXT8, "seq_len": args.length},
        "model": {"preset": "tiny", "d_model": args.width, "n_layers": args.layers, "n_heads": 4, "cond_dim": 32,
                  "max_len": args.length, "time_conditioning": False},
        "path": {"source": "masked", "schedule": "linear"},
        "objective": {"loss": "distrib"},
        "optim": {"lr": 2e-3, "warmup": 200, "decay": "cosine", "min_lr_ratio": 0.1},
        "train": {"steps": args.ref_steps, "batch_size": 32, "ema": 0.999, "eval_every": 0, "eval_examples": 64,
                  "sample_every": 0, "save_every": 250, **QUIET},
        "eval": {"num_t": 4, "batch_size": 32},
        "sample": {"num": 0},
    })


def judge_config(args):
    """A character AR model on the same data: the judge of the samples (gen-PPL)."""
    return load_config(base={
        "description": "dre_text8: causal judge on text8-prefix",
        "data": {"kind": "text8", "split": "prefix", "path": TEXT8, "seq_len": args.length},
        "model": {"name": "causal", "preset": "small", "max_len": args.length},
        "objective": {"name": "clean_lm"},
        "optim": {"lr": 2e-3, "warmup": 200, "decay": "cosine", "min_lr_ratio": 0.1},
        "train": {"steps": args.judge_steps, "batch_size": 32, "ema": 0.999, "eval_every": 0, "eval_examples": 64,
                  "sample_every": 0, "save_every": 250, "seed": 1, **QUIET},
        "eval": {"batch_size": 32},
        "sample": {"num": 0},
    })


def energy_config(ref_dir: Path, args):
    overrides = [f"train.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in QUIET.items()]
    overrides += [f"train.steps={args.dre_steps}", "train.batch_size=32", f"optim.lr={args.dre_lr}",
                  f"objective.num_negatives={args.negatives}", "train.eval_examples=16", "train.save_every=100"]
    return dre_config(ref_dir, "finetune-dre", overrides, {"objective.strategy": "ii", "objective.bregman": "bce"})


def judged(judge, x) -> dict:
    """gen-PPL of samples x under the judge with its standard error (delta method over the per-sample mean NLLs,
    all samples having the same length), and their mean unigram entropy (nats)."""
    res = generative_perplexity(judge, token_ids=x)
    nll = torch.tensor(res.per_sequence_nll, dtype=torch.float64)
    se = float(nll.std() / len(nll) ** 0.5) if len(nll) > 1 else float("nan")
    return {"gen_ppl": res.gen_ppl, "gen_ppl_stderr": res.gen_ppl * se, "entropy": sample_entropy(x)["entropy_mean"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work-dir", default="runs/bench/dre-text8")
    ap.add_argument("--out", default="benchmarks/results/dre_text8.json")
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--ref-steps", type=int, default=1500)
    ap.add_argument("--judge-steps", type=int, default=800)
    ap.add_argument("--dre-steps", type=int, default=400)
    ap.add_argument("--dre-lr", type=float, default=1e-3)
    ap.add_argument("--negatives", type=int, default=2)
    ap.add_argument("--steps", default="4,16,64", help="sampling steps K")
    ap.add_argument("--sir-k", default="4", help="SIR candidates k (comma-separated)")
    ap.add_argument("--num-samples", type=int, default=64)
    ap.add_argument("--eval-seqs", type=int, default=32)
    ap.add_argument("--log-z-samples", default="1,4,16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tiny", action="store_true", help="seconds-long smoke setting (numbers mean nothing)")
    args = ap.parse_args()
    if args.tiny:
        args.length, args.width, args.ref_steps, args.judge_steps, args.dre_steps = 16, 32, 4, 4, 3
        args.steps, args.num_samples, args.eval_seqs, args.log_z_samples = "4", 4, 2, "1,2"
    torch.set_num_threads(args.threads)
    work, out_path = Path(args.work_dir), Path(args.out)
    results = json.loads(out_path.read_text()) if out_path.is_file() else {}
    results.setdefault("meta", {}).update(command="python benchmarks/dre_text8.py " + " ".join(sys.argv[1:]),
                                          platform=platform.platform(), torch=torch.__version__)

    def save(key, value):
        results[key] = value
        results["meta"]["loadavg_" + key] = os.getloadavg()
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(results, indent=1) + "\n")

    ref_dir, judge_dir, dre_dir = work / "reference", work / "judge", work / "energy-bce"
    if "train" not in results:
        times = {"reference_s": _train(reference_config(args), ref_dir),
                 "judge_s": _train(judge_config(args), judge_dir)}
        times["energy_s"] = _train(energy_config(ref_dir, args), dre_dir)
        summaries = {n: json.loads((d / "summary.json").read_text())
                     for n, d in (("reference", ref_dir), ("judge", judge_dir), ("energy", dre_dir))}
        save("train", {"wall_s": times, "summaries": summaries})
    ref, energy = load_checkpoint(ref_dir), load_checkpoint(dre_dir)
    path, data = ref.build_path(), ref.build_data()
    L = int(ref.data_info["seq_len"])
    if "likelihood" not in results:
        x = data.split("valid")[: args.eval_seqs]
        g = torch.Generator().manual_seed(1234)
        t0, c0 = time.perf_counter(), time.process_time()
        res = evaluate_energy_estimate(energy.model.reference, energy.model, x, path, batch_size=8, num_t=4,
                                       num_samples=[int(n) for n in args.log_z_samples.split(",")], generator=g)
        res = {k: v for k, v in res.items() if isinstance(v, (int, float, str))}
        save("likelihood", {**res, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0})
        print(json.dumps(results["likelihood"], indent=1), flush=True)
    if "genppl" not in results:
        judge = load_scorer_lm(str(judge_dir), torch.device("cpu"))
        real = data.test[: args.num_samples].long()
        rows = [{"model": "data", **judged(judge, real)}]
        ks = [int(k) for k in args.sir_k.split(",")]
        cases = [("reference", None, None)] + [("energy", k, (0.0, 1.0)) for k in ks] + [("energy", ks[-1], (0.4, 0.6))]
        for K in (int(k) for k in args.steps.split(",")):
            for name, k, window in cases:
                g = torch.Generator().manual_seed(K)
                t0, c0 = time.perf_counter(), time.process_time()
                with torch.no_grad():
                    if k is None:
                        x = sample(ref.model, path, batch_size=args.num_samples, length=L, num_steps=K, generator=g,
                                   time_independent=may_cache(ref.model, path))
                    else:
                        x = sample_sir(energy.model.reference, energy.model, path, batch_size=args.num_samples,
                                       length=L, num_steps=K, num_candidates=k, window=window, generator=g)
                wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                rows.append({"model": name, "K": K, "k": k, "window": window, "sample_wall_s": wall,
                             "sample_cpu_s": cpu, **judged(judge, x), "example": data.decode(x[0])})
                print(json.dumps(rows[-1]), flush=True)
        save("genppl", rows)


if __name__ == "__main__":
    main()
