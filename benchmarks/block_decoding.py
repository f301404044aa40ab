"""Decoding speed and quality: full-sequence diffusion (cached ancestral), block diffusion with its KV cache at
several steps per block, and the autoregressive model with its KV cache — generated tokens per CPU-second and
sample quality (generative perplexity under a separate causal judge, unigram entropy), at batch 1 and batch 16.

Every configuration draws once per round with the round's seed; rounds visit the configurations in turn
(interleaved), so machine load hits them alike. One torch thread; CPU time (`time.process_time`) is the measure,
wall time and the load average are recorded beside it. The judge is a small causal LM trained by the script on the
same data unless `--judge` is given (it is not the AR competitor, which would score its own samples).

    nice -n 5 .venv/bin/python benchmarks/block_decoding.py --full RUN --block RUN16[,RUN4] --ar RUN \
        --work-dir runs/block-decoding --rounds 3 --out benchmarks/results/block_decoding.json \
        --plot docs/img/block_decoding.png
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from genppl_vs_steps import _train, reference_config

DATA = Path(os.environ.get("TCSM_DATA_DIR") or Path(__file__).resolve().parents[1] / ".." / "shared" / "data")
TEXT8 = str(DATA / "text8" / "text8_prefix.txt.gz")


def configurations(args, models: dict) -> list[dict]:
    """(label, model key, sampler settings) for every configuration; steps are per block for block models."""
    out = []
    for k in (int(v) for v in args.full_steps.split(",")):
        out.append({"label": "full sequence, cached ancestral", "model": "full", "steps": k, "method": "ancestral"})
    for key in models:
        if not key.startswith("block"):
            continue
        for s in (int(v) for v in args.block_steps.split(",")):
            if s <= models[key]["block_length"]:
                out.append({"label": f"blocks of {models[key]['block_length']}, KV cache, ancestral", "model": key,
                            "steps": s, "method": "ancestral"})  # fmt: skip
    if "ar" in models:
        out.append({"label": "autoregressive, KV cache", "model": "ar", "steps": 1, "method": None})
    return out


def load(run: str):
    from tcsm.builders.assemble import build_objective_for_checkpoint
    from tcsm.builders.loading import load_checkpoint

    ckpt = load_checkpoint(run, device="cpu")
    ckpt.model.eval()
    path, data = ckpt.build_path(), ckpt.build_data()
    objective = build_objective_for_checkpoint(ckpt.config, ckpt.model, data, "cpu")
    return {"ckpt": ckpt, "path": path, "data": data, "objective": objective,
            "block_length": getattr(path, "block_length", None)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--full", required=True, help="full-sequence masked diffusion run")
    ap.add_argument("--block", default="", help="comma-separated block diffusion runs")
    ap.add_argument("--ar", default=None, help="autoregressive run of the same trunk")
    ap.add_argument("--judge", default=None, help="causal judge run (default: train one in --work-dir)")
    ap.add_argument("--work-dir", default="runs/block-decoding")
    ap.add_argument("--judge-steps", type=int, default=2000)
    ap.add_argument("--full-steps", default="16,32,64,128")
    ap.add_argument("--block-steps", default="1,2,4,8,16")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--num-samples", type=int, default=16, help="sequences per configuration and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--plot-from", default=None, help="a result JSON: plot and print its table, then exit")
    args = ap.parse_args()
    if args.plot_from:
        res = json.loads(Path(args.plot_from).read_text())
        if args.plot:
            plot(res, args.plot)
        print(table(res))
        return
    torch.set_num_threads(args.threads)

    from tcsm.builders.loading import load_scorer_lm
    from tcsm.evaluation import generative_perplexity, sample_entropy
    from tcsm.evaluation.report import write_report
    from tcsm.sampling.settings import SampleSettings, draw

    models = {"full": load(args.full)}
    for i, run in enumerate(r for r in args.block.split(",") if r):
        models[f"block{i}"] = load(run)
    if args.ar:
        models["ar"] = load(args.ar)
    L = int(models["full"]["ckpt"].data_info["seq_len"])
    if args.judge is None:
        cfg = reference_config(argparse.Namespace(length=L, ref_train_steps=args.judge_steps, seed=7))
        cfg["data"]["path"] = TEXT8
        args.judge = str(_train(cfg, Path(args.work_dir) / "judge", print))
    judge = load_scorer_lm(args.judge, "cpu")
    data = models["full"]["data"]
    real = data.test[: 64].long()
    data_ppl = generative_perplexity(judge, token_ids=real).gen_ppl
    data_ent = sample_entropy(real)["entropy_mean"]
    print(f"data: gen-PPL {data_ppl:.2f}, entropy {data_ent:.3f}", flush=True)

    confs = [{**c, "batch": b} for b in (int(v) for v in args.batches.split(",")) for c in configurations(args, models)]
    runs: dict[int, list[dict]] = {i: [] for i in range(len(confs))}
    loads = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for i, c in enumerate(confs):
            m = models[c["model"]]
            settings = SampleSettings(steps=c["steps"], method=c["method"])
            g = torch.Generator().manual_seed(1000 * r + 1)
            xs, calls, cpu, wall = [], 0.0, 0.0, 0.0
            for _ in range(max(1, args.num_samples // c["batch"])):
                t0, c0 = time.perf_counter(), time.process_time()
                with torch.no_grad():
                    x, st = draw(m["ckpt"].model, m["path"], c["batch"], L, settings, objective=m["objective"],
                                 generator=g, device="cpu")  # fmt: skip
                wall += time.perf_counter() - t0
                cpu += time.process_time() - c0
                xs.append(x)
                calls += float(getattr(st, "num_calls", 0) or 0)
            x = torch.cat(xs)
            runs[i].append({"gen_ppl": generative_perplexity(judge, token_ids=x).gen_ppl,
                            "entropy": sample_entropy(x)["entropy_mean"], "tokens_per_cpu_s": x.numel() / cpu,
                            "tokens_per_wall_s": x.numel() / wall, "cpu_s": cpu, "wall_s": wall,
                            "calls": calls / len(xs), "example": data.decode(x[0])})  # fmt: skip
            last = runs[i][-1]
            print(f"round {r} b={c['batch']:2d} {c['label']:40s} steps={c['steps']:3d}: "
                  f"{last['tokens_per_cpu_s']:8.1f} tok/CPU-s  gen-PPL {last['gen_ppl']:6.2f}  "
                  f"entropy {last['entropy']:.3f}  calls {last['calls']:.0f}", flush=True)  # fmt: skip
    rows = []
    for i, c in enumerate(confs):
        rs = runs[i]
        ppls = [x["gen_ppl"] for x in rs]
        rows.append({**c, "gen_ppl": statistics.mean(ppls), "gen_ppl_sd": statistics.stdev(ppls) if len(ppls) > 1 else 0.0,
                     "entropy": statistics.mean(x["entropy"] for x in rs),
                     "tokens_per_cpu_s": statistics.median(x["tokens_per_cpu_s"] for x in rs),
                     "tokens_per_wall_s": statistics.median(x["tokens_per_wall_s"] for x in rs),
                     "calls": statistics.mean(x["calls"] for x in rs), "example": rs[0]["example"]})  # fmt: skip
    result = {"runs": {k: str(v["ckpt"].directory) for k, v in models.items()}, "judge": judge.name,
              "data": data.label, "length": L, "num_samples": args.num_samples, "rounds": args.rounds,
              "threads": args.threads, "load_avg_1min": loads, "data_gen_ppl": data_ppl, "data_entropy": data_ent,
              "command": " ".join(sys.argv), "rows": rows}  # fmt: skip
    if args.out:
        write_report(args.out, result)
    if args.plot:
        plot(result, args.plot)
    print(table(result))


def table(res: dict) -> str:
    out = ["| batch | decoder | steps (per block) | calls / batch | tokens / CPU-s | gen-PPL (± sd) | entropy |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in res["rows"]:
        out.append(f"| {r['batch']} | {r['label']} | {r['steps'] if r['method'] else '–'} | {r['calls']:.0f} "
                   f"| {r['tokens_per_cpu_s']:.1f} | {r['gen_ppl']:.1f} ± {r['gen_ppl_sd']:.1f} | {r['entropy']:.3f} |")  # fmt: skip
    return "\n".join(out)


def plot(res: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({r["batch"] for r in res["rows"]})
    fig, axes = plt.subplots(1, len(batches), figsize=(5.5 * len(batches), 4.2), squeeze=False)
    for ax, b in zip(axes[0], batches):
        rows = [r for r in res["rows"] if r["batch"] == b]
        for i, label in enumerate(dict.fromkeys(r["label"] for r in rows)):
            rs = sorted((r for r in rows if r["label"] == label), key=lambda r: r["tokens_per_cpu_s"])
            ax.errorbar([r["tokens_per_cpu_s"] for r in rs], [r["gen_ppl"] for r in rs],
                        yerr=[r["gen_ppl_sd"] for r in rs], marker="o", label=label, color=plt.cm.tab10(i))  # fmt: skip
        ax.axhline(res["data_gen_ppl"], color="gray", linestyle=":", label="real test data")
        ax.set_xscale("log")
        ax.set_xlabel("generated tokens per CPU-second (1 thread)")
        ax.set_ylabel("gen-PPL under the judge")
        ax.set_title(f"batch {b}")
        ax.legend(fontsize=7)
    fig.suptitle(f"{res['data']}, L={res['length']}: quality against decoding speed")
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main()
