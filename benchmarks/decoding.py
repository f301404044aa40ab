"""Quality against compute for every sampler of a masked model: generative perplexity under a fixed causal judge,
unigram entropy (repetition collapse), wall and CPU time, against the network calls per sequence.

Samplers: the cached ancestral sampler (MDLM; K steps give at most min(K, L) calls), the decoding orders of
`tcsm.sampling.decoding` (random, confidence, margin, entropy at K = calls; threshold at several thresholds), and
semi-autoregressive blocks (`--block-length`) with the confidence order and with the ancestral law inside. Every
configuration is drawn once per round with the round's seed; rounds visit the configurations in turn (interleaved)
so that machine load hits them alike. Models: as in `genppl_vs_steps.py`, pass `--checkpoint` / `--reference` or
let the script train both on text8-prefix (`--train-steps`, `--ref-train-steps`).

    nice -n 5 .venv/bin/python benchmarks/decoding.py --work-dir runs/decoding-bench --length 64 --rounds 3 \
        --out benchmarks/results/decoding.json --plot docs/img/decoding_quality_vs_calls.png
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
from genppl_vs_steps import _train, diffusion_config, reference_config

DATA = Path(os.environ.get("TCSM_DATA_DIR") or Path(__file__).resolve().parents[1] / ".." / "shared" / "data")
TEXT8 = str(DATA / "text8" / "text8_prefix.txt.gz")


def configurations(
    L: int, calls: list[int], thresholds: list[float], block: int, temps: list[float]
) -> list[dict]:
    out = [{"label": "ancestral (cached)", "method": "ancestral", "steps": k} for k in calls + [2 * L, 4 * L]]
    # the ancestral sampler cooled: the entropy-for-gen-PPL trade that confidence orders make, at its own cost
    out += [{"label": f"ancestral (cached), T={t}", "method": "ancestral", "steps": k, "temperature": t}
            for t in temps for k in calls + [2 * L]]  # fmt: skip
    for m in ("random", "confidence", "margin", "entropy"):
        out += [{"label": m, "method": m, "steps": k} for k in calls]
    out += [{"label": "threshold", "method": "threshold", "steps": L, "threshold": th} for th in thresholds]
    nb = L // block
    out += [{"label": f"confidence, blocks of {block}", "method": "confidence", "steps": k, "block_length": block}
            for k in calls if k >= nb]  # fmt: skip
    out += [{"label": f"ancestral, blocks of {block}", "method": "ancestral", "steps": k, "block_length": block}
            for k in calls if k >= nb]  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="masked diffusion run (default: train one in --work-dir)")
    ap.add_argument("--reference", help="causal judge run (default: train one in --work-dir)")
    ap.add_argument("--work-dir", default="runs/decoding-bench")
    ap.add_argument("--length", type=int, default=64)
    ap.add_argument("--train-steps", type=int, default=1200)
    ap.add_argument("--ref-train-steps", type=int, default=800)
    ap.add_argument("--calls", default="8,16,32,64", help="network-call budgets K (<= length)")
    ap.add_argument("--thresholds", default="0.3,0.5,0.7,0.9,0.99")
    ap.add_argument("--block-length", type=int, default=16)
    ap.add_argument(
        "--temperatures", default="", help="also the cached ancestral sampler at these temperatures"
    )
    ap.add_argument("--only", default=None, help="only configurations whose label contains this text")
    ap.add_argument("--num-samples", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument(
        "--plot-from", default=None, help="comma-separated result JSONs: plot their rows together and exit"
    )
    args = ap.parse_args()
    if args.plot_from:
        res = [json.loads(Path(f).read_text()) for f in args.plot_from.split(",")]
        r0 = res[0]
        title = f"{r0['data']}, L={r0['length']}, {r0['num_samples']} samples × {r0['rounds']} rounds"
        rows = [r for x in res for r in x["rows"]]
        if args.plot:
            plot(rows, r0["data_gen_ppl"], r0["data_entropy"], args.plot, title)
        print(table(rows))
        return
    torch.set_num_threads(args.threads)
    args.seed = 0

    from tcsm.builders.loading import load_checkpoint, load_scorer_lm
    from tcsm.evaluation import generative_perplexity, sample_entropy
    from tcsm.evaluation.report import write_report
    from tcsm.sampling.settings import SampleSettings, draw

    work = Path(args.work_dir)
    for which, make in (("checkpoint", diffusion_config), ("reference", reference_config)):
        if getattr(args, which) is None:
            cfg = make(args)
            cfg["data"]["path"] = TEXT8
            setattr(
                args, which, str(_train(cfg, work / ("diffusion" if which == "checkpoint" else which), print))
            )

    ckpt = load_checkpoint(args.checkpoint, device="cpu")
    path, data = ckpt.build_path(), ckpt.build_data()
    judge = load_scorer_lm(args.reference, "cpu")
    L = int(ckpt.data_info["seq_len"])
    real = data.test[: args.num_samples].long()
    data_ppl = generative_perplexity(judge, token_ids=real).gen_ppl
    data_ent = sample_entropy(real)["entropy_mean"]
    print(f"data: gen-PPL {data_ppl:.2f}, entropy {data_ent:.3f}", flush=True)

    confs = configurations(L, [int(c) for c in args.calls.split(",")],
                           [float(t) for t in args.thresholds.split(",")], args.block_length,
                           [float(t) for t in args.temperatures.split(",") if t])  # fmt: skip
    if args.only:
        confs = [c for c in confs if args.only in c["label"]]
    runs: dict[int, list[dict]] = {i: [] for i in range(len(confs))}
    loads = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        for i, c in enumerate(confs):
            s = SampleSettings(steps=c["steps"], method=c["method"], threshold=c.get("threshold", 0.9),
                               block_length=c.get("block_length"), temperature=c.get("temperature", 1.0))  # fmt: skip
            g = torch.Generator().manual_seed(1000 * r + 1)
            t0, c0 = time.perf_counter(), time.process_time()
            x, st = draw(ckpt.model, path, args.num_samples, L, s, generator=g, device="cpu")
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            ppl = generative_perplexity(judge, token_ids=x).gen_ppl
            ent = sample_entropy(x)["entropy_mean"]
            calls = float(st.row_calls.double().mean())
            runs[i].append({"gen_ppl": ppl, "entropy": ent, "calls": calls, "wall_s": wall, "cpu_s": cpu,
                            "example": data.decode(x[0])})  # fmt: skip
            print(f"round {r} {c['label']:28s} K={c['steps']:4d} th={c.get('threshold', '-')}: calls {calls:5.1f} "
                  f"gen-PPL {ppl:6.2f} entropy {ent:.3f} wall {wall:.2f}s cpu {cpu:.2f}s", flush=True)  # fmt: skip
    rows = []
    for i, c in enumerate(confs):
        rs = runs[i]
        ppls = [x["gen_ppl"] for x in rs]
        rows.append({**c, "calls": statistics.mean(x["calls"] for x in rs), "gen_ppl": statistics.mean(ppls),
                     "gen_ppl_sd": statistics.stdev(ppls) if len(ppls) > 1 else 0.0,
                     "entropy": statistics.mean(x["entropy"] for x in rs),
                     "wall_s": statistics.median(x["wall_s"] for x in rs),
                     "cpu_s": statistics.median(x["cpu_s"] for x in rs), "example": rs[0]["example"]})  # fmt: skip
    result = {"checkpoint": str(ckpt.directory), "step": ckpt.step, "reference": judge.name, "data": data.label,
              "length": L, "num_samples": args.num_samples, "rounds": args.rounds, "threads": args.threads,
              "load_avg_1min": loads, "data_gen_ppl": data_ppl, "data_entropy": data_ent, "rows": rows}  # fmt: skip
    if args.out:
        write_report(args.out, result)
    if args.plot:
        plot(
            rows,
            data_ppl,
            data_ent,
            args.plot,
            f"{data.label}, L={L}, {args.num_samples} samples × {args.rounds}",
        )
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))


def table(rows: list[dict]) -> str:
    """Markdown: one line per configuration, in the order run."""
    out = ["| sampler | K | threshold | calls / seq | gen-PPL (± sd over rounds) | entropy | CPU s | wall s |",
           "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        out.append(f"| {r['label']} | {r['steps'] if r['method'] != 'threshold' else '–'} | {r.get('threshold', '–')} "
                   f"| {r['calls']:.1f} | {r['gen_ppl']:.1f} ± {r['gen_ppl_sd']:.1f} | {r['entropy']:.3f} "
                   f"| {r['cpu_s']:.2f} | {r['wall_s']:.1f} |")  # fmt: skip
    return "\n".join(out)


def plot(rows: list[dict], data_ppl: float, data_ent: float, out: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = list(dict.fromkeys(r["label"] for r in rows))
    main = [lab for lab in labels if "T=" not in lab]
    cooled = [lab for lab in labels if "T=" in lab]
    for label in labels:
        rs = sorted((r for r in rows if r["label"] == label), key=lambda r: r["calls"])
        if label in cooled:  # the cooled ancestral sampler: grey, darker when colder
            color, style, marker = str(0.25 + 0.5 * cooled.index(label) / max(1, len(cooled) - 1)), ":", "."
        else:
            color, style, marker = plt.cm.tab10(main.index(label)), "--" if "blocks" in label else "-", "o"
        kw = {"marker": marker, "linestyle": style, "label": label, "color": color}
        a.errorbar(
            [r["calls"] for r in rs], [r["gen_ppl"] for r in rs], yerr=[r["gen_ppl_sd"] for r in rs], **kw
        )
        b.plot([r["calls"] for r in rs], [r["entropy"] for r in rs], **kw)
    for ax, ref, name in ((a, data_ppl, "gen-PPL (judge)"), (b, data_ent, "unigram entropy (nats)")):
        ax.axhline(ref, color="gray", linestyle=":", label="real test data")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("network calls per sequence")
        ax.set_ylabel(name)
    a.set_yscale("log")
    b.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
