"""Pre-training quality benchmark: test likelihood bounds of the four TCSM paper variants and two baselines.

Trains, one after another in this process and with one fixed budget (same steps, batch, sequence length, LR
schedule, seed and data order for every run):

* text8-prefix, `small` denoiser: {masked, uniform} × {L_score, L_distrib} (TCSM, time-conditioned, linear
  schedule, κ_t weighting), the MDLM-equivalent baseline (masked L_distrib with κ_t = MDLM's NELBO, log-linear
  schedule, no time conditioning; MATH.md §3.4) and the SEDD-style baseline (objective `sedd`: the uniform
  time-reversal bound itself, mean-parameterised; MATH.md §2.3 B);
* the synthetic Markov source of the quickstart (`synthetic` preset): {masked, uniform} × {score, distrib},
  reported as the gap to the source's exact entropy rate.

Every model is evaluated on the same test sequences with the same Monte Carlo draws (same seed), with the valid
bound of its path: masked → §2.2; uniform → time-reversal bound (B, §2.3) and, labelled, the DFM bound (A).
Both uniform bounds reuse one set of denoiser calls (the draws do not depend on the bound). Standard errors are
over test sequences (data and Monte Carlo spread together); differences are paired per sequence.

Results are appended to a JSON file after every run, so a partial run keeps what it finished; re-running with
the same --out skips the runs already there. Usage (see benchmarks/README.md):

    nohup nice -n 5 .venv/bin/python benchmarks/pretrain_quality.py --out benchmarks/results/pretrain_quality.json &
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import torch

LN2 = math.log(2.0)

# name → (suite, overrides, label). Shared budget overrides are added by `common_overrides`.
TEXT8_VARIANTS = {
    "tcsm-masked-distrib": (["path.source=masked", "objective.loss=distrib"], "TCSM masked L_distrib (KL)"),
    "tcsm-masked-score": (
        ["path.source=masked", "objective.loss=score", "objective.kwargs.weight_cap=inf"],
        "TCSM masked L_score (GKL, paper's MC estimator)",
    ),
    "tcsm-masked-score-capped": (
        ["path.source=masked", "objective.loss=score"],
        "TCSM masked L_score (GKL, weights capped at V: the default)",
    ),
    "tcsm-uniform-distrib": (["path.source=uniform", "objective.loss=distrib"], "TCSM uniform L_distrib (KL)"),
    "tcsm-uniform-score": (
        ["path.source=uniform", "objective.loss=score", "objective.kwargs.tilt=false", "objective.kwargs.weight_cap=inf"],
        "TCSM uniform L_score (GKL, paper's MC estimator)",
    ),
    "tcsm-uniform-score-tilt": (
        ["path.source=uniform", "objective.loss=score", "objective.kwargs.tilt=true", "objective.kwargs.weight_cap=inf"],
        "TCSM uniform L_score (GKL, kernel-tilted)",
    ),
    "tcsm-uniform-score-capped": (
        ["path.source=uniform", "objective.loss=score", "objective.kwargs.tilt=false"],
        "TCSM uniform L_score (GKL, weights capped at V, untilted)",
    ),
    "tcsm-uniform-score-tilt-capped": (
        ["path.source=uniform", "objective.loss=score", "objective.kwargs.tilt=true", "objective.kwargs.weight_cap=V"],
        "TCSM uniform L_score (GKL, kernel-tilted, weights capped at V)",
    ),
    "mdlm": (
        ["path.source=masked", "objective.loss=distrib", "path.schedule=loglinear", "model.time_conditioning=false"],
        "MDLM-equivalent (masked CE, κ_t, log-linear ε=0, no time cond.)",
    ),
    "sedd": (
        ["path.source=uniform", "objective.name=sedd", "path.schedule=loglinear"],
        "SEDD-style score entropy (mean-parameterised), uniform",
    ),
}
SYNTH_VARIANTS = {
    "synthetic-masked-distrib": (["path.source=masked", "objective.loss=distrib"], "masked L_distrib"),
    "synthetic-masked-score": (["path.source=masked", "objective.loss=score"], "masked L_score"),
    "synthetic-uniform-distrib": (
        ["path.source=uniform", "objective.loss=distrib", "model.time_conditioning=true"], "uniform L_distrib"),
    "synthetic-uniform-score": (
        ["path.source=uniform", "objective.loss=score", "objective.kwargs.tilt=false", "model.time_conditioning=true"],
        "uniform L_score"),
}


def common_overrides(args, suite: str) -> list[str]:
    quiet = [
        "train.eval_every=0", "train.eval_examples=1", "eval.num_t=1",  # the trainer's own final eval: negligible
        "train.sample_every=0", "sample.num=0", "train.save_every=0", "train.keep_last=1",
        "train.progress=false", "train.tensorboard=false", f"train.threads={args.threads}", f"train.seed={args.seed}",
    ]
    if suite == "text8":
        return quiet + [
            f"data.path={args.text8}", f"data.seq_len={args.seq_len}", f"train.batch_size={args.batch}",
            f"train.steps={args.steps}", f"optim.lr={args.lr}", f"optim.warmup={args.warmup}",
            "optim.decay=cosine", "optim.min_lr_ratio=0.1", "train.ema=0", f"train.precision={args.precision}",
            "train.log_every=25", "model.time_conditioning=true",
        ]
    return quiet + [f"train.steps={args.synthetic_steps}", f"train.precision={args.synthetic_precision}",
                    "train.log_every=100"]


class CachedDenoiser:
    """Records the logits of a first bound evaluation and replays them for a second one with the same draws."""

    def __init__(self, model):
        self.model, self.cache, self.replay = model, [], None

    @classmethod
    def around(cls, model):
        """A cache that declares the model's kind, so a block model still receives the clean sequence."""
        from tcsm.models.kinds import kind_of

        return type(cls.__name__, (cls,), {"model_kind": kind_of(model)})(model)

    def __call__(self, xt, t, x1=None):
        if self.replay is None:
            logits = self.model(xt, t) if x1 is None else self.model(xt, t, x1=x1)
            self.cache.append((xt, t, logits))
            return logits
        xt0, t0, logits = self.cache[self.replay]
        if not (torch.equal(xt0, xt) and torch.equal(t0, t)):
            raise RuntimeError("bound evaluations drew different (t, x_t); cannot reuse the logits")
        self.replay += 1
        return logits


