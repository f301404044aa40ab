"""Pre-training quality at an equal CPU-time budget: one variant per invocation, resumable, with a learning curve.

Each variant trains the same `small`-sized network on text8-prefix (same batch, length, constant learning rate
after warm-up, EMA, seed and data order) until its training process has used `--cpu-hours` of CPU time (one
thread, so CPU time is the work done, whatever the machine's load). Training runs in chunks of `--chunk-steps`
steps through the library's Trainer with checkpoints, so a killed run continues with `--resume`-exact state; the
CPU time used so far, the learning curve (validation BPC against training tokens on a fixed subset) and, at the
end, the test result (valid bound with standard errors; the AR model's exact NLL) are kept in
`<runs>/<variant>/quality.json` and merged into `--out`.

Run two at a time, one thread each (the machine has two cores):

    nohup .venv/bin/python benchmarks/quality_budget.py --variant tcsm-masked-distrib --cpu-hours 1 &
    nohup .venv/bin/python benchmarks/quality_budget.py --variant ar --cpu-hours 1 &
    .venv/bin/python benchmarks/quality_budget.py --report            # table + figure from --out
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import torch
from omegaconf import read_write

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pretrain_quality import TEXT8_VARIANTS, evaluate, stats

LN2 = math.log(2.0)
VARIANTS = {
    **{k: v for k, v in TEXT8_VARIANTS.items()},
    # The clean-model presets are named apart from the denoiser's: clean `base` is the denoiser's `small` trunk
    # (4 × 256, 4 heads), without the time conditioning it does not need.
    "ar": (["model.name=causal", "model.preset=base", "objective.name=clean_lm"],
           "autoregressive transformer (same trunk, 4 × 256), exact NLL"),
    # block diffusion (MATH.md §9): the masked L_distrib run with blocks; B = 128 is one block of the whole sequence
    **{f"block-masked-{b}": (["path.source=masked", "objective.loss=distrib", f"path.block_length={b}"],
                             f"block diffusion, B = {b}, masked L_distrib (KL)") for b in (4, 16, 128)},
    "block-uniform-16": (["path.source=uniform", "objective.loss=distrib", "path.block_length=16"],
                         "block diffusion, B = 16, uniform L_distrib (KL)"),
}


def overrides(args, variant: str, steps: int) -> list[str]:
    base = [
        f"data.path={Path(args.text8).resolve()}", f"data.seq_len={args.seq_len}", f"train.batch_size={args.batch}",
        f"train.steps={steps}", f"optim.lr={args.lr}", f"optim.warmup={args.warmup}", "optim.decay=constant",
        f"train.ema={args.ema}", "train.precision=bf16", "train.threads=1", f"train.seed={args.seed}",
        "train.eval_every=0", "train.eval_examples=1", "eval.num_t=1", "train.sample_every=0", "sample.num=0",
        f"train.save_every={args.chunk_steps}", "train.keep_last=1", "train.progress=false",
        "train.tensorboard=false", "train.log_every=100",
    ]
    extra = VARIANTS[variant][0]
    if variant != "ar":
        # The table's denoisers were trained with the tanh GELU (the default before `model.activation`); pinned so
        # that a rerun or a resumed run computes the same function.
        base += ["model.time_conditioning=true", "model.activation=gelu_tanh"]
    return base + extra


def _atomic_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    tmp.replace(path)


@torch.no_grad()
def score(trainer, data, args, *, num_t: int, seed: int) -> dict:
    """Per-sequence nats per token of the eval model on `data`: the path's valid bound(s), or the AR exact NLL."""
    from tcsm.models.kinds import kind_of

    model = trainer.eval_model()
    if kind_of(model).family == "causal":
        from tcsm.objectives.lm import AutoregressiveLoss

        model.eval()
        nll = AutoregressiveLoss().sequence_nll(model, data.long()) / data.shape[1]
        return {"exact": [round(float(x), 6) for x in nll]}
    bounds = list(trainer.path.bounds)
    return evaluate(model, trainer.path, data, bounds, batch_size=args.eval_batch, num_t=num_t, seed=seed,
                    precision="bf16")


def run_key(variant: str, seed: int) -> str:
    """Results and run directories are named by variant, and by seed for every seed but the table's first (0)."""
    return variant if seed == 0 else f"{variant}@seed{seed}"


