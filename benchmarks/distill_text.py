"""AR → diffusion distillation on TinyStories (paper App. F, MATH.md §5.4), scaled down for a shared CPU.

Question: does a diffusion student distilled from an autoregressive teacher learn faster, at equal student
steps, than the same student trained on data alone — and do its samples look likely to the teacher at few
sampling steps? What runs, all through the library (`tcsm.recipes.distill.compose`, the Trainer):

1. Data: the first 2 MiB of TinyStories train (../shared/data/tinystories), a byte-level BPE trained on its
   first 95% (`--vocab` tokens), stories joined with EOS, `--seq-len`-token chunks; the last 5% is held out.
2. Teacher: a causal transformer (`model.name=causal`, `objective.name=clean_lm`) trained here; its size,
   training wall/CPU time and held-out NLL are recorded.
3. Students of one size (masked-source denoiser, L_distrib with κ_t weighting, same initial weights, same
   batches, same seed), `--student-steps` steps each, trained *interleaved*: every round runs `--eval-every`
   steps of each student in turn (rotating the order), timing wall and CPU, then the validation bound of each.
   Targets: (a) data alone; (b) Top-K, K = 8 and 32; (c) Top-K + right-context 3-gram (K = K' = 8);
   (d) first-order Taylor; (e) Top-K (K = 8) on teacher samples only — no training data read at all.
4. After training: gen-PPL under the teacher and unigram sample entropy of `--num-samples` samples per
   sampling-step count; the teacher's own samples and the held-out text as references; the teacher mass each
   estimator's candidate sets miss (and TV to the exact conditional) on `--audit-seqs` held-out sequences,
   against the exact marginal; teacher sequence scores per student step, against (V−1)L+1 and L(K+1).

Re-running continues where it stopped (teacher, student checkpoints and finished rounds are reused).

    nohup nice -n 10 .venv/bin/python benchmarks/distill_text.py --work runs/distill_text \\
        --out benchmarks/results/distill_text.json --plot docs/distill_text.png > runs/distill_text.log 2>&1 &
    .venv/bin/python benchmarks/distill_text.py --out benchmarks/results/distill_text.json --report
    .venv/bin/python benchmarks/distill_text.py --tiny --work /tmp/distill_tiny --out /tmp/distill_tiny.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "tinystories" / "train_head_2MiB.txt.gz"

#: student name → (label, overrides of the distill preset)
STUDENTS = {
    "data": ("(a) data alone", ["target.name=data"]),
    "topk8": ("(b) Top-K, K=8", ["target.estimator=topk", "target.k=8"]),
    "topk32": ("(b) Top-K, K=32", ["target.estimator=topk", "target.k=32"]),
    "topk_ngram8": ("(c) Top-K + 3-gram, K=K'=8", ["target.estimator=topk_ngram", "target.k=8", "target.ngram_k=8", "target.ngram_order=3"]),
    "taylor": ("(d) Taylor", ["target.estimator=taylor"]),
    "teacher_samples": ("(e) teacher samples, Top-K=8, no data", ["target.proposal=teacher", "target.estimator=topk", "target.k=8"]),
}  # fmt: skip


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


# --------------------------------------------------------------------------------------------------- configs


def data_section(a) -> dict:
    return {
        "kind": "bpe", "path": str(DATA), "tokenizer": "train", "vocab_size": a.vocab, "seq_len": a.seq_len,
        "doc_separator": "<|endoftext|>", "valid_frac": 0.05, "test_frac": 0.0,
        "name": f"tinystories-2MiB-bpe{a.vocab}",
    }  # fmt: skip


def common_train(a, steps: int, batch: int) -> list[str]:
    return [
        f"train.steps={steps}", f"train.batch_size={batch}", f"train.seed={a.seed}", "train.precision=fp32",
        "train.device=cpu", f"train.threads={a.threads}", "train.eval_every=0", "train.sample_every=0",
        "train.progress=false", "train.tensorboard=false", "train.log_every=1000000", "train.keep_last=2",
        f"train.eval_examples={a.eval_seqs}", f"eval.num_t={a.num_t}", "eval.batch_size=64", "sample.num=0",
    ]  # fmt: skip


def teacher_config(a):
    from tcsm.builders.config import load_config

    over = [
        "model.name=causal", "model.preset=small", f"model.d_model={a.teacher_width}", f"model.n_layers={a.teacher_layers}",
        "model.n_heads=4", f"model.max_len={a.seq_len}", "objective.name=clean_lm",
        "optim.lr=2e-3", "optim.warmup=100", "optim.decay=cosine", "optim.min_lr_ratio=0.1", "train.ema=0.995",
        "train.save_every=0", *common_train(a, a.teacher_steps, a.teacher_batch),
    ]  # fmt: skip
    return load_config(None, over, base={"data": data_section(a)})


def student_config(a, name: str, teacher_dir: Path):
    from tcsm.recipes.distill.compose import distill_config

    over = [
        "model.preset=tiny", f"model.d_model={a.student_width}", f"model.n_layers={a.student_layers}", "model.n_heads=4",
        "model.cond_dim=32", f"model.max_len={a.seq_len}", "model.time_conditioning=false",
        f"optim.lr={a.student_lr}", "optim.warmup=50", "optim.decay=cosine", "optim.min_lr_ratio=0.1", "train.ema=0.99",
        "train.save_every=0", *common_train(a, a.student_steps, a.batch), *STUDENTS[name][1],
    ]  # fmt: skip
    return distill_config(teacher_dir, "distill", over)


# --------------------------------------------------------------------------------------------------- phases


def train_teacher(a, work: Path, results: dict) -> Path:
    from tcsm.models import count_parameters
    from tcsm.train.fit import fit

    run = work / "teacher"
    if "teacher" not in results:
        log(f"training the teacher ({a.teacher_steps} steps × {a.teacher_batch})")
        w0, c0 = clock()
        summary = fit(teacher_config(a), run, resume=True if (run / "checkpoints").exists() else None, log=log)
        w1, c1 = clock()
        from tcsm.builders.loading import load_checkpoint

        ck = load_checkpoint(run)
        results["teacher"] = {
            "params": count_parameters(ck.model), "d_model": a.teacher_width, "n_layers": a.teacher_layers,
            "steps": a.teacher_steps, "batch": a.teacher_batch, "wall_s": w1 - w0, "cpu_s": c1 - c0,
            "valid_nll_nats_per_token": summary.get("nats_per_token"), "valid_ppl": summary.get("perplexity"),
            "valid_bits_per_token": summary.get("bpc"), "loadavg": os.getloadavg(),
        }  # fmt: skip
        log(f"teacher: {results['teacher']}")
    return run


class Timer:
    """Wraps a teacher's estimate / sample calls to add their wall and CPU time to a running total."""

    def __init__(self, teacher):
        self.wall = self.cpu = 0.0
        for name in ("estimate", "sample"):
            setattr(teacher, name, self._wrap(getattr(teacher, name)))

    def _wrap(self, fn):
        def timed(*args, **kwargs):
            w0, c0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                w1, c1 = clock()
                self.wall += w1 - w0
                self.cpu += c1 - c0

        return timed