@torch.no_grad()
def evaluate(model, path, data, bounds, *, batch_size, num_t, seed, precision):
    """{bound: per-sequence nats per token (list)} on `data`, sharing the denoiser calls between bounds."""
    from tcsm.evaluation.likelihood import nelbo

    model.eval()
    per = {b: [] for b in bounds}
    cast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else torch.autocast("cpu", enabled=False)
    g = torch.Generator().manual_seed(seed)
    for s in range(0, data.shape[0], batch_size):
        x1 = data[s : s + batch_size].long()
        state = g.get_state()
        den = CachedDenoiser.around(model)
        for k, b in enumerate(bounds):
            g.set_state(state)  # identical t and x_t for every bound
            den.replay = None if k == 0 else 0
            with cast:
                per[b].append((nelbo(den, x1, path, num_t=num_t, generator=g, bound=b) / x1.shape[1]).double())
    return {b: [round(x, 6) for x in torch.cat(v).tolist()] for b, v in per.items()}


def stats(nats: list[float]) -> dict:
    x = torch.tensor(nats, dtype=torch.float64)
    se = float(x.std(unbiased=True) / math.sqrt(len(x)))
    return {"bpc": float(x.mean()) / LN2, "bpc_stderr": se / LN2, "nats_per_token": float(x.mean()), "n": len(x)}


