"""Density-ratio post-training on the synthetic Markov source (MATH.md §5.1, §6.3): does the ratio correct the
factorisation error that a factorized denoiser makes when it samples with few steps?

The source's transition matrix is known, so sample quality is exact: the mean true NLL per token of the samples
(bits), their unigram entropy and the KL of their adjacent-pair (bigram) statistics to the chain's stationary
pair law π(a)P(a, b). Steps, all with the project's Trainer and one pinned thread:

1. pre-train a masked reference on the `synthetic` preset (`--pretrain-steps`);
2. fine-tune it with `tcsm finetune dre`'s config (`tcsm.recipes.dre.compose.dre_config`): strategy (ii) energy models
   with BCE (≈ EDLM's NCE), LSIF and generalized KL, and strategy (i) with BCE;
3. sample every model at K steps ∈ `--steps` — the energy models by SIR with k ∈ `--sir-k` candidates at every
   step (window [0, 1]; k = 1 is the reference's own sampler in distribution) and with EDLM's window [0.4, 0.6] —
   and score the samples, beside the same metrics of true samples from the chain (the finite-sample floor);
4. likelihood: the reference's valid masked bound, each energy model's IS *estimate* for several numbers of
   log-Z samples (labelled: not a bound), and the strategy-(i) student's valid bound, on the same sequences;
5. cost, measured side by side in interleaved rounds: a training step of each strategy against a plain
   pre-training step, and SIR sampling against the plain sampler.

Every phase writes its results into `--out` as soon as it finishes and is skipped when re-run with the same
`--out` (runs resume from their checkpoints), so an interrupted benchmark continues where it stopped.

    nohup nice -n 5 .venv/bin/python benchmarks/dre_quality.py --work-dir runs/bench/dre \\
        --out benchmarks/results/dre_quality.json > runs/bench/dre_quality.log 2>&1 &
    .venv/bin/python benchmarks/dre_quality.py --tiny --work-dir /tmp/dre-tiny --out /tmp/dre-tiny.json
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

import numpy as np
import torch

from tcsm.builders.config import load_config, set_values
from tcsm.builders.loading import load_checkpoint
from tcsm.core.errors import TrainingError
from tcsm.evaluation.likelihood import evaluate_bound
from tcsm.posttrain.dre.energy import EnergyModel
from tcsm.posttrain.dre.likelihood import evaluate_energy_estimate
from tcsm.posttrain.dre.sir import sample_sir
from tcsm.recipes.dre.compose import dre_config
from tcsm.sampling import may_cache, sample
from tcsm.train.fit import fit
from tcsm.train.trainer import Trainer

LN2 = math.log(2)
QUIET = ["train.progress=false", "train.tensorboard=false", "train.threads=1", "train.device=cpu", "sample.num=0"]
#: variant → (strategy, loss); `--variants` may add NAME@LR for a variant with its own learning rate
VARIANTS = {"ii-bce": ("ii", "bce"), "ii-lsif": ("ii", "lsif"), "ii-gkl": ("ii", "gkl"), "i-bce": ("i", "bce")}


# --------------------------------------------------------------------------------------------------- metrics


def sample_metrics(x: torch.Tensor, source) -> dict:
    """Exact quality of samples x [N, L] under the Markov chain: true NLL (bits/token), unigram entropy (bits) and
    KL(empirical adjacent pairs ‖ π(a)P(a, b)) (bits)."""
    V = source.vocab_size
    x = x.long().cpu()
    nll = -source.log_prob(x).double() / (x.shape[1] * LN2)
    uni = torch.bincount(x.flatten(), minlength=V).double()
    uni = uni / uni.sum()
    pairs = torch.bincount((x[:, :-1] * V + x[:, 1:]).flatten(), minlength=V * V).double()
    pairs = pairs / pairs.sum()
    truth = torch.from_numpy(source.pi[:, None] * source.P).flatten()
    nz = pairs > 0
    return {
        "nll_bits": float(nll.mean()),
        "nll_bits_stderr": float(nll.std() / math.sqrt(x.shape[0])),
        "unigram_entropy_bits": float(-(uni[uni > 0] * uni[uni > 0].log()).sum() / LN2),
        "bigram_kl_bits": float((pairs[nz] * (pairs[nz] / truth[nz]).log()).sum() / LN2),
    }


# --------------------------------------------------------------------------------------------------- phases


def train_run(cfg, run_dir: Path) -> None:
    """Train `cfg` into `run_dir`, resuming from its checkpoints; nothing to do once summary.json exists."""
    if (run_dir / "summary.json").is_file():
        return
    resume = (run_dir / "checkpoints").is_dir()
    fit(cfg, run_dir, resume=True if resume else None, log=lambda s: print(s, flush=True))


def variant_config(ref_dir: Path, name: str, args):
    """`tcsm finetune dre` config of a variant: a VARIANTS name, optionally with its own lr as NAME@LR."""
    base, _, lr = name.partition("@")
    strategy, loss = VARIANTS[base]
    overrides = [
        *QUIET,
        f"train.steps={args.dre_steps}",
        f"train.batch_size={args.batch}",
        f"optim.lr={lr or args.dre_lr}",
        f"objective.num_negatives={args.negatives}",
        "train.eval_examples=32",
        "train.save_every=100",
    ]
    return dre_config(ref_dir, "finetune-dre", overrides, {"objective.strategy": strategy, "objective.bregman": loss})


def quality(models: dict, path, source, args, seed: int) -> list[dict]:
    """Samples of every model at every K (and k for energy models), scored exactly."""
    rows = []
    L, N = source.seq_len, args.num_samples

    def add(model_name, K, k, window, x, wall, cpu):
        rows.append({"model": model_name, "K": K, "k": k, "window": window, "wall_s": wall, "cpu_s": cpu,
                     **sample_metrics(x, source)})
        print(json.dumps(rows[-1]), flush=True)

    g = torch.Generator().manual_seed(seed)
    t0, c0 = time.perf_counter(), time.process_time()
    add("data", None, None, None, torch.from_numpy(source.sample(N, seed)), 0.0, 0.0)
    for K in args.steps:
        for name, ck in models.items():
            model = ck.model
            with torch.no_grad():
                if isinstance(model, EnergyModel):  # an energy model: SIR over its frozen reference
                    windows = [((0.0, 1.0), k) for k in args.sir_k] + [((0.4, 0.6), max(args.sir_k))]
                    for window, k in windows:
                        g.manual_seed(seed + K)
                        t0, c0 = time.perf_counter(), time.process_time()
                        x = sample_sir(model.reference, model, path, batch_size=N, length=L, num_steps=K,
                                       num_candidates=k, window=window, generator=g)
                        add(name, K, k, list(window), x, time.perf_counter() - t0, time.process_time() - c0)
                else:
                    g.manual_seed(seed + K)
                    t0, c0 = time.perf_counter(), time.process_time()
                    x = sample(model, path, batch_size=N, length=L, num_steps=K, generator=g,
                               time_independent=may_cache(model, path))
                    add(name, K, None, None, x, time.perf_counter() - t0, time.process_time() - c0)
    return rows


def likelihood(models: dict, data, path, args) -> dict:
    """Valid bounds of the reference and of the strategy-(i) student; IS estimates of the energy models — all on
    the same sequences with the same (t, x_t) draws (seeded alike)."""
    x = data.split("valid")[: args.eval_seqs]
    out = {}
    for name, ck in models.items():
        g = torch.Generator().manual_seed(1234)
        t0, c0 = time.perf_counter(), time.process_time()
        if isinstance(ck.model, EnergyModel):
            res = evaluate_energy_estimate(ck.model.reference, ck.model, x, path, batch_size=16, num_t=args.eval_num_t,
                                           num_samples=args.log_z_samples, generator=g)
        else:
            res = evaluate_bound(ck.model, x, path, batch_size=64, num_t=args.eval_num_t, generator=g)
        res = {k: v for k, v in res.items() if isinstance(v, (int, float, str))}
        res.update(wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0)
        out[name] = res
        print(name, json.dumps(res), flush=True)
    return out


def _timed(fn) -> tuple[float, float]:
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def train_cost(cfgs: dict, args) -> dict:
    """Seconds per training step of each config, measured in interleaved rounds (order rotated per round), and
    each one's per-round ratio to the first config (plain pre-training)."""
    trainers = {name: Trainer.from_config(cfg, None, log=lambda s: None) for name, cfg in cfgs.items()}
    for tr in trainers.values():  # warm-up (allocator, first-call overheads)
        tr.train_step()
    names = list(trainers)
    per = {n: {"wall": [], "cpu": []} for n in names}
    for r in range(args.cost_rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            w, c = _timed(lambda n=n: [trainers[n].train_step() for _ in range(args.cost_steps)])
            per[n]["wall"].append(w / args.cost_steps)
            per[n]["cpu"].append(c / args.cost_steps)
    base = names[0]
    out = {}
    for n in names:
        ratios = [a / b for a, b in zip(per[n]["cpu"], per[base]["cpu"])]
        wall_ratios = [a / b for a, b in zip(per[n]["wall"], per[base]["wall"])]
        out[n] = {"step_wall_s": statistics.median(per[n]["wall"]), "step_cpu_s": statistics.median(per[n]["cpu"]),
                  "cpu_ratio_median": statistics.median(ratios), "cpu_ratios": ratios,
                  "wall_ratio_median": statistics.median(wall_ratios)}
    return out


def sample_cost(ref, energy, path, L: int, args) -> dict:
    """Wall / CPU time of the plain sampler and of SIR (EDLM window, k = 2; every step, k = 4), interleaved."""
    K, N = args.cost_sample_steps, args.cost_sample_batch
    cases = {
        "plain": lambda g: sample(ref, path, batch_size=N, length=L, num_steps=K, generator=g,
                                  time_independent=may_cache(ref, path)),
        "sir_k2_window": lambda g: sample_sir(ref, energy, path, batch_size=N, length=L, num_steps=K,
                                              num_candidates=2, window=(0.4, 0.6), generator=g),
        "sir_k4_every_step": lambda g: sample_sir(ref, energy, path, batch_size=N, length=L, num_steps=K,
                                                  num_candidates=4, window=(0.0, 1.0), generator=g),
    }
    per = {n: {"wall": [], "cpu": []} for n in cases}
    with torch.no_grad():
        for r in range(args.cost_rounds):
            names = list(cases)
            for n in names[r % 3:] + names[: r % 3]:
                w, c = _timed(lambda n=n, r=r: cases[n](torch.Generator().manual_seed(r)))
                per[n]["wall"].append(w)
                per[n]["cpu"].append(c)
    out = {"K": K, "batch": N}
    for n in cases:
        out[n] = {"wall_s": statistics.median(per[n]["wall"]), "cpu_s": statistics.median(per[n]["cpu"]),
                  "cpu_ratio_median": statistics.median(a / b for a, b in zip(per[n]["cpu"], per["plain"]["cpu"]))}
    return out


# --------------------------------------------------------------------------------------------------- report


def report(results: dict) -> str:
    """Markdown tables of docs/benchmarks.md from the JSON results."""
    lines = []
    lik = results.get("likelihood", {})
    if lik:
        ns = next((r for r in lik.values() if "log_z_samples" in r), {})
        ns = sorted(int(k.split("_n")[1]) for k in ns if k.startswith("log_z_mean_n"))
        lines += ["| model | valid masked bound (bits/token) | IS estimate, log Ẑ from n = " + " / ".join(map(str, ns))
                  + " (not a bound) | mean log Ẑ at n = " + str(ns[-1] if ns else "") + " |", "|---|---|---|---|"]
        for name, r in lik.items():
            if "bpc_estimate" in r:
                est = " / ".join(f"{r[f'bpc_estimate_n{n}']:.3f}" for n in ns)
                lines.append(f"| {name} (energy) | reference {r['reference_bpc']:.3f} ± {r['reference_bpc_stderr']:.3f}"
                             f" | {est} (± {r['bpc_estimate_stderr']:.3f}) | {r[f'log_z_mean_n{ns[-1]}']:.2f} |")
            else:
                lines.append(f"| {name} | {r['bpc']:.3f} ± {r['bpc_stderr']:.3f} | – | – |")
        lines.append("")
    rows = results.get("quality", [])
    if rows:
        Ks = sorted({r["K"] for r in rows if r["K"] is not None})
        for metric, label in (("nll_bits", "true NLL of samples, bits/token"), ("bigram_kl_bits", "bigram KL, bits"),
                              ("unigram_entropy_bits", "unigram entropy, bits")):
            data = next(r for r in rows if r["model"] == "data")
            lines += [f"{label} (true samples of the chain: {data[metric]:.3f})", "",
                      "| model | sampler | " + " | ".join(f"K = {K}" for K in Ks) + " |",
                      "|---|---|" + "---|" * len(Ks)]
            keys = []
            for r in rows:
                key = (r["model"], r["k"], tuple(r["window"]) if r["window"] else None)
                if r["model"] != "data" and key not in keys:
                    keys.append(key)
            for model, k, window in keys:
                sampler = "plain" if k is None else f"SIR k = {k}" + ("" if window == (0.0, 1.0) else f", α ∈ {list(window)}")
                cells = []
                for K in Ks:
                    r = next(r for r in rows if (r["model"], r["k"], tuple(r["window"]) if r["window"] else None)
                             == (model, k, window) and r["K"] == K)
                    se = f" ± {r['nll_bits_stderr']:.3f}" if metric == "nll_bits" else ""
                    cells.append(f"{r[metric]:.3f}{se}")
                lines.append(f"| {model} | {sampler} | " + " | ".join(cells) + " |")
            lines.append("")
    cost = results.get("cost", {})
    if cost:
        lines += ["| training step | CPU s / step | CPU-time ratio to pre-training (median; per round) | wall ratio |",
                  "|---|---|---|---|"]
        for name, c in cost["train_step"].items():
            per = ", ".join(f"{v:.2f}" for v in c["cpu_ratios"])
            lines.append(f"| {name} | {c['step_cpu_s']:.4f} | {c['cpu_ratio_median']:.2f} ({per}) | "
                         f"{c['wall_ratio_median']:.2f} |")
        if "sampling" in cost:
            sc = cost["sampling"]
            lines += ["", f"| sampler (K = {sc['K']}, {sc['batch']} sequences) | CPU s | CPU-time ratio to plain |",
                      "|---|---|---|"]
            for name in ("plain", "sir_k2_window", "sir_k4_every_step"):
                lines.append(f"| {name} | {sc[name]['cpu_s']:.3f} | {sc[name]['cpu_ratio_median']:.2f} |")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work-dir", default="runs/bench/dre", help="where the runs are trained")
    ap.add_argument("--out", default="benchmarks/results/dre_quality.json")
    ap.add_argument("--pretrain-steps", type=int, default=2500)
    ap.add_argument("--dre-steps", type=int, default=1000)
    ap.add_argument("--dre-lr", type=float, default=3e-4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--negatives", type=int, default=2, help="reference draws per x_t during DRE training")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--steps", default="4,8,16,64", help="sampling steps K")
    ap.add_argument("--sir-k", default="1,2,4,16", help="SIR candidates k")
    ap.add_argument("--num-samples", type=int, default=512)
    ap.add_argument("--eval-seqs", type=int, default=64)
    ap.add_argument("--eval-num-t", type=int, default=4)
    ap.add_argument("--log-z-samples", default="1,4,16,64")
    ap.add_argument("--cost-rounds", type=int, default=5)
    ap.add_argument("--cost-steps", type=int, default=10)
    ap.add_argument("--cost-sample-steps", type=int, default=16)
    ap.add_argument("--cost-sample-batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tiny", action="store_true", help="seconds-long smoke setting (numbers mean nothing)")
    ap.add_argument("--report", action="store_true", help="print the markdown tables of --out and exit")
    args = ap.parse_args()
    if args.report:
        print(report(json.loads(Path(args.out).read_text())))
        return
    if args.tiny:
        args.pretrain_steps, args.dre_steps, args.num_samples, args.eval_seqs = 20, 6, 16, 4
        args.steps, args.sir_k, args.log_z_samples, args.cost_rounds, args.cost_steps = "4", "1,2", "1,2", 2, 1
    args.steps = [int(v) for v in args.steps.split(",")]
    args.sir_k = [int(v) for v in args.sir_k.split(",")]
    args.log_z_samples = [int(v) for v in args.log_z_samples.split(",")]
    torch.set_num_threads(args.threads)
    work, out_path = Path(args.work_dir), Path(args.out)
    results = json.loads(out_path.read_text()) if out_path.is_file() else {}
    results.setdefault("meta", {}).update(
        command="python benchmarks/dre_quality.py " + " ".join(sys.argv[1:]),
        platform=platform.platform(), torch=torch.__version__, threads=args.threads,
    )

    def save(key, value):
        results[key] = value
        results["meta"]["loadavg_" + key] = os.getloadavg()
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(results, indent=1) + "\n")

    tiny = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "data.num_train=512"] if args.tiny else []
    pre_cfg = load_config("synthetic", [*QUIET, *tiny, f"train.steps={args.pretrain_steps}",
                                        f"train.batch_size={args.batch}", "train.eval_examples=64"])
    ref_dir = work / "reference"
    if "train" not in results:
        t0, c0 = time.perf_counter(), time.process_time()
        train_run(pre_cfg, ref_dir)
        times = {"reference": (time.perf_counter() - t0, time.process_time() - c0)}
        failed = results.get("failed", {})
        for name in args.variants.split(","):
            if name in failed:
                continue
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                train_run(variant_config(ref_dir, name, args), work / name)
            except TrainingError as e:  # a diverging loss is a result: recorded, and the variant is dropped
                failed[name] = str(e)
                save("failed", failed)
                continue
            times[name] = (time.perf_counter() - t0, time.process_time() - c0)
        done = ["reference", *(n for n in args.variants.split(",") if n not in failed)]
        summaries = {n: json.loads((work / n / "summary.json").read_text()) for n in done}
        save("train", {"wall_cpu_s": times, "summaries": summaries})
    variants = [n for n in results["train"]["summaries"] if n != "reference"]
    models = {"reference": load_checkpoint(ref_dir), **{n: load_checkpoint(work / n) for n in variants}}
    for ck in models.values():
        ck.model.eval()
    data = models["reference"].build_data()
    path = models["reference"].build_path()
    if "likelihood" not in results:
        save("likelihood", likelihood(models, data, path, args))
    if "quality" not in results:
        save("quality", quality(models, path, data.source, args, args.seed))
    if "cost" not in results:
        cfgs = {"pretrain": set_values(pre_cfg, {"train.init_from": str(ref_dir)})}
        for name in ("ii-bce", "ii-gkl", "i-bce"):
            if name in variants:
                cfgs[f"dre {name}"] = variant_config(ref_dir, name, args)
        energy = next((models[n].model for n in variants if n.startswith("ii")), None)
        cost = {"train_step": train_cost(cfgs, args)}
        if energy is not None:
            cost["sampling"] = sample_cost(models["reference"].model, energy, path, data.seq_len, args)
        save("cost", cost)
    print(json.dumps({k: results[k] for k in ("likelihood", "cost")}, indent=1))


if __name__ == "__main__":
    np.set_printoptions(precision=4)
    main()