def make_trainers(a, names, teacher_dir: Path, work: Path) -> dict:
    from tcsm.core.protocols import StepInfo
    from tcsm.train.trainer import Trainer

    trainers = {}
    for name in names:
        run = work / f"student-{name}-seed{a.seed}"
        resume = True if (run / "checkpoints").exists() else None
        trainer = Trainer.from_config(student_config(a, name, teacher_dir), run, resume=resume, log=log)
        target = trainer.objective.target
        timer = Timer(target.teacher) if hasattr(target, "teacher") else None
        for cb in trainer.callbacks:  # what Trainer.fit does first (the n-gram is counted or loaded here)
            cb.on_fit_start(StepInfo(trainer.step, trainer.model, trainer.ema.model if trainer.ema else None, run))
        trainers[name] = (trainer, timer)
    return trainers


def run_rounds(a, trainers: dict, results: dict, save) -> None:
    """Interleaved training: each round runs `eval_every` steps of every student (order rotated), then
    validates each; wall/CPU time and the target metrics of the round are recorded per student."""
    rec = results.setdefault("students", {})
    names = list(trainers)
    r = 0
    while True:
        todo = [n for n in names if trainers[n][0].step < a.student_steps]
        if not todo:
            break
        order = todo[r % len(todo):] + todo[: r % len(todo)]
        for name in order:
            trainer, timer = trainers[name]
            n_steps = min(a.eval_every, a.student_steps - trainer.step)
            t_wall0, t_cpu0 = (timer.wall, timer.cpu) if timer else (0.0, 0.0)
            load0 = os.getloadavg()[0]
            sums: dict[str, float] = {}
            w0, c0 = clock()
            for _ in range(n_steps):
                for k, v in trainer.train_step().items():
                    if k.startswith("target/") or k == "loss":
                        sums[k] = sums.get(k, 0.0) + float(v)
            w1, c1 = clock()
            bound = trainer.validate(max_examples=a.eval_seqs)
            trainer.save()
            entry = rec.setdefault(name, {"label": STUDENTS[name][0], "rounds": []})
            entry["rounds"].append({
                "step": trainer.step, "steps": n_steps, "wall_s": w1 - w0, "cpu_s": c1 - c0,
                "teacher_wall_s": (timer.wall - t_wall0) if timer else 0.0,
                "teacher_cpu_s": (timer.cpu - t_cpu0) if timer else 0.0,
                "loadavg": [load0, os.getloadavg()[0]],
                "valid_bits_per_token": bound["bpc"], "valid_bpc_stderr": bound["bpc_stderr"],
                **{k: v / n_steps for k, v in sums.items()},
            })  # fmt: skip
            log(f"{name} step {trainer.step}: valid {bound['bpc']:.4f} bits/token, {w1 - w0:.1f} s wall "
                f"({(timer.wall - t_wall0) if timer else 0.0:.1f} s teacher), "
                f"{sums.get('target/seq_scores', 0.0) / n_steps:.1f} sequence scores/sequence")  # fmt: skip
            save()
        r += 1