def run(args) -> dict:
    from tcsm.builders.config import load_config
    from tcsm.train.trainer import Trainer

    run_dir = Path(args.runs) / run_key(args.variant, args.seed)
    state_file = run_dir / "quality.json"
    if run_dir.exists() and not state_file.exists():
        shutil.rmtree(run_dir)  # killed inside its first chunk: nothing to keep, start the run again
    state = json.loads(state_file.read_text()) if state_file.exists() else {
        "variant": args.variant, "label": VARIANTS[args.variant][1], "seed": args.seed, "cpu_s": 0.0, "step": 0,
        "curve": []}
    budget = args.cpu_hours * 3600.0
    tokens_per_step = args.batch * args.seq_len
    resume = (run_dir / "checkpoints").is_dir() and state["step"] > 0
    cfg = load_config("text8-prefix-small", overrides(args, args.variant, state["step"] + args.chunk_steps))
    c0 = time.process_time()
    trainer = Trainer.from_config(cfg, run_dir, resume=resume, log=lambda s: None)
    state["cpu_s"] += time.process_time() - c0  # building (data, model) is part of what a run costs
    while state["cpu_s"] < budget:
        # The learning rate is constant after warm-up, so extending train.steps chunk by chunk trains exactly as
        # one long run would; each chunk ends with a checkpoint.
        with read_write(trainer.cfg):
            trainer.cfg.train.steps = state["step"] + args.chunk_steps
        c0, w0 = time.process_time(), time.perf_counter()
        trainer.fit()
        state.pop("test", None)  # trained further: the test result must be recomputed
        state["cpu_s"] += time.process_time() - c0
        state["wall_s"] = state.get("wall_s", 0.0) + time.perf_counter() - w0
        state["step"] = trainer.step
        valid = trainer.data.split("valid")
        idx = torch.linspace(0, valid.shape[0] - 1, args.curve_seqs).round().long()
        per = score(trainer, valid[idx], args, num_t=2, seed=args.eval_seed)
        main = next(iter(per))  # the path's default bound (masked / reversal) or the AR NLL
        point = {"step": trainer.step, "tokens": trainer.step * tokens_per_step, "cpu_s": round(state["cpu_s"], 1),
                 "valid_bpc": stats(per[main])["bpc"], "bound": main, "loadavg": os.getloadavg()[0]}
        state["curve"].append(point)
        _atomic_json(state_file, state)
        print(f"[{args.variant}] {point}", flush=True)
    if "test" not in state:
        test = trainer.data.split("test")
        idx = torch.linspace(0, test.shape[0] - 1, min(args.eval_seqs, test.shape[0])).round().long()
        per = score(trainer, test[idx], args, num_t=args.num_t, seed=args.eval_seed)
        state["test"] = {b: stats(v) for b, v in per.items()}
        state["test_per_sequence_nats"] = per
        state["params"] = sum(p.numel() for p in trainer.model.parameters())
        state["tokens"] = state["step"] * tokens_per_step
        _atomic_json(state_file, state)
    return state


# Paired per-sequence differences the table reports (the same 256 test sequences for every run; within a path the
# same (t, x_t) draws). Seeds of one variant are compared with the other variant's seed-0 run.
PAIRED = [
    ("tcsm-masked-score-capped", "tcsm-masked-distrib"),
    ("tcsm-masked-score", "tcsm-masked-distrib"),
    ("tcsm-masked-score-capped", "tcsm-masked-score"),
    ("tcsm-uniform-score-capped", "tcsm-uniform-distrib"),
    ("tcsm-uniform-score-capped", "tcsm-uniform-score-tilt"),
    ("tcsm-uniform-score-capped", "sedd"),
    ("tcsm-uniform-score-tilt-capped", "tcsm-uniform-distrib"),
    ("tcsm-uniform-score-tilt-capped", "tcsm-uniform-score-tilt"),
]


def _main_values(r: dict) -> list[float] | None:
    per = r.get("test_per_sequence_nats")
    return None if not per else per[next(iter(per))]


def _seed_summary(runs: dict) -> list[str]:
    """Mean test BPC over the seeds of each variant run with more than one, with the standard error across seeds."""
    out = []
    for name in VARIANTS:
        bpcs = [r["test"][next(iter(r["test"]))]["bpc"] for k, r in runs.items()
                if k.split("@")[0] == name and "test" in r]
        if len(bpcs) > 1:
            x = torch.tensor(bpcs, dtype=torch.float64)
            out.append(f"| {VARIANTS[name][1]} | {len(bpcs)} seeds | {float(x.mean()):.3f} ± "
                       f"{float(x.std(unbiased=True)) / math.sqrt(len(bpcs)):.3f} (across seeds) |")
    return ["", "| run | seeds | mean test BPC |", "|---|---|---|", *out] if out else []


def _paired(runs: dict, pairs) -> list[str]:
    out = []
    for a, b in pairs:
        rb = runs.get(b)
        yb = None if rb is None else _main_values(rb)
        for key in sorted((k for k in runs if k.split("@")[0] == a), key=len):
            ya = _main_values(runs[key])
            if ya is None or yb is None or len(ya) != len(yb):
                continue
            d = (torch.tensor(ya, dtype=torch.float64) - torch.tensor(yb, dtype=torch.float64)) / LN2
            seed = runs[key].get("seed", 0)
            out.append(f"| {VARIANTS[a][1]}{f' (seed {seed})' if seed else ''} − {VARIANTS[b][1]} | "
                       f"{float(d.mean()):+.3f} ± {float(d.std(unbiased=True)) / math.sqrt(len(d)):.3f} |")
    return ["", "Paired per-sequence differences (bits/char; ± one standard error over the test sequences):", "",
            "| comparison | Δ BPC |", "|---|---|", *out] if out else []


