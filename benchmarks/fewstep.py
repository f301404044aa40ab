"""Few-step distillation (MATH.md §10, docs/benchmarks.md "Few-step distillation"): rounds of step-halving from a
teacher run, then gen-PPL under a separate causal judge and sample entropy at several step counts, for the teacher
and for the student after each round, over several sampling seeds.

Round r is `tcsm finetune fewstep --from <round r-1> --teacher-steps K_r` (K_1 = --start-steps, K_{r+1} = K_r / ratio,
2 by default: step-halving),
run in this process through the recipe's own config (`tcsm.recipes.fewstep.compose.fewstep_config`) and the
Trainer, with its CPU time (time.process_time) and wall time recorded; a round whose run directory already holds
checkpoints is resumed (or reused when finished). The teacher's pre-training CPU time is read from a JSON file
(--teacher-cost: a JSON object {"cpu_s": ...}) when given.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/fewstep.py --teacher runs/text8-gen \
        --judge runs/text8-judge --teacher-cost runs/text8-gen/cost.json \
        --start-steps 16 --rounds 2 --round-steps 100 --window 2 --work-dir runs/fewstep-text8 \
        --eval-steps 4,8,16,32,64 --seeds 0,1,2 --num-samples 32 --out benchmarks/results/fewstep_text8.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch


def _args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--teacher", help="the teacher run (a masked or uniform diffusion run)")
    ap.add_argument("--judge", help="causal LM run or HF directory that scores the samples (gen-PPL)")
    ap.add_argument("--report", default=None, metavar="JSON",
                    help="print the markdown tables of a result file written by --out, measure nothing")
    ap.add_argument("--teacher-cost", default=None, help="JSON file with the teacher's pre-training cpu_s as {\"cpu_s\": ...}")
    ap.add_argument("--start-steps", type=int, default=16,
                    help="the teacher's steps in round 1 (divided by --ratio every round)")
    ap.add_argument("--ratio", type=int, default=2,
                    help="teacher steps per student step in every round (2: step-halving, SDTT's rounds)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--round-steps", type=int, default=100, help="optimizer steps per round")
    ap.add_argument("--batch-size", type=int, default=16, help="training batch per round")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--window", type=int, default=None, help="teacher steps per rollout before its step to 1 (None: all)")
    ap.add_argument("--form", default="conditionals", choices=("conditionals", "draws", "joint"),
                    help="target.form; joint: the joint student (a step head, the teacher's steps over one student step)")
    ap.add_argument("--eval-steps", default="4,8,16,32,64")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--num-samples", type=int, default=32)
    ap.add_argument("--work-dir", default="runs/fewstep-bench")
    ap.add_argument("--eval-only", action="store_true", help="evaluate the rounds already in --work-dir, train none")
    ap.add_argument("--probe-steps", type=int, default=5,
                    help="pre-training steps of the teacher's own config at --batch-size, timed as the unit of cost (0: skip)")
    ap.add_argument("--precision", default=None, choices=("fp32", "bf16", "fp16"),
                    help="train.precision of the rounds and of the pre-training probe (default: the teacher run's; "
                         "bf16 autocast is several times slower than fp32 on a CPU)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a further override of every round's config (repeatable), e.g. model.step_head_only=true")
    ap.add_argument("--out", default=None)
    return ap.parse_args(argv)


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class StepClock:
    """CPU time at each step's end: the steps' own cost, without building the run or loading the teacher."""

    def __init__(self):
        self.marks: list[tuple[int, float]] = []

    def on_fit_start(self, info) -> None:
        pass

    def on_step_end(self, info) -> None:
        self.marks.append((int(info.step), time.process_time()))

    def per_step(self) -> float | None:
        """CPU seconds per step after the first (which also warms up)."""
        if len(self.marks) < 2:
            return None
        (s0, c0), (s1, c1) = self.marks[0], self.marks[-1]
        return (c1 - c0) / (s1 - s0)


def train_round(source: Path, teacher_steps: int, run_dir: Path, args) -> dict:
    """One `tcsm finetune fewstep` round in this process; its CPU and wall seconds (0 when reused finished)."""
    from tcsm.recipes.fewstep.compose import fewstep_config
    from tcsm.train.trainer import Trainer

    overrides = [f"target.teacher_steps={teacher_steps}", f"target.student_steps={teacher_steps // args.ratio}",
                 f"train.steps={args.round_steps}",
                 f"train.batch_size={args.batch_size}", f"optim.lr={args.lr}", f"target.form={args.form}",
                 "train.threads=1", "train.device=cpu", "train.progress=false", "train.tensorboard=false",
                 "train.save_every=25", "train.log_every=10", "sample.num=0"]  # fmt: skip
    if args.window is not None and args.form != "joint":  # the joint round takes no window
        overrides.append(f"target.window={args.window}")
    if args.precision:
        overrides.append(f"train.precision={args.precision}")
    overrides += args.set
    cfg = fewstep_config(source, overrides=overrides)
    done = run_dir / "ROUND_DONE"
    if done.exists():
        return json.loads(done.read_text())
    resume = (run_dir / "checkpoints").is_dir()
    t0, c0 = time.perf_counter(), time.process_time()
    clock = StepClock()
    Trainer.from_config(cfg, run_dir, log=_log, resume=True if resume else None, callbacks=[clock]).fit()
    cost = {"cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - t0, "resumed": resume,
            "cpu_s_per_step": clock.per_step(),
            "teacher_steps": teacher_steps, "student_steps": teacher_steps // args.ratio, "optimizer_steps": args.round_steps,
            "batch_size": args.batch_size, "window": args.window, "form": args.form,
            "precision": str(cfg.train.precision)}  # fmt: skip
    done.write_text(json.dumps(cost))
    return cost


def probe_pretraining(teacher: Path, run_dir: Path, args) -> dict | None:
    """CPU seconds per step of the teacher's own pre-training objective at the rounds' batch size, from a fresh model
    (`--probe-steps` steps after one untimed warm-up step): the unit a round's cost is stated in."""
    from tcsm.builders.config import load_config
    from tcsm.builders.source import source_run
    from tcsm.train.trainer import Trainer

    if args.probe_steps <= 0:
        return None
    _, base = source_run(teacher, "fewstep")
    overrides = [f"train.batch_size={args.batch_size}", "train.threads=1", "train.device=cpu", "train.progress=false",
                 "train.tensorboard=false", "train.save_every=0", "train.eval_every=0", "train.sample_every=0",
                 "sample.num=0", "train.log_every=1000"]  # fmt: skip
    if args.precision:
        overrides.append(f"train.precision={args.precision}")
    cfg = load_config(None, [*overrides, f"train.steps={1 + args.probe_steps}", "train.out_dir=null"], base=base)
    clock = StepClock()
    Trainer.from_config(cfg, run_dir, log=lambda m: None, overwrite=True, callbacks=[clock]).fit()
    return {"cpu_s_per_step": clock.per_step(), "batch_size": args.batch_size, "steps": args.probe_steps,
            "precision": str(cfg.train.precision)}