def final_reports(a, names, teacher_dir: Path, work: Path, results: dict, save) -> None:
    from tcsm.recipes.distill.compose import distill_report

    steps = [int(s) for s in a.sample_steps.split(",")]
    for name in names:
        entry = results["students"][name]
        if "samples" in entry:
            continue
        run = work / f"student-{name}-seed{a.seed}"
        w0 = time.perf_counter()
        rep = distill_report(run, a.num_samples, steps, seed=a.seed, teacher=str(teacher_dir))
        entry["samples"] = rep["steps"]
        results["teacher_samples"] = rep["teacher"]
        log(f"{name}: " + ", ".join(f"{k} steps gen-PPL {v['gen_ppl']:.1f} H {v['entropy']:.2f}" for k, v in rep["steps"].items())
            + f" ({time.perf_counter() - w0:.0f} s)")  # fmt: skip
        save()


@torch.no_grad()
def audits(a, teacher_dir: Path, results: dict, save) -> None:
    """Missed teacher mass and TV to the exact conditional of each estimator on held-out sequences, the
    per-sequence costs, and the held-out text's own gen-PPL / entropy under the teacher."""
    if "audit" in results:
        return
    from tcsm.builders.loading import load_checkpoint
    from tcsm.evaluation.genppl import sample_entropy
    from tcsm.posttrain.distill.ngram import RightContextNgram
    from tcsm.recipes.distill.builder import inspect_teacher, load_distill_teacher
    from tcsm.recipes.distill.compose import teacher_nll
    from tcsm.targets.ar import (
        ExactARScore,
        TaylorARScore,
        TopKARScore,
        TopKNgramARScore,
        missed_mass,
        total_variation,
    )

    ck = load_checkpoint(teacher_dir)
    data = ck.build_data()
    V, L = data.vocab_size, data.seq_len
    teacher = load_distill_teacher(inspect_teacher(teacher_dir), "cpu", vocab_size=V)
    x = data.get_batch("valid", torch.arange(a.audit_seqs))
    w0, c0 = clock()
    exact = ExactARScore().estimate(teacher, x)
    w1, c1 = clock()
    exact_cond = torch.log_softmax(exact.ell, -1)
    ngram = RightContextNgram.fit(data.train, 3, V)
    out = {"sequences": a.audit_seqs, "exact": {"seq_scores": float(exact.seq_scores.mean()),
           "token_evals": float(exact.token_evals.mean()), "wall_s_per_seq": (w1 - w0) / a.audit_seqs,
           "cpu_s_per_seq": (c1 - c0) / a.audit_seqs, "nominal": (V - 1) * L + 1}}  # fmt: skip
    ests = {
        "topk8": TopKARScore(k=8), "topk32": TopKARScore(k=32),
        "topk_ngram8": TopKNgramARScore(k=8, ngram=ngram, ngram_k=8), "ngram8_only": None, "taylor": TaylorARScore(),
    }  # fmt: skip
    for name, est in ests.items():
        if est is None:  # the n-gram's candidates on their own (plus x^i): what it adds
            g = ngram.topk(x, 8)
            inside = torch.zeros(x.shape + (V,), dtype=torch.bool)
            inside.scatter_(-1, g.clamp_min(0), g >= 0)
            inside.scatter_(-1, x.unsqueeze(-1), True)
            ell = torch.where(inside, exact.ell, torch.full_like(exact.ell, -math.inf))
            out[name] = {"missed_mass": float(missed_mass(ell, exact_cond).mean())}
            continue
        w0, c0 = clock()
        e = est.estimate(teacher, x)
        w1, c1 = clock()
        lp = torch.log_softmax(e.ell, -1)
        nominal = {"topk8": L * 9, "topk32": L * 33, "topk_ngram8": L * 17, "taylor": 3}[name]
        out[name] = {
            "missed_mass": float(missed_mass(e.ell, exact_cond).mean()),
            "tv_to_exact": float(total_variation(lp, exact_cond).mean()),
            "candidates": float(torch.isfinite(e.ell).sum(-1).float().mean()),
            "seq_scores": float(e.seq_scores.mean()), "token_evals": float(e.token_evals.mean()),
            "paper_nominal": nominal, "wall_s_per_seq": (w1 - w0) / a.audit_seqs, "cpu_s_per_seq": (c1 - c0) / a.audit_seqs,
        }  # fmt: skip
        log(f"audit {name}: {out[name]}")
    held = data.valid[: a.num_samples].long()
    nll = teacher_nll(teacher, held)
    out["heldout_text"] = {"gen_ppl": math.exp(float(nll.mean())), "entropy": sample_entropy(held)["entropy_mean"]}
    results["audit"] = out
    save()


