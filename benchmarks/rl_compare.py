"""RL with a verifiable reward against TCSM reward tuning, from one supervised warm-up run: held-out task accuracy
against the rollouts each method drew and the CPU time it took (docs/benchmarks.md, "RL with verifiable rewards").

Methods (one command line each, the task's verifier as the reward, the same sampler and steps for every rollout):
  diffu-grpo  `tcsm finetune rl --estimator one_step` (d1's one-step log-likelihood, prompt masking; advantages
              std-scaled, which d1 does not do)
  elbo-grpo   `tcsm finetune rl --estimator elbo --upper eubo` (the path's bound; SPG's upper bound for A < 0)
  tcsm-nfull  `tcsm finetune reward --neighbourhood full --xt-source model` (B proposals per on-policy x_t, SNIS)
  tcsm-n1     `tcsm finetune reward --neighbourhood n1 --xt-source model` (explicit tilted single-site conditionals)
A GRPO step draws `--prompts` × `--group` rollouts; a TCSM step completes `--prompts` × `--group` prompts once each
(its x'_1), so every method draws the same rollouts per step. Runs go in rounds (every method and seed trains one
chunk, then the next), each chunk resumed from the last checkpoint, then `tcsm eval --task` on the pinned held-out
problems. CPU time is `time.process_time` of the training calls alone (one thread; evaluation excluded).

    PYTHONPATH=src .venv/bin/python benchmarks/rl_compare.py --source runs/sudoku --task sudoku --out R.json
    PYTHONPATH=src .venv/bin/python benchmarks/rl_compare.py --report R.json --figure docs/img/rl_compare.png
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import torch

METHODS = {
    "diffu-grpo": ("one-step GRPO (std-scaled advantages)", "rl", {"objective.estimator": "one_step"}),
    "elbo-grpo": ("ELBO-GRPO (bound, EUBO for A<0)", "rl", {"objective.estimator": "elbo", "objective.upper": "eubo"}),
    "tcsm-nfull": ("TCSM reward, N^full", "reward", {"target.neighbourhood": "full", "target.xt_source": "model"}),
    "tcsm-n1": ("TCSM reward, N^1", "reward", {"target.neighbourhood": "n1", "target.xt_source": "model"}),
}
QUIET = {"train.device": "cpu", "train.threads": 1, "train.progress": False, "train.tensorboard": False,
         "train.ema": 0, "train.eval_every": 0, "train.sample_every": 0, "sample.num": 0, "train.log_every": 10,
         "optim.warmup": 0}  # fmt: skip


def method_values(args, method: str, seed: int) -> dict:
    """The run's config values: what `tcsm finetune rl | reward` sets from the comparison's flags."""
    _, recipe, own = METHODS[method]
    common = {**QUIET, **own, "train.seed": seed, "optim.lr": args.lr[method], "train.save_every": args.chunk}
    if recipe == "rl":
        return {**common, "objective.reward": f"task:{args.task}", "objective.group_size": args.group,
                "objective.kl_coef": args.kl, "train.batch_size": args.prompts, "sample.steps": args.sample_steps}  # fmt: skip
    return {**common, "target.reward": f"task:{args.task}", "target.num_proposals": args.proposals,
            "target.beta": args.beta, "train.batch_size": args.prompts * args.group,
            "target.sample_steps": args.sample_steps}  # fmt: skip


def train_to(args, method: str, seed: int, run: Path, step: int) -> None:
    """Train the method's run to `step`: a new run from the warm-up, or the saved run resumed from its checkpoint."""
    from tcsm.builders.config import load_config, set_values
    from tcsm.storage.checkpoint import read_state, resolve_checkpoint
    from tcsm.train.fit import fit

    if (run / "checkpoints" / "latest").is_file():
        checkpoint = resolve_checkpoint(run)
        cfg = set_values(load_config(None, [], base=read_state(checkpoint)[1]["config"]), {"train.steps": step})
        fit(cfg, run, resume=checkpoint, log=lambda s: None)
        return
    if METHODS[method][1] == "rl":
        from tcsm.recipes.rl.compose import rl_config as make_config
    else:
        from tcsm.recipes.reward.compose import reward_config as make_config
    values = {**method_values(args, method, seed), "train.steps": step}
    fit(make_config(args.source, f"finetune-{METHODS[method][1]}", (), values), run, log=lambda s: None)