def report(results: dict, figure: Path | None) -> str:
    runs = results.get("runs", {})
    a = results.get("meta", {}).get("args", {})
    lines = [(f"text8-prefix, `small`-sized networks (4 × 256), batch {a.get('batch')} × length {a.get('seq_len')}, "
             f"constant lr {a.get('lr')} after {a.get('warmup')} warm-up steps, EMA {a.get('ema')}, bf16, one thread; "
             f"budget {a.get('cpu_hours')} CPU-hour(s) of training per run; test on {a.get('eval_seqs')} sequences × "
             f"{a.get('num_t')} t."), "",
             "| run | training tokens | steps | CPU h | test BPC (valid bound; AR: exact NLL) | uniform: DFM bound (A) |",
             "|---|---|---|---|---|---|"]
    keys = [k for name in VARIANTS for k in sorted((k for k in runs if k.split("@")[0] == name), key=len)]
    for key in keys or list(VARIANTS):
        name = key.split("@")[0]
        r = runs.get(key)
        label = VARIANTS[name][1] + (f" (seed {r.get('seed', 0)})" if r is not None and "@" in key else "")
        if r is None or "test" not in r:
            done = "" if r is None else f" (in progress: {r['step']} steps, {r['cpu_s'] / 3600:.2f} CPU h)"
            lines.append(f"| {label} | – | – | – | _not run_{done} | – |")
            continue
        main = next(iter(r["test"]))
        t = r["test"][main]
        dfm = r["test"].get("dfm")
        dfm_text = "–" if dfm is None else f"{dfm['bpc']:.3f} ± {dfm['bpc_stderr']:.3f}"
        lines.append(f"| {label} | {r['tokens'] / 1e6:.1f}M | {r['step']} | {r['cpu_s'] / 3600:.2f} | "
                     f"{t['bpc']:.3f} ± {t['bpc_stderr']:.3f} [{main}] | {dfm_text} |")
    lines += _seed_summary(runs) + _paired(runs, PAIRED)
    if figure is not None and runs:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, r in runs.items():
            c = r.get("curve", [])
            if c:
                ax.plot([p["tokens"] / 1e6 for p in c], [p["valid_bpc"] for p in c], marker=".",
                        label=VARIANTS[name.split("@")[0]][1] + (f" (seed {r.get('seed')})" if "@" in name else ""))
        ax.set_xlabel("training tokens (millions)")
        ax.set_ylabel("validation bits per character (bound; AR: exact)")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        figure.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(figure, dpi=120)
        lines += ["", f"![BPC against training tokens]({figure.as_posix().split('docs/')[-1]})"]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", choices=sorted(VARIANTS))
    ap.add_argument("--out", default="benchmarks/results/quality_budget.json")
    ap.add_argument("--runs", default="runs/bench/quality_budget", help="run directories (checkpoints, state)")
    ap.add_argument("--text8", default="../shared/data/text8/text8_prefix.txt.gz")
    ap.add_argument("--cpu-hours", type=float, default=1.0)
    ap.add_argument("--chunk-steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--ema", type=float, default=0.999)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--curve-seqs", type=int, default=64)
    ap.add_argument("--eval-seqs", type=int, default=256)
    ap.add_argument("--eval-batch", type=int, default=64)
    ap.add_argument("--num-t", type=int, default=8)
    ap.add_argument("--eval-seed", type=int, default=1234)
    ap.add_argument("--figure", default="docs/img/quality_budget.png")
    ap.add_argument("--report", action="store_true", help="print the table of --out (and write --figure)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    if args.report:
        print(report(json.loads(out.read_text()), Path(args.figure) if args.figure else None))
        return
    if args.variant is None:
        ap.error("--variant is required unless --report")
    torch.set_num_threads(1)
    state = run(args)
    results = json.loads(out.read_text()) if out.exists() else {}
    results["meta"] = {"command": " ".join([os.path.basename(sys.executable), *sys.argv]), "torch": torch.__version__,
                       "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores (shared)",
                       "args": {k: v for k, v in vars(args).items() if k != "variant"}}
    results.setdefault("runs", {})[run_key(args.variant, args.seed)] = dict(state)  # per-sequence test values kept: paired comparisons
    out.parent.mkdir(parents=True, exist_ok=True)
    _atomic_json(out, results)
    print(f"[{run_key(args.variant, args.seed)}] done: {state['test']}", flush=True)


if __name__ == "__main__":
    main()