@torch.no_grad()
def paired_bounds(a, names, work: Path, results: dict, save) -> None:
    """Each student's final (EMA) model on the same `--paired-seqs` held-out sequences and the same (t, x_t) draws,
    `--paired-t` per sequence: the valid bound with its standard error, and every student's per-sequence difference
    to the data-alone student with the standard error of that paired difference (far below the bounds' own
    standard errors, which are mostly the spread between sequences)."""
    if "paired" in results or "data" not in names:
        return
    from tcsm.builders.loading import load_checkpoint
    from tcsm.evaluation.likelihood import nelbo

    per = {}
    for name in names:
        ck = load_checkpoint(work / f"student-{name}-seed{a.seed}")
        data, path = ck.build_data(), ck.build_path()
        x = data.split("valid")[: a.paired_seqs].long()
        g = torch.Generator().manual_seed(a.seed + 7)  # the same draws for every student
        per[name] = torch.cat([nelbo(ck.model, x[s : s + 64], path, num_t=a.paired_t, generator=g) / x.shape[1]
                               for s in range(0, x.shape[0], 64)]).double() / math.log(2)  # fmt: skip
    out = {"sequences": int(per["data"].numel()), "num_t": a.paired_t, "step": a.student_steps, "students": {}}
    n = per["data"].numel()
    for name, v in per.items():
        d = v - per["data"]
        out["students"][name] = {
            "bpc": float(v.mean()), "bpc_stderr": float(v.std() / math.sqrt(n)),
            "delta_vs_data": float(d.mean()), "delta_stderr": float(d.std() / math.sqrt(n)) if name != "data" else 0.0,
        }  # fmt: skip
        log(f"paired {name}: {out['students'][name]}")
    results["paired"] = out
    save()


# --------------------------------------------------------------------------------------------------- report


