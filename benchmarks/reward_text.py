"""Reward fine-tuning on TinyStories: VADER sentiment vs generative perplexity (paper §5.2 / App. E, scaled down).

What runs (CPU only, everything through the library's Trainer and CLI functions):

1. Data: the TinyStories subset in ../shared/data/tinystories (first 2 MiB of the train split), ASCII-normalised,
   95% of the stories to train, 5% to validate. Default tokenizer: a byte-level BPE with 1024 tokens trained on
   the training stories (stories joined with EOS, 32-token chunks), so that samples are made of real words and
   a lexicon scorer has something to score; `--tokenizer char` uses characters (each story padded with "\n" to
   a multiple of L so it starts a chunk) — at this compute a character model's samples are mostly non-words.
2. Pre-training: a masked-source diffusion transformer (L_distrib, MDLM-style), `tcsm train` config.
3. Reference LM for generative perplexity: a causal transformer trained by the project on the same tokens and
   chunks (`model.name: causal`, `objective.name: clean_lm`). No pre-trained LM is available offline, so gen-PPL
   is measured under this small model (not GPT-2 Large as in the paper), on the continuation after the prompt.
4. Reward fine-tuning (`tcsm finetune reward` config, N^full SNIS, MATH.md §5.2) toward positive VADER sentiment
   with the prompt "Once upon a time, there was a" pinned, for B ∈ {2, 4, 8, 16} and a few β.
5. Evaluation: `--num-eval` prompted samples per model; mean VADER compound reward of the decoded text and gen-PPL
   of the continuation under the reference. Best-of-N (N ∈ {4, 8}) of the pre-trained model picks, per prompt,
   the sample with the highest reward out of N.

Outputs: benchmarks/results/reward_text.json (and <work>/results.json), the plot docs/reward_vs_ppl.png and a
markdown table on stdout (pasted into docs/benchmarks.md). Re-running resumes finished training runs. Example (≈30 min on a shared 2-core CPU):

    nice -n 10 .venv/bin/python benchmarks/reward_text.py --work runs/reward_text
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import time
import unicodedata
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "tinystories" / "train_head_2MiB.txt.gz"
PROMPT = "Once upon a time, there was a"
PAD = "\n"
#: normalisations applied before dropping the remaining non-ASCII characters
REPLACE = {
    "\u2019": "'",
    "\u2018": "'",
    "\u201c": '"',
    "\u201d": '"',
    "\u2014": "-",
    "\u2013": "-",
    "\u2026": "...",
}


# --------------------------------------------------------------------------------------------------- data


def read_stories() -> list[str]:
    """The subset's stories, ASCII-normalised, newlines folded into spaces (the last, cut-off story dropped)."""
    with gzip.open(DATA, "rt", encoding="utf-8") as f:
        raw = f.read()
    stories = []
    for s in raw.split("<|endoftext|>"):
        for a, b in REPLACE.items():
            s = s.replace(a, b)
        s = unicodedata.normalize("NFKD", s).encode("ascii", "ignore").decode("ascii")
        s = " ".join(s.split())  # newlines and runs of spaces → one space
        if len(s) >= 40:
            stories.append(s)
    return stories[:-1]