def evaluate(models: dict, judge, steps: list[int], seeds: list[int], args) -> list[dict]:
    """gen-PPL and entropy per (model, K, seed); the models interleaved inside each (seed, K)."""
    from tcsm.evaluation import generative_perplexity, sample_entropy
    from tcsm.sampling.settings import draw, sample_settings

    rows = []
    for seed in seeds:
        for K in steps:
            for name, ck in models.items():
                path, L = ck.build_path(), int(ck.data_info["seq_len"])
                g = torch.Generator().manual_seed(seed)
                t0, c0 = time.perf_counter(), time.process_time()
                x, st = draw(ck.model, path, args.num_samples, L, sample_settings(ck.config.sample, steps=K),
                             generator=g)  # fmt: skip
                cpu = time.process_time() - c0
                res = generative_perplexity(judge, token_ids=x, batch_size=32)
                ent = sample_entropy(x)["entropy_mean"]
                rows.append({"model": name, "steps": K, "seed": seed, "gen_ppl": res.gen_ppl, "entropy": ent,
                             "sample_cpu_s": cpu, "sample_wall_s": time.perf_counter() - t0,
                             "network_calls": int(st.num_calls), "head_calls": int(st.counts.get("head_calls", 0)),
                             "tokens": int(x.numel())})  # fmt: skip
                _log(f"{name:>8} K={K:3d} seed={seed}: gen-PPL {res.gen_ppl:8.3f}  entropy {ent:.4f}")
    return rows