def accuracy(args, run: Path) -> dict:
    """`tcsm eval RUN --task T --steps K --max-examples N --seed 0` as a function: the held-out accuracy of the
    run's (EMA, where it has them) weights with its sampler at `--sample-steps`, the task's options the run's."""
    from tcsm.builders.loading import load_checkpoint
    from tcsm.data import CharTokenizer
    from tcsm.data.tasks import TaskReward, make_task, run_task_options
    from tcsm.evaluation.tasks import sampler_completions, task_accuracy
    from tcsm.sampling.settings import sample_settings

    ckpt = load_checkpoint(run, device="cpu")
    task = make_task(args.task, **run_task_options(ckpt.config.data).get(args.task, {}))
    tok = CharTokenizer(ckpt.data_info["chars"])  # a task run's vocabulary, stored in its checkpoint
    reward = TaskReward(task, decode=tok.decode, vocab_size=tok.vocab_size)
    settings = sample_settings(ckpt.config.sample, steps=args.sample_steps)
    complete = sampler_completions(ckpt.model, ckpt.build_path(), settings, int(ckpt.data_info["seq_len"]),
                                   generator=torch.Generator().manual_seed(0), device="cpu")  # fmt: skip
    acc = task_accuracy(complete, task, reward, args.eval_examples, batch_size=64)
    return {"accuracy": acc.accuracy, "correct": acc.correct, "num_problems": acc.num_problems,
            "ci_low": acc.ci_low, "ci_high": acc.ci_high}  # fmt: skip


def _save(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def run(args) -> None:
    out = Path(args.out)
    state = json.loads(out.read_text()) if out.exists() else {}
    state["meta"] = {"command": " ".join(["python", *sys.argv]), "torch": torch.__version__,
                     "args": {k: v for k, v in vars(args).items() if k not in ("report", "figure")}}  # fmt: skip
    runs = state.setdefault("runs", {})
    torch.set_num_threads(1)
    for key in (f"{m}/{s}" for m in args.methods for s in args.seeds):
        if key not in runs:
            runs[key] = {"curve": [{"step": 0, "rollouts": 0, "cpu_s": 0.0, **accuracy(args, Path(args.source))}]}
            _save(out, state)
    for chunk in range(1, args.chunks + 1):
        step = chunk * args.chunk
        for seed in args.seeds:
            for method in args.methods:
                rec = runs[f"{method}/{seed}"]
                if rec["curve"][-1]["step"] >= step:
                    continue
                run_dir = Path(args.runs) / args.task / method / str(seed)
                c0, w0, load = time.process_time(), time.perf_counter(), os.getloadavg()[0]
                with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()):
                    train_to(args, method, seed, run_dir, step)
                cpu, wall = time.process_time() - c0, time.perf_counter() - w0
                acc = accuracy(args, run_dir)
                rec["curve"].append({"step": step, "rollouts": step * args.prompts * args.group,
                                     "cpu_s": rec["curve"][-1]["cpu_s"] + cpu, "wall_s": wall, "loadavg": load, **acc})  # fmt: skip
                _save(out, state)
                print(f"[{args.task} {method} seed {seed}] step {step}: acc {acc.get('accuracy')} "
                      f"(+{cpu:.0f} CPU-s, load {load:.1f})", flush=True)  # fmt: skip


def _mean_sd(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1))