def prepare_data(work: Path, tokenizer: str, seq_len: int, vocab_size: int) -> dict:
    """Write the splits (95% / 5% of the stories) and return the data config section.

    char: every story is padded with "\n" to a multiple of L, so each story starts a chunk.
    bpe: one story per JSON line; a byte-level BPE of `vocab_size` is trained on the training stories and the
    stories are joined with EOS and cut into L-token chunks (tcsm.data.bpe).
    """
    out = work / "data"
    out.mkdir(parents=True, exist_ok=True)
    stories = read_stories()
    n_valid = max(1, len(stories) // 20)
    splits = {"train": stories[n_valid:], "valid": stories[:n_valid]}
    if tokenizer == "bpe":
        for name, group in splits.items():
            with open(out / f"{name}.jsonl", "w", encoding="utf-8") as f:
                f.writelines(json.dumps({"text": s}) + "\n" for s in group)
        return {
            "kind": "bpe",
            "train_path": str(out / "train.jsonl"),
            "valid_path": str(out / "valid.jsonl"),
            "tokenizer": "train",
            "vocab_size": vocab_size,
            "seq_len": seq_len,
            "eos": True,
            "name": f"tinystories-2MiB-bpe{vocab_size}",
        }

    def padded(group):
        return "".join(s + PAD * (-len(s) % seq_len) for s in group)

    for name, group in splits.items():
        (out / f"{name}.txt").write_text(padded(group), encoding="utf-8")
    vocab = "".join(sorted(set(padded(stories))))
    return {
        "kind": "text",
        "train_path": str(out / "train.txt"),
        "valid_path": str(out / "valid.txt"),
        "seq_len": seq_len,
        "vocab": vocab,
        "name": "tinystories-2MiB-char",
    }


# --------------------------------------------------------------------------------------------------- runs


def pretrain_config(data: dict, args):
    from tcsm.builders.config import load_config

    L = data["seq_len"]
    over = [
        "model.preset=tiny",
        "model.d_model=128",
        "model.n_layers=3",
        "model.n_heads=4",
        "model.cond_dim=32",
        f"model.max_len={L}",
        "model.time_conditioning=false",
        "path.source=masked",
        "path.schedule=linear",
        "objective.loss=distrib",
        "objective.weighting=kappa",
        "optim.lr=1e-3",
        "optim.warmup=200",
        "optim.decay=cosine",
        "optim.min_lr_ratio=0.1",
        f"train.steps={args.pretrain_steps}",
        "train.batch_size=64",
        "train.ema=0.995",
        "train.precision=fp32",
        f"train.threads={args.threads}",
        "train.eval_every=0",
        "train.eval_examples=128",
        "train.sample_every=0",
        "train.save_every=500",
        "train.log_every=100",
        "train.tensorboard=false",
        "train.progress=false",
        "eval.num_t=4",
        "sample.num=2",
        f"sample.steps={args.sample_steps}",
    ]
    return load_config(None, over, base={"data": data})


def causal_config(data: dict, args):
    from tcsm.builders.config import load_config

    over = [
        "model.name=causal",
        "model.preset=small",
        f"model.max_len={data['seq_len']}",
        "objective.name=clean_lm",
        "optim.lr=1e-3",
        "optim.warmup=200",
        "optim.decay=cosine",
        f"train.steps={args.ref_steps}",
        "train.batch_size=64",
        "train.ema=0.995",
        "train.precision=fp32",
        f"train.threads={args.threads}",
        "train.eval_every=0",
        "train.eval_examples=128",
        "train.sample_every=0",
        "train.save_every=500",
        "train.log_every=100",
        "train.tensorboard=false",
        "train.progress=false",
        "eval.num_t=4",
        "sample.num=0",
    ]
    return load_config(None, over, base={"data": data})


def finetune_config(pre_dir: Path, B: int, beta: float, args):
    from tcsm.recipes.reward.compose import reward_config

    over = [
        f"train.steps={args.finetune_steps}",
        f"train.batch_size={args.groups}",
        "optim.lr=3e-4",
        "optim.warmup=10",
        "objective.weighting=none",
        "target.sample_steps=32",
        "target.pool_size=256",
        "target.refresh_every=50",
        "train.save_every=100",
        "train.log_every=20",
        "train.eval_every=0",
        "train.sample_every=0",
        "train.progress=false",
        "train.ema=0.9",
        "train.eval_examples=64",
        "sample.num=0",
    ]
    values = {
        "target.reward": "vader",
        "target.prompt": PROMPT,
        "target.num_proposals": B,
        "target.beta": beta,
    }
    return reward_config(pre_dir, "finetune-reward", over, values)


def train_or_resume(cfg, run_dir: Path) -> float:
    from tcsm.train.fit import fit

    start = time.perf_counter()
    fit(cfg, run_dir, resume=True if (run_dir / "checkpoints").is_dir() else None, log=lambda s: None)
    return time.perf_counter() - start


# --------------------------------------------------------------------------------------------------- eval


class Judge:
    """VADER reward and continuation gen-PPL under the project's causal scorer LM."""

    def __init__(self, ref_model, data, prompt_len: int):
        from tcsm.rewards.functions import make_reward

        self.ref, self.data, self.P = ref_model.eval(), data, prompt_len
        self.reward = make_reward("vader", decode=data.decode)

    @torch.no_grad()
    def nll(self, x: torch.Tensor) -> torch.Tensor:
        """Per-sequence mean NLL (nats/token) of the continuation x[:, P:] given the prompt (the reference's
        `model(x)[:, j]` predicts x^j from x^{<j}); padding after the story's end is scored like any token."""
        out = []
        for s in range(0, x.shape[0], 64):
            xb = x[s : s + 64]
            lp = torch.log_softmax(self.ref(xb).float(), -1).gather(-1, xb.unsqueeze(-1)).squeeze(-1)
            out.append(-lp[:, self.P :].mean(-1))
        return torch.cat(out).double()

    def score(self, x: torch.Tensor) -> dict:
        from tcsm.rewards.functions import evaluate_reward

        r = evaluate_reward(self.reward, x).double()
        nll = self.nll(x)
        return {
            "reward_mean": float(r.mean()),
            "reward_stderr": float(r.std() / math.sqrt(r.numel())),
            "gen_ppl": float(math.exp(nll.mean())),
            "nll_stderr": float(nll.std() / math.sqrt(nll.numel())),
            "examples": [self.data.decode(row).rstrip(PAD) for row in x[:3]],
        }


def draw(model, path, data, n: int, args, seed: int) -> torch.Tensor:
    from tcsm.sampling import sample

    g = torch.Generator().manual_seed(seed)
    return sample(
        model,
        path,
        batch_size=n,
        length=data.seq_len,
        num_steps=args.sample_steps,
        generator=g,
        prompt=data.encode(PROMPT),
        chunk_size=256,
    )


# --------------------------------------------------------------------------------------------------- main


def plot(results: dict, out: Path) -> None:
    """Mean reward vs gen-PPL; error bars are ± one standard error (gen-PPL: from the per-sample NLL's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def bars(r):
        return {"xerr": r["gen_ppl"] * r["nll_stderr"], "yerr": r["reward_stderr"]}

    fig, ax = plt.subplots(figsize=(6.8, 4.6))
    pre = results["pretrained"]
    ax.errorbar(pre["gen_ppl"], pre["reward_mean"], fmt="ks", label="pre-trained", **bars(pre))
    for r in results["best_of_n"].values():
        ax.errorbar(
            r["gen_ppl"], r["reward_mean"], fmt="D", label=f"pre-trained, best-of-{r['N']}", **bars(r)
        )
    for beta in sorted({r["beta"] for r in results["finetuned"]}):
        rows = sorted((r for r in results["finetuned"] if r["beta"] == beta), key=lambda r: r["B"])
        line = ax.errorbar(
            [r["gen_ppl"] for r in rows],
            [r["reward_mean"] for r in rows],
            fmt="o-",
            xerr=[r["gen_ppl"] * r["nll_stderr"] for r in rows],
            yerr=[r["reward_stderr"] for r in rows],
            label=f"TCSM N^full fine-tuned, β={beta:g}",
        )
        for r in rows:
            ax.annotate(
                f"B={r['B']}",
                (r["gen_ppl"], r["reward_mean"]),
                fontsize=7,
                xytext=(4, -9),
                textcoords="offset points",
                color=line[0].get_color(),
            )
    ax.set_xlabel("gen-PPL of the continuation (project's causal LM, same BPE; lower is better)", fontsize=9)
    ax.set_ylabel("mean VADER compound (higher is better)", fontsize=9)
    ax.set_title(
        f"{results['data']}: reward vs gen-PPL (CPU scale, {results['config']['num_eval']} samples each)",
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="lower left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)


def table(results: dict) -> str:
    def ppl(r):
        return f"{r['gen_ppl']:.0f} ± {r['gen_ppl'] * r['nll_stderr']:.0f}"

    lines = [
        "| model | B (proposals) / N | β | mean VADER reward ± s.e. | gen-PPL of the continuation ± s.e. |",
        "|---|---|---|---|---|",
    ]
    pre = results["pretrained"]
    lines.append(
        f"| pre-trained | – | – | {pre['reward_mean']:.3f} ± {pre['reward_stderr']:.3f} | {ppl(pre)} |"
    )
    for r in results["best_of_n"].values():
        lines.append(
            f"| pre-trained, best-of-N | N = {r['N']} | – | {r['reward_mean']:.3f} ± "
            f"{r['reward_stderr']:.3f} | {ppl(r)} |"
        )
    for r in sorted(results["finetuned"], key=lambda r: (r["beta"], r["B"])):
        lines.append(
            f"| TCSM N^full fine-tuned | B = {r['B']} | {r['beta']:g} | {r['reward_mean']:.3f} ± "
            f"{r['reward_stderr']:.3f} | {ppl(r)} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="runs/reward_text", help="working directory (runs, data, results.json)")
    p.add_argument("--plot", default=str(ROOT / "docs" / "reward_vs_ppl.png"))
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "reward_text.json"))
    p.add_argument("--tokenizer", choices=("bpe", "char"), default="bpe")
    p.add_argument(
        "--bpe-vocab", type=int, default=1024, help="BPE vocabulary trained on the training stories"
    )
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default: bpe 32, char 64)")
    p.add_argument("--pretrain-steps", type=int, default=2000)
    p.add_argument("--ref-steps", type=int, default=1200)
    p.add_argument("--finetune-steps", type=int, default=120)
    p.add_argument("--groups", type=int, default=16, help="noisy states per fine-tuning step")
    p.add_argument("--proposals", default="2,4,8,16", help="B values")
    p.add_argument("--betas", default="0.1,0.3", help="β values (B sweep at each)")
    p.add_argument("--best-of", default="4,8", help="N values of the best-of-N baseline")
    p.add_argument("--num-eval", type=int, default=128, help="prompted samples per model")
    p.add_argument("--sample-steps", type=int, default=48)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="tiny smoke-test sizes (minutes): not a result")
    p.add_argument("--replot", action="store_true", help="only redraw the plot and table from --results")
    args = p.parse_args(argv)
    if args.replot:
        results = json.loads(Path(args.results).read_text())
        plot(results, Path(args.plot))
        print(table(results))
        return 0
    if args.quick:
        args.pretrain_steps, args.ref_steps, args.finetune_steps, args.num_eval = 60, 40, 6, 16
        args.proposals, args.betas, args.best_of, args.sample_steps = "2,4", "0.3", "4", 8
    if args.seq_len is None:
        args.seq_len = 32 if args.tokenizer == "bpe" else 64
    torch.set_num_threads(args.threads)
    work = Path(args.work)
    if args.quick:  # a smoke test never overwrites the reported results
        args.results, args.plot = str(work / "results.json"), str(work / "reward_vs_ppl.png")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    wall = {}

    data_cfg = prepare_data(work, args.tokenizer, args.seq_len, args.bpe_vocab)
    wall["pretrain_s"] = train_or_resume(pretrain_config(data_cfg, args), work / "pretrain")
    wall["reference_s"] = train_or_resume(causal_config(data_cfg, args), work / "reference")

    from tcsm.builders.loading import load_checkpoint

    pre = load_checkpoint(work / "pretrain")
    ref = load_checkpoint(work / "reference")
    data, path = pre.build_data(), pre.build_path()
    judge = Judge(ref.model, data, len(data.encode(PROMPT)))
    results: dict = {
        "config": {k: v for k, v in vars(args).items()},
        "prompt": PROMPT,
        "data": data.label,
        "vocab_size": data.vocab_size,
        "reference_summary": _last_eval(work / "reference"),
    }

    # Pre-trained baseline and best-of-N from one pool: row n·N + j is draw j for prompt n.
    Ns = [int(n) for n in args.best_of.split(",") if n]
    n_max = max(Ns + [1])
    start = time.perf_counter()
    pool = draw(pre.model, path, data, args.num_eval * n_max, args, seed=1)
    rewards = judge.reward(pool).reshape(args.num_eval, n_max)
    results["pretrained"] = judge.score(pool.reshape(args.num_eval, n_max, -1)[:, 0])
    results["best_of_n"] = {}
    for N in Ns:
        best = rewards[:, :N].argmax(-1)
        chosen = pool.reshape(args.num_eval, n_max, -1)[torch.arange(args.num_eval), best]
        results["best_of_n"][f"N={N}"] = {"N": N, **judge.score(chosen)}
    wall["baseline_eval_s"] = time.perf_counter() - start

    results["finetuned"] = []
    for beta in [float(b) for b in args.betas.split(",") if b]:
        for B in [int(b) for b in args.proposals.split(",") if b]:
            run_dir = work / f"ft_beta{beta:g}_B{B}"
            secs = train_or_resume(finetune_config(work / "pretrain", B, beta, args), run_dir)
            ck = load_checkpoint(run_dir)
            x = draw(ck.model, path, data, args.num_eval, args, seed=2)
            row = {"B": B, "beta": beta, "train_s": round(secs, 1), **judge.score(x)}
            results["finetuned"].append(row)
            print(
                f"β={beta:g} B={B}: reward {row['reward_mean']:.3f}, gen-PPL {row['gen_ppl']:.2f} "
                f"({secs:.0f} s)",
                flush=True,
            )
    wall["total_s"] = time.perf_counter() - t0
    results["wall_time_s"] = {k: round(v, 1) for k, v in wall.items()}
    for dest in (work / "results.json", Path(args.results)):
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    plot(results, Path(args.plot))
    print(table(results))
    return 0


def _last_eval(run_dir: Path) -> dict:
    f = run_dir / "summary.json"
    return json.loads(f.read_text()) if f.is_file() else {}


if __name__ == "__main__":
    raise SystemExit(main())