def summary(rows: list[dict]) -> list[dict]:
    out = {}
    for r in rows:
        out.setdefault((r["model"], r["steps"]), []).append(r)
    table = []
    for (model, K), rs in out.items():
        p, e = [r["gen_ppl"] for r in rs], [r["entropy"] for r in rs]
        table.append({"model": model, "steps": K, "seeds": len(rs), "gen_ppl_mean": statistics.mean(p),
                      "gen_ppl_sd": statistics.stdev(p) if len(p) > 1 else 0.0, "entropy_mean": statistics.mean(e),
                      "entropy_sd": statistics.stdev(e) if len(e) > 1 else 0.0})  # fmt: skip
    return table


def report(result: dict) -> str:
    """Markdown tables of a result: gen-PPL and entropy (mean ± sd over the seeds) per model and step count, the
    data row, and the rounds' cost beside the teacher's pre-training."""
    cells = {(r["model"], r["steps"]): r for r in result["summary"]}
    models = list(dict.fromkeys(r["model"] for r in result["summary"]))
    steps = sorted({r["steps"] for r in result["summary"]})
    head = "| model | " + " | ".join(f"{k} steps" for k in steps) + " |\n|---|" + "---|" * len(steps)
    d = result["data_test"]
    lines = [(f"gen-PPL (mean ± sd over {len(result['seeds'])} seeds; {d.get('split', 'test')} data: "
              f"{d['gen_ppl']:.3f}, entropy {d['entropy']:.4f})"), "", head]  # fmt: skip
    for m in models:
        lines.append(f"| {m} | " + " | ".join(f"{cells[m, k]['gen_ppl_mean']:.3f} ± {cells[m, k]['gen_ppl_sd']:.3f}"
                                             for k in steps) + " |")  # fmt: skip
    lines += ["", "Sample entropy (nats, mean ± sd):", "", head]
    for m in models:
        lines.append(f"| {m} | " + " | ".join(f"{cells[m, k]['entropy_mean']:.4f} ± {cells[m, k]['entropy_sd']:.4f}"
                                             for k in steps) + " |")  # fmt: skip
    if all("tokens" in r for r in result["rows"]):  # sampling throughput: tokens per CPU-second of the draws alone
        lines += ["", ("Sampling, tokens per CPU-second (one thread; network calls and step-head calls per draw of "
                       f"{result['num_samples']} sequences, mean over the seeds):"), "", head]  # fmt: skip
        for m in models:
            cell = []
            for k in steps:
                rs = [r for r in result["rows"] if r["model"] == m and r["steps"] == k]
                rate = sum(r["tokens"] for r in rs) / sum(r["sample_cpu_s"] for r in rs)
                calls = statistics.mean(r["network_calls"] for r in rs)
                heads = statistics.mean(r["head_calls"] for r in rs)
                cell.append(f"{rate:.0f} ({calls:.0f} calls" + (f", {heads:.0f} head" if heads else "") + ")")
            lines.append(f"| {m} | " + " | ".join(cell) + " |")
    probe = result.get("pretraining_probe") or {}
    lines += ["", "| round | teacher → student steps | CPU-s / step | pre-training steps / step | round CPU-s | wall s |",
              "|---|---|---|---|---|---|"]  # fmt: skip
    for c in result["rounds"]:
        per = c.get("cpu_s_per_step")
        lines.append((f"| {c['round']} | {c['teacher_steps']} → {c['student_steps']} | "
                      f"{per:.3f} | {c.get('pretraining_steps_per_step', float('nan')):.2f} | {c['cpu_s']:.1f} | "
                      f"{c['wall_s']:.0f} |") if per else (f"| {c['round']} | {c['teacher_steps']} → "
                      f"{c['student_steps']} | – | – | {c['cpu_s']:.1f} | {c['wall_s']:.0f} |"))  # fmt: skip
    total = sum(c["cpu_s"] for c in result["rounds"])
    pre = (result.get("teacher_pretraining") or {}).get("cpu_s")
    lines += ["", (f"rounds together: {total:.1f} CPU-s; pre-training probe: "
                   f"{probe.get('cpu_s_per_step', float('nan')):.3f} CPU-s / step at batch {probe.get('batch_size')}; "
                   f"teacher's recorded pre-training: {pre if pre is None else f'{pre:.1f}'} CPU-s; "
                   f"load average at the end {', '.join(f'{x:.1f}' for x in result['load_average'])}")]  # fmt: skip
    return "\n".join(lines)