def report(states: list[dict], figure: Path | None) -> str:
    """One table row per task and method (accuracy at the last evaluation and averaged over the last three, mean ±
    sd over seeds, each seed listed) and a figure: a row per task, accuracy against rollouts and against CPU time."""
    lines = [f"`{s['meta']['command']}`" for s in states]
    header = ("| task | method | lr | seeds | accuracy, step 0 | accuracy, last (per seed) | last 3 points "
              "| rollouts | CPU-s per run |")
    lines += ["", header, "|---|---|---|---|---|---|---|---|---|"]
    panels = []
    for state in states:
        meta = state["meta"]["args"]
        by_method: dict = {}
        for key, rec in state["runs"].items():
            by_method.setdefault(key.split("/")[0], []).append(rec["curve"])
        panels.append((meta, by_method))
        for method, curves in by_method.items():
            n = min(len(c) for c in curves)
            last = [c[n - 1]["accuracy"] for c in curves]
            tail = [sum(p["accuracy"] for p in c[max(1, n - 3) : n]) / len(c[max(1, n - 3) : n]) for c in curves]
            (m, sd), (tm, tsd) = _mean_sd(last), _mean_sd(tail)
            cpu = sum(c[n - 1]["cpu_s"] for c in curves) / len(curves)
            lines.append(f"| {meta['task']} | {METHODS[method][0]} | {meta['lr'][method]:g} | {len(curves)} | "
                         f"{curves[0][0]['accuracy']:.3f} | "
                         f"{m:.3f} ± {sd:.3f} ({', '.join(f'{a:.3f}' for a in last)}) | {tm:.3f} ± {tsd:.3f} | "
                         f"{curves[0][n - 1]['rollouts']} | {cpu:.0f} |")  # fmt: skip
    if figure is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(len(panels), 2, figsize=(10, 3.6 * len(panels)), squeeze=False)
        for row, (meta, by_method) in zip(axes, panels):
            for (method, curves), colour in zip(by_method.items(), ["C0", "C1", "C2", "C3"]):
                for i, c in enumerate(curves):
                    for ax, x in zip(row, ("rollouts", "cpu_s")):
                        ax.plot([p[x] for p in c], [p["accuracy"] for p in c], colour, alpha=0.7, marker=".",
                                label=METHODS[method][0] if i == 0 else None)  # fmt: skip
            row[0].set_xlabel("rollouts drawn")
            row[1].set_xlabel("training CPU seconds (1 thread)")
            lrs = ", ".join(sorted({f"{v:g}" for v in meta["lr"].values()}))
            for ax in row:
                ax.set_ylabel(f"{meta['task']}, lr {lrs}: accuracy ({meta['eval_examples']} held-out)", fontsize=8)
                ax.grid(alpha=0.3)
            row[0].legend(fontsize=7)
        fig.suptitle(f"from one warm-up run per task, {len(panels[0][0]['seeds'])} seeds per method", fontsize=10)
        fig.tight_layout()
        figure.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(figure, dpi=110)
        lines += ["", f"![accuracy against rollouts and CPU time]({figure.as_posix().split('docs/')[-1]})"]
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", help="the supervised warm-up run every method starts from")
    ap.add_argument("--task", choices=["sudoku", "countdown", "addition"])
    ap.add_argument("--out", help="results JSON (resumable)")
    ap.add_argument("--runs", default="runs/bench/rl_compare")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--chunk", type=int, default=25, help="steps between evaluations")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--proposals", type=int, default=8)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--kl", type=float, default=0.04)
    ap.add_argument("--sample-steps", type=int, default=16)
    ap.add_argument("--eval-examples", type=int, default=200)
    ap.add_argument("--lr", nargs="+", default=["1e-4"], help="one lr, or METHOD=LR entries")
    ap.add_argument("--report", nargs="+", help="print the table of these results JSONs (and write --figure)")
    ap.add_argument("--figure")
    args = ap.parse_args(argv)
    if args.report:
        states = [json.loads(Path(f).read_text()) for f in args.report]
        print(report(states, Path(args.figure) if args.figure else None))
        return
    lrs = dict(e.split("=") if "=" in e else ("*", e) for e in args.lr)
    args.lr = {m: float(lrs.get(m, lrs.get("*", 1e-4))) for m in METHODS}
    if not (args.source and args.task and args.out):
        ap.error("--source, --task and --out are required unless --report")
    run(args)


if __name__ == "__main__":
    main()