def run_variant(name, suite, overrides, label, args, out_root):
    from omegaconf import OmegaConf

    from tcsm.builders.config import load_config
    from tcsm.paths.bounds import BOUNDS
    from tcsm.train.trainer import Trainer

    preset = "text8-prefix-small" if suite == "text8" else "synthetic"
    ov = common_overrides(args, suite) + overrides
    cfg = load_config(preset, ov)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    trainer = Trainer.from_config(cfg, out_root / name, log=lambda s: print(f"[{name}] {s}", flush=True))
    summary = trainer.fit()
    train_wall = time.perf_counter() - t0
    test = trainer.data.split("test")
    n = min(args.eval_seqs if suite == "text8" else args.synthetic_eval_seqs, test.shape[0])
    idx = torch.linspace(0, test.shape[0] - 1, n).round().long()  # spread over the whole test split
    bounds = list(BOUNDS[trainer.path.kind])
    e0 = time.perf_counter()
    per = evaluate(
        trainer.eval_model(), trainer.path, test[idx], bounds, batch_size=args.eval_batch,
        num_t=args.num_t, seed=args.eval_seed, precision=args.eval_precision,
    )
    rec = {
        "name": name, "suite": suite, "label": label, "preset": preset, "overrides": ov,
        "path": trainer.path.kind, "schedule": cfg.path.schedule, "objective": OmegaConf.to_container(cfg.objective),
        "time_conditioning": bool(trainer.model.cfg.time_conditioning),
        "params": sum(p.numel() for p in trainer.model.parameters()),
        "train_wall_s": round(train_wall, 1), "train_elapsed_s": summary.get("elapsed_s"),
        "eval_wall_s": round(time.perf_counter() - e0, 1), "loadavg_start": load0, "loadavg_end": os.getloadavg()[0],
        "steps": int(cfg.train.steps), "batch": int(cfg.train.batch_size), "seq_len": int(trainer.data_info.seq_len),
        "precision": trainer.precision, "eval": {"sequences": n, "num_t": args.num_t, "seed": args.eval_seed},
        "bounds": {b: stats(v) for b, v in per.items()}, "per_sequence_nats": per,
    }
    floor = trainer.data_info.nats_per_token_floor
    if floor is not None:
        rec["floor_bpc"] = floor / LN2
        for b in rec["bounds"].values():
            b["gap_bpc"] = b["bpc"] - rec["floor_bpc"]
    return rec


def _fmt(b: dict) -> str:
    return f"{b['bpc']:.3f} ± {b['bpc_stderr']:.3f}"


def _paired(runs: dict, a: str, b: str, ba: str, bb: str) -> str:
    """Mean ± stderr (bits/token) of the per-sequence difference bound_a(run a) − bound_b(run b) on the same x_1."""
    if a not in runs or b not in runs or "per_sequence_nats" not in runs[a] or "per_sequence_nats" not in runs[b]:
        return "–"
    d = torch.tensor(runs[a]["per_sequence_nats"][ba], dtype=torch.float64) - torch.tensor(
        runs[b]["per_sequence_nats"][bb], dtype=torch.float64)
    return f"{float(d.mean()) / LN2:+.3f} ± {float(d.std(unbiased=True)) / math.sqrt(len(d)) / LN2:.3f}"