def main(argv=None) -> None:
    args = _args(argv)
    if args.report:
        print(report(json.loads(Path(args.report).read_text())))
        return
    if not (args.teacher and args.judge):
        raise SystemExit("--teacher and --judge are required (or --report FILE)")
    torch.set_num_threads(1)
    from tcsm.builders.loading import load_checkpoint, load_scorer_lm

    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    source, K = Path(args.teacher), int(args.start_steps)
    costs, runs = [], {}
    for r in range(1, int(args.rounds) + 1):
        run_dir = work / f"round{r}"
        if args.eval_only and not (run_dir / "ROUND_DONE").exists():
            break
        if K < args.ratio or K % args.ratio:
            raise SystemExit(f"round {r} would distil a {K}-step teacher by {args.ratio}; lower --rounds or --ratio, "
                             "or raise --start-steps")
        cost = train_round(source, K, run_dir, args)
        costs.append({"round": r, **cost})
        _log(f"round {r}: {K} -> {K // args.ratio} steps, {cost['cpu_s']:.0f} CPU-s ({cost['wall_s']:.0f} s wall)")
        runs[f"round{r}"] = run_dir
        source, K = run_dir, K // args.ratio

    probe = None if args.eval_only else probe_pretraining(Path(args.teacher), work / "pretrain_probe", args)
    if probe:
        _log(f"pre-training step (teacher config, batch {args.batch_size}): {probe['cpu_s_per_step']:.2f} CPU-s")
        for c in costs:
            if c.get("cpu_s_per_step"):
                c["pretraining_steps_per_step"] = c["cpu_s_per_step"] / probe["cpu_s_per_step"]
    device = torch.device("cpu")
    models = {"teacher": load_checkpoint(args.teacher, device=device)}
    models.update({name: load_checkpoint(d, device=device) for name, d in runs.items()})
    judge = load_scorer_lm(args.judge, device)
    steps = [int(k) for k in args.eval_steps.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    from tcsm.evaluation import generative_perplexity, sample_entropy

    data = models["teacher"].build_data()
    split = "test" if len(data.test) else "valid"  # a prepared corpus may hold no test split
    real = getattr(data, split)[: args.num_samples].long()  # the data's own values under the same judge
    data_row = {"gen_ppl": generative_perplexity(judge, token_ids=real, batch_size=32).gen_ppl,
                "entropy": sample_entropy(real)["entropy_mean"], "num": int(real.shape[0]), "split": split}  # fmt: skip
    _log(f"data ({split}): gen-PPL {data_row['gen_ppl']:.3f}  entropy {data_row['entropy']:.4f}")
    rows = evaluate(models, judge, steps, seeds, args)
    teacher_cost = json.loads(Path(args.teacher_cost).read_text()) if args.teacher_cost else None
    result = {
        "teacher": str(models["teacher"].directory), "teacher_step": models["teacher"].step, "judge": judge.name,
        "data": data.label, "data_test": data_row, "num_samples": args.num_samples, "seeds": seeds,
        "teacher_pretraining": teacher_cost, "pretraining_probe": probe, "rounds": costs, "summary": summary(rows), "rows": rows,
        "load_average": os.getloadavg(), "args": vars(args),
    }  # fmt: skip
    for row in result["summary"]:
        _log(f"{row['model']:>8} K={row['steps']:3d}: gen-PPL {row['gen_ppl_mean']:8.3f} ± {row['gen_ppl_sd']:.3f}  "
             f"entropy {row['entropy_mean']:.4f} ± {row['entropy_sd']:.4f}")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