def report(results: dict) -> str:
    lines = []
    t = results.get("teacher", {})
    if t:
        lines.append(f"teacher: {t['params'] / 1e6:.2f}M parameters, {t['steps']} steps × {t['batch']}, "
                     f"{t['wall_s']:.0f} s wall / {t['cpu_s']:.0f} s CPU, held-out {t['valid_bits_per_token']:.3f} "
                     f"bits/token (PPL {t['valid_ppl']:.1f})")  # fmt: skip
    studs = results.get("students", {})
    steps = sorted({r["step"] for s in studs.values() for r in s["rounds"]})
    if studs:
        lines += ["", "| student | " + " | ".join(f"bound @{s}" for s in steps) + " | wall s | CPU s | teacher CPU s | seq scores / step |",
                  "|---|" + "---|" * (len(steps) + 4)]  # fmt: skip
        for name, s in studs.items():
            by = {r["step"]: r for r in s["rounds"]}
            cells = [f"{by[k]['valid_bits_per_token']:.3f}" if k in by else "–" for k in steps]
            wall = sum(r["wall_s"] for r in s["rounds"])
            cpu = sum(r["cpu_s"] for r in s["rounds"])
            tcpu = sum(r["teacher_cpu_s"] for r in s["rounds"])
            n = sum(r["steps"] for r in s["rounds"])
            seqs = sum(r.get("target/seq_scores", 0.0) * r["steps"] for r in s["rounds"]) / max(1, n) * results["args"]["batch"]
            lines.append(f"| {s['label']} | " + " | ".join(cells) + f" | {wall:.0f} | {cpu:.0f} | {tcpu:.0f} | {seqs:.0f} |")
    if any("samples" in s for s in studs.values()):
        ks = sorted({int(k) for s in studs.values() for k in s.get("samples", {})})
        lines += ["", "| student | " + " | ".join(f"gen-PPL / H @{k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
        for s in studs.values():
            sm = {int(k): v for k, v in s.get("samples", {}).items()}
            lines.append(f"| {s['label']} | " + " | ".join(f"{sm[k]['gen_ppl']:.1f} / {sm[k]['entropy']:.2f}" if k in sm else "–" for k in ks) + " |")
        ts = results.get("teacher_samples")
        if ts:
            lines.append(f"| teacher's own samples | {ts['gen_ppl']:.1f} / {ts['entropy']:.2f} (ancestral) |")
        held = results.get("audit", {}).get("heldout_text")
        if held:
            lines.append(f"| held-out text | {held['gen_ppl']:.1f} / {held['entropy']:.2f} |")
    pa = results.get("paired")
    if pa:
        lines += ["", (f"Final models on {pa['sequences']} held-out sequences × {pa['num_t']} (t, x_t) draws, the same "
                  "draws for every student (paired):"), "", "| student | valid bound (bits/token) | Δ vs data alone (paired) |",
                  "|---|---|---|"]  # fmt: skip
        for name, e in pa["students"].items():
            delta = "—" if name == "data" else f"{e['delta_vs_data']:+.3f} ± {e['delta_stderr']:.3f}"
            lines.append(f"| {studs.get(name, {}).get('label', name)} | {e['bpc']:.3f} ± {e['bpc_stderr']:.3f} | {delta} |")
    au = results.get("audit")
    if au:
        lines += ["", "| estimator | candidates | missed mass | TV to exact | seq scores / seq (measured) | nominal | CPU s / seq |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        ex = au["exact"]
        lines.append(f"| exact | all | 0 | 0 | {ex['seq_scores']:.0f} | (V−1)L+1 = {ex['nominal']} | {ex['cpu_s_per_seq']:.2f} |")
        for name in ("topk8", "topk32", "topk_ngram8", "taylor"):
            e = au.get(name)
            if e:
                lines.append(f"| {name} | {e['candidates']:.1f} | {e['missed_mass']:.3f} | {e['tv_to_exact']:.3f} | "
                             f"{e['seq_scores']:.1f} | {e['paper_nominal']} | {e['cpu_s_per_seq']:.3f} |")  # fmt: skip
        if "ngram8_only" in au:
            lines.append(f"| 3-gram Top-8 alone (+x^i) | | {au['ngram8_only']['missed_mass']:.3f} | | | | |")
    return "\n".join(lines)


def plot(results: dict, path: str) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    studs = results.get("students", {})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for s in studs.values():
        rs = s["rounds"]
        axes[0].plot([r["step"] for r in rs], [r["valid_bits_per_token"] for r in rs], marker="o", ms=3, label=s["label"])
        sm = sorted((int(k), v) for k, v in s.get("samples", {}).items())
        if sm:
            axes[1].plot([k for k, _ in sm], [v["gen_ppl"] for _, v in sm], marker="o", ms=3, label=s["label"])
            axes[2].plot([k for k, _ in sm], [v["entropy"] for _, v in sm], marker="o", ms=3, label=s["label"])
    for ax, key, name in ((axes[1], "gen_ppl", "teacher's samples"), (axes[2], "entropy", "teacher's samples")):
        ts = results.get("teacher_samples")
        if ts:
            ax.axhline(ts[key], color="k", ls="--", lw=1, label=name)
        held = results.get("audit", {}).get("heldout_text")
        if held:
            ax.axhline(held[key], color="grey", ls=":", lw=1, label="held-out text")
    axes[0].set(xlabel="student steps", ylabel="valid bound (bits/token)", title="held-out masked NELBO")
    axes[1].set(xlabel="sampling steps", ylabel="gen-PPL under the teacher", title="samples judged by the teacher", xscale="log", yscale="log")
    axes[2].set(xlabel="sampling steps", ylabel="unigram entropy (nats)", title="sample entropy", xscale="log", ylim=(0, None))
    ks = sorted({int(k) for s in studs.values() for k in s.get("samples", {})})
    for ax in axes[1:]:  # the sampling-step counts themselves as plain labels, not 2×10^0
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    axes[0].legend(fontsize=7)
    axes[1].legend(fontsize=7)
    a = results["args"]
    fig.suptitle(f"AR → diffusion distillation, TinyStories 2 MiB, BPE {a['vocab']}, L={a['seq_len']}, seed {a['seed']} (scaled down, CPU)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")


# --------------------------------------------------------------------------------------------------- main


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", default="runs/distill_text", help="directory of the teacher and student runs")
    p.add_argument("--out", default="benchmarks/results/distill_text.json", help="results JSON (also the resume state)")
    p.add_argument("--plot", default="", help="figure path (empty: none)")
    p.add_argument("--report", action="store_true", help="print the tables of --out (and draw --plot) and exit")
    p.add_argument("--tiny", action="store_true", help="a smoke-test setting that runs in about a minute")
    p.add_argument("--students", default=",".join(STUDENTS), help=f"comma-separated subset of {list(STUDENTS)}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--teacher-width", type=int, default=128)
    p.add_argument("--teacher-layers", type=int, default=3)
    p.add_argument("--teacher-steps", type=int, default=4000)
    p.add_argument("--teacher-batch", type=int, default=32)
    p.add_argument("--student-width", type=int, default=128)
    p.add_argument("--student-layers", type=int, default=3)
    p.add_argument("--student-steps", type=int, default=800)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--student-lr", type=float, default=3e-3)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-seqs", type=int, default=512)
    p.add_argument("--num-t", type=int, default=4)
    p.add_argument("--sample-steps", default="2,4,8,16,32")
    p.add_argument("--num-samples", type=int, default=256)
    p.add_argument("--audit-seqs", type=int, default=16)
    p.add_argument("--paired-seqs", type=int, default=1024, help="held-out sequences of the paired final comparison")
    p.add_argument("--paired-t", type=int, default=8, help="(t, x_t) draws per sequence in the paired comparison")
    a = p.parse_args(argv)
    if a.tiny:
        a.vocab, a.seq_len, a.teacher_width, a.teacher_layers, a.teacher_steps = 300, 8, 32, 1, 20
        a.student_width, a.student_layers, a.student_steps, a.batch, a.eval_every = 32, 1, 4, 4, 2
        a.eval_seqs, a.num_t, a.sample_steps, a.num_samples, a.audit_seqs = 16, 1, "2,4", 8, 2
        a.paired_seqs, a.paired_t = 16, 1
    return a


def main(argv=None) -> int:
    a = parse(argv)
    out = Path(a.out)
    results = json.loads(out.read_text()) if out.is_file() else {}
    if a.report:
        print(report(results))
        if a.plot:
            plot(results, a.plot)
        return 0
    torch.set_num_threads(a.threads)
    names = [n.strip() for n in a.students.split(",") if n.strip()]
    unknown = sorted(set(names) - set(STUDENTS))
    if unknown:
        raise SystemExit(f"unknown students {unknown}; choose from {list(STUDENTS)}")
    results["args"] = vars(a)
    results.setdefault("machine", {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__})
    results["command"] = "python benchmarks/distill_text.py " + " ".join(os.sys.argv[1:])

    def save():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, out)

    work = Path(a.work)
    teacher_dir = train_teacher(a, work, results)
    save()
    trainers = make_trainers(a, names, teacher_dir, work)
    run_rounds(a, trainers, results, save)
    del trainers
    paired_bounds(a, names, work, results, save)
    audits(a, teacher_dir, results, save)
    final_reports(a, names, teacher_dir, work, results, save)
    print(report(results))
    if a.plot:
        plot(results, a.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
