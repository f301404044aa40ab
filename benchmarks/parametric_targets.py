"""Parametric targets vs the data target: does a student converge faster against q^i ∝ p_1(·|x^{≠i}) k_t? (MATH.md §4)

Paper claim (sec. 4.2): training the diffusion student against the exact N^1 target built from a model of clean
data (BERT-style MLM, AR marginalisation, Hollow transformer) converges faster than against the observed token.

Protocol, all on text8-prefix (the first 12.5M characters of text8, 90/5/5; never "text8"), CPU only:

1. Train the three clean-data teachers with the project's Trainer (`objective.name=clean_lm`): masked LM, causal
   LM, Hollow transformer; record their wall-clock cost and validation NLL (exact NLL for the AR model, the
   pseudo-NLL −(1/L) Σ_i log p(x^i | x^{≠i}) for all three — the quantity a parametric target uses).
2. Fix a pool of P training chunks. Teacher conditionals depend on x_1 only, so each teacher scores the pool once
   (`ParametricTarget` cache); the time per sequence is the teacher's target cost.
3. Train one student per target for the same number of steps, from the same initial weights, with the same batch
   order (indices into the pool): the data target (Monte Carlo), each parametric target (soft cross-entropy =
   L_distrib with KL), and the data target on the whole training split ("data (stream)", no pool) as the
   reference for what a finite pool costs. Masked source, linear schedule, κ_t weighting.
4. Every `--eval-every` steps: validation BPC (masked NELBO, MATH.md §2.2) of each student on the same sequences
   with the same Monte Carlo draws (paired comparison).

    nice -n 10 .venv/bin/python benchmarks/parametric_targets.py --work-dir runs/parametric-bench \
        --out benchmarks/results/parametric_targets.json --plot docs/parametric_bpc.png
    # more student seeds (teachers and the pool's targets are reused from --work-dir):
    nice -n 10 .venv/bin/python benchmarks/parametric_targets.py --work-dir runs/parametric-bench --seed 1 \
        --out benchmarks/results/parametric_targets_seed1.json --plot ""
    .venv/bin/python benchmarks/parametric_targets.py combine benchmarks/results/parametric_targets*.json \
        --plot docs/parametric_bpc.png
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch

TEXT8 = "../shared/data/text8/text8_prefix.txt.gz"
TARGETS = ("data", "data-stream", "hollow", "mlm", "ar-exact", "ar-taylor", "ar-topk")
LABELS = {
    "data": "data (pool)",
    "data-stream": "data (stream)",
    "hollow": "Hollow",
    "mlm": "BERT/MLM",
    "ar-exact": "AR exact",
    "ar-taylor": "AR Taylor",
    "ar-topk": "AR top-k",
}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def teacher_config(family: str, a) -> dict:
    return {
        "description": f"parametric-target benchmark teacher ({family})",
        "data": {"kind": "text8", "split": "prefix", "path": TEXT8, "seq_len": a.seq_len},
        "model": {
            "name": family, "preset": "small", "d_model": a.d_model, "n_layers": a.n_layers, "n_heads": a.n_heads,
            "max_len": a.seq_len, "n_mix_layers": 1,
        },
        "objective": {"name": "clean_lm", "mask_rate": 0.15},
        "optim": {"lr": a.lr, "warmup": 50, "decay": "cosine", "min_lr_ratio": 0.1},
        "train": {
            "steps": a.teacher_steps, "batch_size": a.batch_size, "seed": a.teacher_seed, "precision": "fp32",
            "device": "cpu", "ema": 0.99, "log_every": 50, "eval_every": 0, "eval_examples": a.teacher_eval_seqs,
            "sample_every": 0, "save_every": 0, "progress": False, "tensorboard": False, "threads": a.threads,
        },
        "eval": {"batch_size": 8},
        "sample": {"num": 0},
    }  # fmt: skip


def train_teacher(family: str, a, work: Path) -> dict:
    from tcsm.builders.config import load_config
    from tcsm.train.trainer import Trainer

    run = work / f"teacher-{family}"
    info_file = run / "bench.json"
    if info_file.is_file():
        log(f"reusing teacher {run}")
        return json.loads(info_file.read_text())
    t0 = time.perf_counter()
    summary = Trainer.from_config(load_config(base=teacher_config(family, a)), run, log=lambda s: log(f"  {family}: {s}")
    ).fit()
    wall = time.perf_counter() - t0
    info = {"dir": str(run), "train_wall_s": wall, "train_loop_s": summary["elapsed_s"], "summary": summary}
    info_file.write_text(json.dumps(info, indent=1))
    log(f"teacher {family}: {summary['bound']} {summary['bpc']:.4f} bpc, {wall:.0f}s")
    return info


def make_schedule(step: int, total: int, warmup: int = 50, floor: float = 0.1) -> float:
    if step < warmup:
        return (step + 1) / warmup
    p = (step - warmup) / max(1, total - warmup)
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))


def train_student(name: str, objective, train_data, pool_idx, valid, path, a) -> dict:
    """One student run: same init and batch order for every target; returns its BPC curve and timing."""
    from tcsm.evaluation.likelihood import evaluate_bound
    from tcsm.models import build_denoiser

    torch.manual_seed(a.seed)
    model = build_denoiser(
        "tiny", vocab_size=path.vocab_size, num_states=path.num_states, time_conditioning=False,
        d_model=a.d_model, n_layers=a.n_layers, n_heads=a.n_heads, max_len=a.seq_len,
    )  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.99), weight_decay=0.0)
    order = torch.Generator().manual_seed(a.seed + 1)
    curve, train_s, last = [], 0.0, []

    def evaluate(step: int) -> None:
        model.eval()
        g = torch.Generator().manual_seed(1234)  # same t and masks for every student: paired comparison
        r = evaluate_bound(model, valid, path, batch_size=64, num_t=a.eval_num_t, generator=g)
        model.train()
        curve.append({"step": step, "bpc": r["bpc"], "bpc_stderr": r["bpc_stderr"], "train_s": train_s})
        tl = sum(last) / len(last) if last else float("nan")
        log(
            f"  {name:12s} step {step:5d}  valid {r['bpc']:.4f} ± {r['bpc_stderr']:.4f} bpc  train loss {tl:.4f}"
        )
        last.clear()

    evaluate(0)
    for step in range(a.student_steps):
        if pool_idx is None:  # the whole training split
            idx = torch.randint(0, train_data.shape[0], (a.batch_size,), generator=order)
        else:
            idx = pool_idx[torch.randint(0, len(pool_idx), (a.batch_size,), generator=order)]
        x1 = train_data[idx].long()
        t0 = time.perf_counter()
        for group in opt.param_groups:
            group["lr"] = a.lr * make_schedule(step, a.student_steps)
        g = torch.Generator().manual_seed(10_000 + step)
        loss, metrics = objective(model, x1, g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        train_s += time.perf_counter() - t0
        last.append(metrics["loss"])
        if (step + 1) % a.eval_every == 0 or step + 1 == a.student_steps:
            evaluate(step + 1)
    return {"curve": curve, "train_s": train_s}


def teacher_quality(teachers: dict, valid_small) -> dict:
    """Pseudo-NLL of each teacher's conditionals on held-out chunks and its cost; for the approximate AR
    estimators also their distance to the exact AR conditional: total variation, KL(approx ‖ exact) and the
    exact probability mass that top-k leaves out (its truncation bias, MATH.md §8 item 19)."""
    out, exact = {}, None
    x = valid_small.long()
    for name, teacher in teachers.items():
        t0 = time.perf_counter()
        logq = teacher(x)
        dt = (time.perf_counter() - t0) / x.shape[0]
        nll = float(-logq.gather(-1, x.unsqueeze(-1)).mean())
        out[name] = {"pseudo_nll_bpc": nll / math.log(2), "target_s_per_seq": dt}
        if name == "ar-exact":
            exact = logq
    if exact is not None:
        p = exact.exp()
        for name in ("ar-taylor", "ar-topk"):
            if name in teachers:
                logq = teachers[name](x)
                q = logq.exp()
                out[name]["tv_to_exact"] = float(0.5 * (q - p).abs().sum(-1).mean())
                kl = torch.where(q > 0, q * (logq - exact), torch.zeros_like(q)).sum(-1).mean()
                out[name]["kl_to_exact_nats"] = float(kl)
                out[name]["exact_mass_dropped"] = float(torch.where(q > 0, 0.0, p).sum(-1).mean())
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work-dir", default="runs/parametric-bench")
    p.add_argument("--out", default="benchmarks/results/parametric_targets.json")
    p.add_argument("--plot", default="docs/parametric_bpc.png")
    p.add_argument("--targets", default=",".join(TARGETS))
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--d-model", type=int, default=96)
    p.add_argument("--n-layers", type=int, default=2)
    p.add_argument("--n-heads", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--teacher-steps", type=int, default=800)
    p.add_argument("--teacher-eval-seqs", type=int, default=128)
    p.add_argument("--student-steps", type=int, default=600)
    p.add_argument("--pool", type=int, default=768, help="training chunks the pool-based students draw from")
    p.add_argument("--topk", type=int, default=4)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("--eval-seqs", type=int, default=256)
    p.add_argument("--eval-num-t", type=int, default=4)
    p.add_argument("--quality-seqs", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="student init and batch order")
    p.add_argument("--teacher-seed", type=int, default=0)
    p.add_argument("--pool-seed", type=int, default=0, help="which training chunks form the pool")
    p.add_argument(
        "--quality-only", action="store_true", help="recompute teacher_quality into an existing --out"
    )
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    targets = [t for t in a.targets.split(",") if t]
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown:
        raise SystemExit(f"unknown targets {unknown}; choose from {TARGETS}")

    from tcsm.builders.targets import load_teacher
    from tcsm.data import build_data
    from tcsm.objectives import Objective
    from tcsm.paths import MaskedPath
    from tcsm.targets import DataTarget
    from tcsm.targets.parametric import ParametricTarget

    work = Path(a.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    data = build_data({"kind": "text8", "split": "prefix", "path": TEXT8, "seq_len": a.seq_len})
    V = data.vocab_size
    path = MaskedPath(V)
    valid = data.valid[: a.eval_seqs].long()
    log(f"{data.summary()}")

    # 1. teachers
    need = {
        "mlm": "mlm",
        "hollow": "hollow",
        "ar-exact": "causal",
        "ar-taylor": "causal",
        "ar-topk": "causal",
    }
    families = sorted({need[t] for t in targets if t in need})
    teacher_info = {f: train_teacher(f, a, work) for f in families}
    opts = {"ar-exact": {"estimator": "exact"}, "ar-taylor": {"estimator": "taylor"},
            "ar-topk": {"estimator": "topk", "k": a.topk}}  # fmt: skip
    teachers = {
        t: load_teacher(teacher_info[need[t]]["dir"], "cpu", vocab_size=V, **opts.get(t, {}))
        for t in targets
        if t in need
    }
    quality = teacher_quality(teachers, data.valid[: a.quality_seqs].long())
    for t, q in quality.items():
        log(f"teacher {t}: pseudo-NLL {q['pseudo_nll_bpc']:.4f} bpc, {q['target_s_per_seq'] * 1e3:.1f} ms/seq"
            + (f", TV to exact {q['tv_to_exact']:.3f}" if "tv_to_exact" in q else ""))  # fmt: skip
    if a.quality_only:
        result = json.loads(Path(a.out).read_text())
        result["teacher_quality"] = quality
        Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
        log(f"updated teacher_quality in {a.out}")
        return

    # 2. the pool and the teachers' targets on it
    perm = torch.randperm(data.train.shape[0], generator=torch.Generator().manual_seed(a.pool_seed))
    pool_idx = perm[: a.pool]
    pool = data.train[pool_idx].long()
    objectives, precompute = {}, {}
    for t in targets:
        if t in ("data", "data-stream"):
            objectives[t] = Objective(path, DataTarget(), loss="distrib")
            continue
        target = ParametricTarget(teachers[t], cache_size=a.pool)
        # Teacher conditionals of the pool are kept on disk, so further student seeds skip the teacher cost.
        stored = work / f"pool-{t}-seed{a.pool_seed}-n{a.pool}-L{a.seq_len}.pt"
        if stored.is_file():
            saved = torch.load(stored)
            target.prime(pool, saved["log_p1_cond"])
            precompute[t] = saved["seconds"]
            log(f"target {t}: loaded the pool's conditionals (scored in {precompute[t]:.1f}s originally)")
        else:
            t0 = time.perf_counter()
            vals = torch.cat([target.conditionals(chunk) for chunk in pool.split(64)])
            precompute[t] = time.perf_counter() - t0
            torch.save({"log_p1_cond": vals, "seconds": precompute[t]}, stored)
            log(f"target {t}: scored the pool of {a.pool} in {precompute[t]:.1f}s")
        objectives[t] = Objective(path, target, loss="distrib")

    # 3. students
    runs = {}
    for t in targets:
        log(f"student against {LABELS[t]}")
        runs[t] = train_student(
            t, objectives[t], data.train, None if t == "data-stream" else pool_idx, valid, path, a
        )

    result = {
        "benchmark": "parametric targets vs data target (MATH.md §4)",
        "data": "text8-prefix",
        "machine": f"{platform.machine()} CPU, torch {torch.__version__}, {a.threads} thread(s)",
        "args": vars(a),
        "teachers": {f: {k: v for k, v in i.items() if k != "dir"} for f, i in teacher_info.items()},
        "teacher_quality": quality,
        "pool_precompute_s": precompute,
        "students": runs,
        "total_wall_s": time.perf_counter() - t_start,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {a.out} (total {result['total_wall_s'] / 60:.1f} min)")
    if a.plot:
        plot(result, a.plot)
    print(table(result))


def plot(result: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for t, run in result["students"].items():
        c = run["curve"][1:]  # step 0 is the untrained model (log V for every run)
        style = "--" if t.startswith("data") else "-"
        ax.plot([r["step"] for r in c], [r["bpc"] for r in c], style, marker=".", label=LABELS[t])
    a = result["args"]
    ax.set_xlabel("student step")
    ax.set_ylabel("validation BPC (masked NELBO)")
    ax.set_title(f"text8-prefix, L={a['seq_len']}, pool {a['pool']} chunks: student vs target", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    log(f"wrote {out}")


def table(result: dict) -> str:
    a = result["args"]
    steps = sorted({r["step"] for run in result["students"].values() for r in run["curve"]})
    marks = [s for s in steps if s in (100, 200, 300, 400)] + [steps[-1]]
    marks = sorted(set(marks))
    ref = result["students"].get("data", {}).get("curve")
    ref_final = ref[-1]["bpc"] if ref else None
    head = (
        "| target | "
        + " | ".join(f"BPC @ {s}" for s in marks)
        + " | best | steps to data's final | target cost |"
    )
    lines = [head, "|" + "---|" * (len(marks) + 4)]
    pre = result["pool_precompute_s"]
    for t, run in result["students"].items():
        by = {r["step"]: r for r in run["curve"]}
        best = min(r["bpc"] for r in run["curve"])
        reach = next(
            (r["step"] for r in run["curve"][1:] if ref_final is not None and r["bpc"] <= ref_final), None
        )
        cost = "—" if t not in pre else f"{1e3 * pre[t] / a['pool']:.0f} ms/seq"
        cells = [f"{by[s]['bpc']:.3f}" if s in by else "" for s in marks]
        lines.append(f"| {LABELS[t]} | " + " | ".join(cells) + f" | {best:.3f} | {reach or '—'} | {cost} |")
    return "\n".join(lines)


def combine(files: list[str], out_plot: str | None) -> str:
    """Seeds side by side: per-seed BPC at the end, the mean paired difference to the data (pool) student (same
    seed) at half-way and at the end with its standard error over seeds, and (optionally) a plot of every seed's
    curve with the mean in bold."""
    results = [json.loads(Path(f).read_text()) for f in files]
    names = [t for t in TARGETS if any(t in r["students"] for r in results)]
    seeds = sorted({r["args"]["seed"] for r in results})
    last = results[0]["students"]["data"]["curve"][-1]["step"]
    marks = (last // 2, last)

    def at(t: str, step: int) -> dict:
        return {
            r["args"]["seed"]: next(p["bpc"] for p in r["students"][t]["curve"] if p["step"] == step)
            for r in results
            if t in r["students"]
        }

    def delta(t: str, step: int) -> str:
        vals, ref = at(t, step), at("data", step)
        diffs = [vals[s] - ref[s] for s in vals if s in ref]
        if t == "data" or len(diffs) < 2:
            return "—"
        m = sum(diffs) / len(diffs)
        se = math.sqrt(sum((d - m) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs))
        return f"{m:+.3f} ± {se:.3f}"

    lines = [
        "| target | " + " | ".join(f"seed {s} @ {last}" for s in seeds) + f" | mean @ {last} | "
        + " | ".join(f"Δ vs data (pool) @ {m}" for m in marks) + " |",
        "|" + "---|" * (len(seeds) + 2 + len(marks)),
    ]  # fmt: skip
    for t in names:
        vals = at(t, last)
        cells = [f"{vals[s]:.3f}" if s in vals else "—" for s in seeds]
        mean = sum(vals.values()) / len(vals)
        lines.append(
            f"| {LABELS[t]} | "
            + " | ".join(cells)
            + f" | {mean:.3f} | "
            + " | ".join(delta(t, m) for m in marks)
            + " |"
        )
    if out_plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for k, t in enumerate(names):
            curves = [r["students"][t]["curve"][1:] for r in results if t in r["students"]]
            color = f"C{k}"
            for c in curves:
                ax.plot([p["step"] for p in c], [p["bpc"] for p in c], color=color, alpha=0.25, lw=0.8)
            steps = [p["step"] for p in curves[0]]
            mean = [sum(c[j]["bpc"] for c in curves) / len(curves) for j in range(len(steps))]
            style = "--" if t.startswith("data") else "-"
            ax.plot(steps, mean, style, color=color, lw=2, label=f"{LABELS[t]} (mean of {len(curves)})")
        a = results[0]["args"]
        ax.set_xlabel("student step")
        ax.set_ylabel("validation BPC (masked NELBO)")
        ax.set_title(
            f"text8-prefix, L={a['seq_len']}, pool {a['pool']} chunks, seeds {seeds}: student vs target",
            fontsize=10,
        )
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_plot, dpi=120)
        log(f"wrote {out_plot}")
    return "\n".join(lines)


if __name__ == "__main__":
    import sys

    if len(sys.argv) > 1 and sys.argv[1] == "combine":  # combine RESULT.json ... [--plot PNG]
        argv = sys.argv[2:]
        png = argv[argv.index("--plot") + 1] if "--plot" in argv else None
        files = [f for i, f in enumerate(argv) if f != "--plot" and (i == 0 or argv[i - 1] != "--plot")]
        print(combine(files, png))
    else:
        main()