def report(results: dict) -> str:
    """Markdown tables of docs/benchmarks.md from a results file."""
    runs, lines = results.get("runs", {}), []
    a = results.get("meta", {}).get("args", {})
    lines += [(f"text8-prefix, `small` preset, {a.get('steps')} steps × batch {a.get('batch')} × length "
              f"{a.get('seq_len')}, lr {a.get('lr')} (warm-up {a.get('warmup')}, cosine to 10%), {a.get('precision')}, "
              f"CPU; test bound on {a.get('eval_seqs')} test sequences × {a.get('num_t')} t-samples."), "",
              "| run | path, schedule, time cond. | test BPC, valid bound | uniform: DFM bound (A) | train wall |",
              "|---|---|---|---|---|"]
    for name in TEXT8_VARIANTS:
        r = runs.get(name)
        if r is None:
            lines.append(f"| {TEXT8_VARIANTS[name][1]} | – | _not run_ | – | – |")
            continue
        if "error" in r:
            lines.append(f"| {r['label']} | – | failed: {r['error']} | – | – |")
            continue
        main_b = "masked" if r["path"] == "masked" else "reversal"
        tag = "masked (§2.2)" if main_b == "masked" else "reversal (B)"
        dfm = _fmt(r["bounds"]["dfm"]) if "dfm" in r["bounds"] else "–"
        lines.append(f"| {r['label']} | {r['path']}, {r['schedule']}, {'yes' if r['time_conditioning'] else 'no'} | "
                     f"{_fmt(r['bounds'][main_b])} [{tag}] | {dfm} | {r['train_wall_s']:.0f} s |")
    lines += ["", "Paired per-sequence differences (bits/token, same test sequences; negative = first is better):", "",
              "| comparison | Δ BPC |", "|---|---|"]
    for x, y, bx, by, text in [
        ("tcsm-masked-distrib", "mdlm", "masked", "masked", "TCSM masked L_distrib − MDLM-equivalent"),
        ("tcsm-masked-score", "mdlm", "masked", "masked", "TCSM masked L_score − MDLM-equivalent"),
        ("tcsm-uniform-distrib", "sedd", "reversal", "reversal", "TCSM uniform L_distrib − SEDD-style (bound B)"),
        ("tcsm-uniform-score", "sedd", "reversal", "reversal", "TCSM uniform L_score − SEDD-style (bound B)"),
        ("tcsm-masked-distrib", "tcsm-uniform-distrib", "masked", "reversal", "masked − uniform, L_distrib"),
        ("tcsm-masked-score", "tcsm-uniform-score", "masked", "reversal", "masked − uniform, L_score"),
    ]:
        lines.append(f"| {text} | {_paired(runs, x, y, bx, by)} |")
    s = a.get("synthetic_steps")
    lines += ["", (f"Synthetic Markov source (`synthetic` preset, quickstart model; {s} steps), gap to the exact "
              "entropy rate:"), "", "| variant | test BPC, valid bound | entropy rate | gap | uniform: DFM bound (A) gap |",
              "|---|---|---|---|---|"]
    for name in SYNTH_VARIANTS:
        r = runs.get(name)
        if r is None or "error" in r:
            lines.append(f"| {SYNTH_VARIANTS[name][1]} | {'_not run_' if r is None else 'failed'} | – | – | – |")
            continue
        main_b = "masked" if r["path"] == "masked" else "reversal"
        b = r["bounds"][main_b]
        dfm = r["bounds"].get("dfm")
        lines.append(f"| {r['label']} | {_fmt(b)} | {r['floor_bpc']:.3f} | {b['gap_bpc']:+.3f} ± {b['bpc_stderr']:.3f} | "
                     + (f"{dfm['gap_bpc']:+.3f} ± {dfm['bpc_stderr']:.3f}" if dfm else "–") + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="benchmarks/results/pretrain_quality.json")
    ap.add_argument("--runs", default="runs/bench/pretrain_quality", help="run directories (checkpoints, logs)")
    ap.add_argument("--only", default="", help="comma-separated variant names (default: all)")
    ap.add_argument("--text8", default="../shared/data/text8/text8_prefix.txt.gz")
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=25)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--synthetic-steps", type=int, default=1000)
    ap.add_argument("--synthetic-precision", default="fp32")
    ap.add_argument("--threads", type=int, default=1, help="1 is fastest on a shared 2-core machine")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-seqs", type=int, default=256)
    ap.add_argument("--synthetic-eval-seqs", type=int, default=1000)
    ap.add_argument("--eval-batch", type=int, default=64)
    ap.add_argument("--num-t", type=int, default=8)
    ap.add_argument("--eval-seed", type=int, default=1234)
    ap.add_argument("--eval-precision", default="bf16")
    ap.add_argument("--report", action="store_true", help="print the markdown tables of --out and exit")
    args = ap.parse_args(argv)

    out = Path(args.out)
    if args.report:
        print(report(json.loads(out.read_text())))
        return
    out.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(out.read_text()) if out.exists() else {}
    results.setdefault("meta", {})
    results["meta"].update(
        command=" ".join([os.path.basename(sys.executable), *sys.argv]), torch=torch.__version__,
        machine=f"{platform.machine()}, {os.cpu_count()} CPU cores (shared)", args=vars(args),
    )
    runs = results.setdefault("runs", {})
    todo = [("text8", n, *v) for n, v in TEXT8_VARIANTS.items()] + [("synthetic", n, *v) for n, v in SYNTH_VARIANTS.items()]
    only = {s for s in args.only.split(",") if s}
    for suite, name, overrides, label in todo:
        if (only and name not in only) or name in runs:
            continue
        print(f"=== {name} ({suite}) — load {os.getloadavg()[0]:.1f}", flush=True)
        try:
            runs[name] = run_variant(name, suite, overrides, label, args, Path(args.runs))
        except Exception as e:  # noqa: BLE001 (one failed variant must not lose the others)
            runs[name] = {"name": name, "suite": suite, "label": label, "error": f"{type(e).__name__}: {e}"}
        r = runs[name]
        shown = {b: f"{v['bpc']:.4f} ± {v['bpc_stderr']:.4f}" for b, v in r.get("bounds", {}).items()}
        print(f"=== {name}: {shown} train {r.get('train_wall_s')} s {r.get('error', '')}", flush=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1))
        tmp.replace(out)  # atomic: a reader never sees half a file


if __name__ == "__main__":
    main()
