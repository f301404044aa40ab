"""Preference fine-tuning on TinyStories: pairs from the model's own samples judged by VADER (paper §5.3, scaled down).

What runs (CPU only, everything through the library's Trainer and recipe functions):

1. Pre-training, data and scorer LM: exactly those of benchmarks/reward_text.py (its functions are reused):
   the first 2 MiB of TinyStories, a 1024-token byte-level BPE, 32-token chunks, a 0.86M-parameter masked
   diffusion transformer (2,000 steps) and a causal transformer for gen-PPL (1,200 steps). `--work` may point at
   reward_text.py's working directory to reuse its runs.
2. Pairs without human data (`tcsm.recipes.preference.compose.sample_pairs`, as `tcsm pairs`): `--groups` groups of
   `--group` prompted samples of the pre-trained model, each scored by VADER; the best and the worst of a group
   become chosen / rejected (tied groups are dropped, so the reward-call budget is exactly groups × group).
3. Preference fine-tuning (`tcsm.recipes.preference.compose.preference_config`, as `tcsm finetune preference`) for a sweep
   of β with the paper's BCE loss (β a margin) and of β_DPO with the DPO-style loss, one epoch over the pairs.
4. Baselines at the same number of reward calls: reward fine-tuning with the N^full target (B proposals × G noisy
   states × steps = the pairs' budget; reward_text.py's config), and best-of-N of the pre-trained model (N calls
   per returned sample, at inference).
5. Evaluation of every model: `--num-eval` prompted samples; mean VADER reward, gen-PPL of the continuation under
   the causal reference, mean unigram entropy of the continuation tokens; the held-out pair metrics of the
   preference runs (accuracy, implicit reward margin, KL estimate; tcsm.posttrain.preference.objective.PreferenceObjective.evaluate).

Outputs: benchmarks/results/preference_text.json (rewritten after every finished model), the figures
docs/preference_reward_vs_beta.png and docs/preference_reward_vs_entropy.png, and a markdown table on stdout.
Re-running resumes: finished runs and evaluations are kept. Example (≈1 h on a shared 2-core CPU):

    nice -n 10 .venv/bin/python benchmarks/preference_text.py --work runs/preference_text
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import reward_text as rt  # the pre-training setup shared with the reward benchmark

ROOT = Path(__file__).resolve().parents[1]
PROMPT = rt.PROMPT


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def since(start: tuple[float, float]) -> dict:
    w, c = clock()
    return {"wall_s": round(w - start[0], 1), "cpu_s": round(c - start[1], 1), "loadavg": list(os.getloadavg())}


# --------------------------------------------------------------------------------------------------- runs


def preference_run_config(pre_dir: Path, pairs: Path, loss: str, beta: float, steps: int, args):
    from tcsm.recipes.preference.compose import preference_config

    over = [
        f"train.steps={steps}",
        f"train.batch_size={args.batch}",
        "optim.lr=3e-4",
        "optim.warmup=10",
        "optim.decay=constant",
        f"objective.num_t={args.num_t}",
        "objective.eval_num_t=4",
        "train.ema=0.9",
        "train.eval_every=0",
        "train.eval_examples=256",
        "train.save_every=100",
        "train.log_every=20",
        "train.sample_every=0",
        "train.progress=false",
        "train.tensorboard=false",
        "train.precision=fp32",
        f"train.threads={args.threads}",
        "sample.num=0",
    ]
    values = {"objective.loss": loss, ("objective.beta" if loss == "paper" else "objective.beta_dpo"): beta}
    return preference_config(pre_dir, pairs, "finetune-preference", over, values)


def reward_run_config(pre_dir: Path, args):
    ns = argparse.Namespace(finetune_steps=args.reward_steps, groups=args.reward_groups)
    cfg = rt.finetune_config(pre_dir, args.reward_b, args.reward_beta, ns)
    from tcsm.builders.config import set_values

    return set_values(cfg, {"train.threads": args.threads, "train.tensorboard": False})


def make_pairs(pre, data, path, args, out: Path) -> dict:
    """Write the pairs file (once) and return its statistics."""
    stats_file = out.with_suffix(".stats.json")
    if out.is_file() and stats_file.is_file():
        return json.loads(stats_file.read_text())
    from tcsm.recipes.preference.compose import sample_pairs, write_pairs
    from tcsm.rewards.functions import make_reward

    start = clock()
    reward = make_reward("vader", decode=data.decode)
    records, stats = sample_pairs(
        pre.model, path, data, reward, args.groups, group=args.group, prompts=[PROMPT],
        steps=args.sample_steps, seed=11, max_rounds=1,
    )
    write_pairs(records, out)
    gaps = torch.tensor([r["chosen_reward"] - r["rejected_reward"] for r in records], dtype=torch.float64)
    stats.update(mean_chosen_reward=sum(r["chosen_reward"] for r in records) / len(records),
                 mean_rejected_reward=sum(r["rejected_reward"] for r in records) / len(records),
                 mean_gap=float(gaps.mean()), **since(start))
    stats_file.write_text(json.dumps(stats, indent=1) + "\n")
    return stats


# --------------------------------------------------------------------------------------------------- eval


def evaluate(model, path, data, judge, args, seed: int) -> dict:
    from tcsm.evaluation import sample_entropy

    x = rt.draw(model, path, data, args.num_eval, args, seed=seed)
    return {**judge.score(x), **entropy_of(x, judge.P, sample_entropy)}


def entropy_of(x, P: int, sample_entropy) -> dict:
    per = torch.tensor(sample_entropy(x[:, P:])["entropy_per_sample"], dtype=torch.float64)
    return {"entropy": float(per.mean()), "entropy_stderr": float(per.std() / math.sqrt(per.numel()))}


def cached(run_dir: Path, fn) -> dict:
    f = run_dir / "bench_eval.json"
    if f.is_file():
        return json.loads(f.read_text())
    out = fn()
    f.write_text(json.dumps(out, indent=1) + "\n")
    return out


def held_out(run_dir: Path) -> dict:
    s = json.loads((run_dir / "summary.json").read_text())
    keys = ("pref_accuracy", "reward_margin", "reward_margin_stderr", "kl_ref", "kl_ref_stderr", "num_pairs")
    return {"train_wall_s": s.get("elapsed_s"), **{k: s[k] for k in keys if k in s}}


# --------------------------------------------------------------------------------------------------- report


def plot(results: dict, prefix: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pre, rft = results["pretrained"], results.get("reward_finetuned")
    pref = results["preference"]
    out = []
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, loss, label in ((axes[0], "paper", "paper BCE: margin β"), (axes[1], "dpo", "DPO-style: β_DPO")):
        rows = sorted((r for r in pref if r["loss"] == loss), key=lambda r: r["beta"])
        if rows:
            ax.errorbar([r["beta"] for r in rows], [r["reward_mean"] for r in rows],
                        yerr=[r["reward_stderr"] for r in rows], fmt="o-", label="preference fine-tuned")
        ax.axhline(pre["reward_mean"], color="k", ls="--", lw=1, label="pre-trained")
        if rft:
            ax.axhline(rft["reward_mean"], color="C3", ls="-.", lw=1, label=f"reward FT (N^full, B={rft['B']})")
        for i, r in enumerate(results["best_of_n"].values()):
            ax.axhline(r["reward_mean"], color=f"C{4 + i}", ls=":", lw=1, label=f"best-of-{r['N']}")
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean VADER compound of samples (± s.e.)")
    axes[1].legend(fontsize=7, loc="best")
    fig.suptitle(f"{results['data']}: reward vs β ({results['config']['num_eval']} prompted samples each, CPU scale)",
                 fontsize=9)
    fig.tight_layout()
    out.append(prefix.with_name(prefix.name + "_reward_vs_beta.png"))
    fig.savefig(out[-1], dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.4, 4.6))

    def point(r, fmt, label, **kw):
        ax.errorbar(r["entropy"], r["reward_mean"], xerr=r["entropy_stderr"], yerr=r["reward_stderr"], fmt=fmt,
                    label=label, **kw)

    point(pre, "ks", "pre-trained")
    if rft:
        point(rft, "^", f"reward FT (N^full, B={rft['B']}, β={rft['beta']:g})", color="C3")
    for i, r in enumerate(results["best_of_n"].values()):
        point(r, "D", f"best-of-{r['N']}", color=f"C{4 + i}")
    for loss, fmt in (("paper", "C0o-"), ("dpo", "C1s-")):
        rows = sorted((r for r in pref if r["loss"] == loss), key=lambda r: r["beta"])
        if not rows:
            continue
        line = ax.errorbar([r["entropy"] for r in rows], [r["reward_mean"] for r in rows],
                           xerr=[r["entropy_stderr"] for r in rows], yerr=[r["reward_stderr"] for r in rows],
                           fmt=fmt, label=f"preference FT, {loss} loss")
        for r in rows:
            ax.annotate(f"{r['beta']:g}", (r["entropy"], r["reward_mean"]), fontsize=7, xytext=(4, 3),
                        textcoords="offset points", color=line[0].get_color())
    ax.set_xlabel("mean unigram entropy of the 24 generated tokens (nats)", fontsize=9)
    ax.set_ylabel("mean VADER compound (higher is better)", fontsize=9)
    ax.set_title("reward vs entropy (labels: β or β_DPO)", fontsize=9)
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.append(prefix.with_name(prefix.name + "_reward_vs_entropy.png"))
    fig.savefig(out[-1], dpi=120)
    plt.close(fig)
    return out


def table(results: dict) -> str:
    def row(name, calls, r, extra="– | – | –"):
        ppl = f"{r['gen_ppl']:.0f} ± {r['gen_ppl'] * r['nll_stderr']:.0f}"
        return (f"| {name} | {calls} | {r['reward_mean']:.3f} ± {r['reward_stderr']:.3f} | {ppl} | "
                f"{r['entropy']:.3f} ± {r['entropy_stderr']:.3f} | {extra} |")

    lines = [
        (
            "| model | reward calls | mean VADER ± s.e. | gen-PPL ± s.e. | entropy (nats) ± s.e. | held-out acc. | "
            "margin (nats) | KL est. (nats/seq) |"
        ),
        "|---|---|---|---|---|---|---|---|",
        row("pre-trained", "0", results["pretrained"]),
    ]
    budget = results["pairs"]["reward_calls"]
    for r in results["best_of_n"].values():
        lines.append(row(f"pre-trained, best-of-{r['N']}", f"{r['N']} per sample", r))
    rft = results.get("reward_finetuned")
    if rft:
        lines.append(row(f"reward FT N^full (B={rft['B']}, β={rft['beta']:g})", f"{rft['reward_calls']}", rft))
    for r in sorted(results["preference"], key=lambda r: (r["loss"], r["beta"])):
        name = f"preference FT, paper β={r['beta']:g}" if r["loss"] == "paper" else f"preference FT, dpo β_DPO={r['beta']:g}"
        extra = f"{r['pref_accuracy']:.3f} | {r['reward_margin']:.2f} ± {r['reward_margin_stderr']:.2f} | {r['kl_ref']:.3f}"
        lines.append(row(name, f"{budget} (pairs)", r, extra))
    return "\n".join(lines)


def save(results: dict, args) -> None:
    for dest in (Path(args.work) / "results.json", Path(args.results)):
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="runs/preference_text", help="working directory (runs, data, pairs, results)")
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "preference_text.json"))
    p.add_argument("--figures", default=str(ROOT / "docs" / "preference"), help="figure path prefix")
    p.add_argument("--pretrain-steps", type=int, default=2000)
    p.add_argument("--ref-steps", type=int, default=1200)
    p.add_argument("--groups", type=int, default=4096, help="sample groups judged for pairs")
    p.add_argument("--group", type=int, default=4, help="samples per group (chosen = best, rejected = worst)")
    p.add_argument("--betas", default="0.1,0.5,1,5", help="paper loss: β values (the paper's sweep)")
    p.add_argument("--betas-dpo", default="0.1,0.3,1,3", help="dpo loss: β_DPO values")
    p.add_argument("--epochs", type=float, default=1.0, help="passes over the training pairs per fine-tune")
    p.add_argument("--batch", type=int, default=16, help="pairs per step")
    p.add_argument("--num-t", type=int, default=2, help="t draws per pair and step")
    p.add_argument("--reward-b", type=int, default=8, help="reward FT: N^full proposals B")
    p.add_argument("--reward-groups", type=int, default=16, help="reward FT: noisy states per step")
    p.add_argument("--reward-beta", type=float, default=0.1, help="reward FT: temperature β")
    p.add_argument("--best-of", default="2,4,8", help="N values of the best-of-N baseline")
    p.add_argument("--num-eval", type=int, default=128, help="prompted samples per model")
    p.add_argument("--sample-steps", type=int, default=48)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="tiny smoke-test sizes (minutes): not a result")
    p.add_argument("--replot", action="store_true", help="only redraw the figures and table from --results")
    args = p.parse_args(argv)
    if args.replot:
        results = json.loads(Path(args.results).read_text())
        plot(results, Path(args.figures))
        print(table(results))
        return 0
    if args.quick:
        args.pretrain_steps, args.ref_steps, args.groups, args.num_eval, args.sample_steps = 60, 40, 64, 16, 8
        args.betas, args.betas_dpo, args.best_of = "1", "0.1", "4"
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    if args.quick:  # a smoke test never overwrites the reported results
        args.results, args.figures = str(work / "results.json"), str(work / "preference")
    work.mkdir(parents=True, exist_ok=True)
    # reward_text's helpers read these names from its own argparse namespace
    args.tokenizer, args.seq_len, args.bpe_vocab = "bpe", 32, 1024
    data_cfg = rt.prepare_data(work, "bpe", args.seq_len, args.bpe_vocab)
    timing = {"pretrain": {"wall_s": round(rt.train_or_resume(rt.pretrain_config(data_cfg, args), work / "pretrain"), 1)},
              "reference": {"wall_s": round(rt.train_or_resume(rt.causal_config(data_cfg, args), work / "reference"), 1)}}

    from tcsm.builders.loading import load_checkpoint

    pre = load_checkpoint(work / "pretrain")
    ref = load_checkpoint(work / "reference")
    data, path = pre.build_data(), pre.build_path()
    judge = rt.Judge(ref.model, data, len(data.encode(PROMPT)))
    results: dict = {"config": dict(vars(args)), "prompt": PROMPT, "data": data.label,
                     "reference_summary": rt._last_eval(work / "reference"), "timing": timing}

    pairs_file = work / "pairs.jsonl"
    results["pairs"] = make_pairs(pre, data, path, args, pairs_file)
    budget = results["pairs"]["reward_calls"]
    print(f"pairs: {results['pairs']['pairs']} from {budget} reward calls", flush=True)

    start = clock()
    results["pretrained"] = cached(work / "pretrain", lambda: evaluate(pre.model, path, data, judge, args, seed=2))
    Ns = [int(n) for n in args.best_of.split(",") if n]
    n_max = max(Ns)
    pool = rt.draw(pre.model, path, data, args.num_eval * n_max, args, seed=1).reshape(args.num_eval, n_max, -1)
    rewards = judge.reward(pool.reshape(args.num_eval * n_max, -1)).reshape(args.num_eval, n_max)
    from tcsm.evaluation import sample_entropy

    results["best_of_n"] = {}
    for N in Ns:
        best = pool[torch.arange(args.num_eval), rewards[:, :N].argmax(-1)]
        results["best_of_n"][f"N={N}"] = {"N": N, **judge.score(best), **entropy_of(best, judge.P, sample_entropy)}
    timing["baselines_eval"] = since(start)
    save(results, args)

    # reward fine-tuning at the pairs' reward-call budget: steps × groups × B = budget
    args.reward_steps = max(1, round(budget / (args.reward_groups * args.reward_b)))
    run_dir = work / f"reward_B{args.reward_b}_beta{args.reward_beta:g}_steps{args.reward_steps}"
    start = clock()
    rt.train_or_resume(reward_run_config(work / "pretrain", args), run_dir)
    ck = load_checkpoint(run_dir)
    results["reward_finetuned"] = {
        "B": args.reward_b, "beta": args.reward_beta, "steps": args.reward_steps,
        "reward_calls": args.reward_steps * args.reward_groups * args.reward_b,
        **cached(run_dir, lambda: evaluate(ck.model, path, data, judge, args, seed=2)),
    }
    timing["reward_finetune"] = since(start)
    save(results, args)

    n_train = max(1, round(results["pairs"]["pairs"] * 0.9))
    steps = max(1, round(args.epochs * n_train / args.batch))
    results["preference"] = []
    sweep = [("paper", float(b)) for b in args.betas.split(",") if b]
    sweep += [("dpo", float(b)) for b in args.betas_dpo.split(",") if b]
    for loss, beta in sweep:
        run_dir = work / f"pref_{loss}_beta{beta:g}"
        start = clock()
        rt.train_or_resume(preference_run_config(work / "pretrain", pairs_file, loss, beta, steps, args), run_dir)
        ck = load_checkpoint(run_dir)
        row = {"loss": loss, "beta": beta, "steps": steps, **held_out(run_dir),
               **cached(run_dir, lambda m=ck.model: evaluate(m, path, data, judge, args, seed=2)), **since(start)}
        results["preference"].append(row)
        print(f"{loss} β={beta:g}: reward {row['reward_mean']:.3f}, entropy {row['entropy']:.3f}, gen-PPL "
              f"{row['gen_ppl']:.0f}, held-out accuracy {row.get('pref_accuracy', float('nan')):.3f}", flush=True)
        save(results, args)
    plot(results, Path(args.figures))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
