"""The Hugging Face worked example of docs/huggingface.md, end to end on Tiny Shakespeare characters (CPU minutes):

1. pretrain a tiny GPT-2 (transformers, random init, a plain next-character loop) and save it as a local HF model;
2. adapt it into a masked diffusion denoiser (`tcsm train model.name=hf_denoiser`: bidirectional attention, the AR
   shift handled) and train it with the TCSM objective;
3. instruction-tune it (`tcsm finetune sft`) on prompt/response pairs made from the play's dialogue (a speaker's line
   → the next speaker's reply);
4. reward fine-tune it (`tcsm finetune reward --reward vader`: positive sentiment);
5. export it (`tcsm export`), load it with `transformers.AutoModelForMaskedLM(..., trust_remote_code=True)`, check
   its logits against tcsm's, and sample replies to a prompt with the transformers model.

Every figure is printed and collected in OUT/figures.json. Sizes are tiny on purpose (a demonstration of the
pipeline, not of quality): see docs/huggingface.md for a recorded run.

    python benchmarks/hf_worked_example.py --out /tmp/hf-example
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "shakespeare" / "tinyshakespeare.txt.gz"


def tcsm(*args: str) -> str:
    """Run a tcsm command (a subprocess: benchmarks never import the CLI), echo it, return its stdout."""
    print("$ tcsm " + " ".join(args), flush=True)
    t0 = time.time()
    res = subprocess.run([sys.executable, "-m", "tcsm.cli", *args], capture_output=True, text=True, check=False)
    print(res.stdout[-1500:], end="")
    if res.returncode != 0:
        sys.exit(f"failed ({res.returncode}): {res.stderr[-2000:]}")
    print(f"  [{time.time() - t0:.0f} s]", flush=True)
    return res.stdout


def pretrain_gpt2(text: str, out: Path, steps: int, seq: int, seed: int) -> dict:
    """A 2-layer GPT-2 over the play's 65 characters (+ BOS), trained on next-character prediction."""
    import torch
    import transformers as tf

    from tcsm.builders.export import char_tokenizer_json

    chars = "".join(sorted(set(text)))
    ids = torch.tensor([chars.index(c) for c in text])
    n_valid = len(ids) // 20
    train, valid = ids[:-n_valid], ids[-n_valid:]
    V = len(chars)
    torch.manual_seed(seed)
    cfg = tf.GPT2Config(vocab_size=V + 1, n_positions=seq + 1, n_embd=128, n_layer=2, n_head=4, bos_token_id=V,
                        eos_token_id=V, architectures=["GPT2LMHeadModel"])  # fmt: skip
    model = tf.GPT2LMHeadModel(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(seed)

    def batch(src, b):
        start = torch.randint(0, len(src) - seq, (b,), generator=g)
        x = torch.stack([src[s : s + seq] for s in start.tolist()])
        return torch.cat([torch.full((b, 1), V), x], dim=1)

    def nll(x):
        logits = model(input_ids=x[:, :-1]).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, V + 1), x[:, 1:].reshape(-1))

    t0 = time.time()
    for step in range(steps):
        loss = nll(batch(train, 32))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0:
            print(f"  gpt2 step {step}: {loss.item() / math.log(2):.3f} bits/char", flush=True)
    model.eval()
    with torch.no_grad():
        g.manual_seed(seed + 1)
        vals = torch.stack([nll(batch(valid, 64)) for _ in range(8)])
    bits = (vals / math.log(2)).tolist()
    mean = sum(bits) / len(bits)
    se = (sum((b - mean) ** 2 for b in bits) / (len(bits) - 1) / len(bits)) ** 0.5
    model.save_pretrained(out)
    tok = char_tokenizer_json(chars, mask=False)
    tok["added_tokens"] = [{"id": V, "content": "<bos>", "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": True}]  # fmt: skip
    (out / "tokenizer.json").write_text(json.dumps(tok))
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                           "bos_token": "<bos>"}))  # fmt: skip
    return {"steps": steps, "valid_bits_per_char": mean, "valid_bits_per_char_stderr": se,
            "seconds": time.time() - t0, "parameters": sum(p.numel() for p in model.parameters())}  # fmt: skip


def dialogue_pairs(text: str, limit: int) -> list[dict]:
    """(speaker's first line → next speaker's name and first line) records in TRL's prompt/completion format."""
    blocks = [b.strip().split("\n") for b in text.split("\n\n") if b.count("\n") >= 1]
    out = []
    for a, b in itertools.pairwise(blocks):
        if len(a) >= 2 and len(b) >= 2 and a[0].endswith(":") and b[0].endswith(":"):
            out.append({"prompt": f"{a[0]}\n{a[1]}\n\n", "completion": f"{b[0]}\n{b[1]}\n"})
        if len(out) == limit:
            break
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/hf-example", help="working directory (default runs/hf-example)")
    p.add_argument("--data", default=str(DATA), help="tinyshakespeare.txt.gz")
    p.add_argument("--gpt2-steps", type=int, default=400)
    p.add_argument("--steps", type=int, default=300, help="denoiser steps")
    p.add_argument("--sft-steps", type=int, default=150)
    p.add_argument("--reward-steps", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reuse", action="store_true", help="keep the stages already finished in --out")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "2")

    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures: dict = {"load_avg_start": os.getloadavg()}
    with gzip.open(args.data, "rt", encoding="utf-8") as f:
        text = f.read()
    seq = 128

    print("1. pretrain a tiny GPT-2 on characters", flush=True)
    done = out / "gpt2.json"
    if not (args.reuse and done.is_file()):
        done.write_text(json.dumps(pretrain_gpt2(text, out / "gpt2-chars", args.gpt2_steps, seq, args.seed)))
    figures["gpt2"] = json.loads(done.read_text())
    print(f"  {figures['gpt2']}", flush=True)

    common = ["train.progress=false", "train.tensorboard=false", "train.device=cpu", "train.precision=fp32",
              f"train.threads={os.environ['OMP_NUM_THREADS']}", "train.log_every=50", "sample.num=0"]  # fmt: skip
    print("2. adapt it into a masked diffusion denoiser and train it with TCSM", flush=True)
    if not (args.reuse and (out / "denoiser" / "summary.json").is_file()):
        tcsm("train", "--config", "synthetic", "-o", str(out / "denoiser"), "--overwrite",
         "data.kind=text", f"data.path={args.data}", f"data.seq_len={seq}", "model.name=hf_denoiser",
         f"model.name_or_path={out / 'gpt2-chars'}", "path.schedule=loglinear", f"train.steps={args.steps}",
         "train.batch_size=32", f"train.eval_every={args.steps // 2}", "train.eval_examples=256", "eval.num_t=4",
         "optim.lr=5e-4", "optim.warmup=20", "train.ema=0.98", *common)  # fmt: skip
    figures["denoiser"] = json.loads((out / "denoiser" / "summary.json").read_text())
    figures["denoiser_first_eval"] = [
        json.loads(r) for r in (out / "denoiser" / "metrics.jsonl").read_text().splitlines()
        if json.loads(r).get("kind") == "valid"
    ][:1]

    print("3. instruction-tune it on dialogue pairs", flush=True)
    pairs = dialogue_pairs(text, 3000)
    with open(out / "dialogue.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in pairs)
    figures["sft_records"] = len(pairs)
    if not (args.reuse and (out / "sft" / "summary.json").is_file()):
        tcsm("finetune", "sft", "--from", str(out / "denoiser"), "--data", str(out / "dialogue.jsonl"), "--truncate",
         "--steps", str(args.sft_steps), "-o", str(out / "sft"), "--overwrite", "data.pad=$", "optim.lr=3e-4",
         "train.batch_size=32", f"train.eval_every={args.sft_steps}", "train.eval_examples=256", *common)  # fmt: skip
    figures["sft"] = json.loads((out / "sft" / "summary.json").read_text())

    print("4. reward fine-tuning (VADER sentiment)", flush=True)
    # A small sample pool and few proposals: VADER scores text on the CPU, and the pool is redrawn by sampling.
    if not (args.reuse and (out / "reward" / "summary.json").is_file()):
        tcsm("finetune", "reward", "--from", str(out / "sft"), "--reward", "vader", "--steps", str(args.reward_steps),
         "-o", str(out / "reward"), "--overwrite", "--eval-samples", "32", "train.batch_size=8",
         "target.pool_size=64", "target.sample_steps=32", "target.num_proposals=4", "target.refresh_every=1000",
         "data.kind=text", f"data.path={args.data}", f"data.seq_len={seq}",  # validation: the play's text
         f"train.eval_every={args.reward_steps}", "train.eval_examples=64", *common)  # fmt: skip
    figures["reward"] = {k: v for k, v in json.loads((out / "reward" / "summary.json").read_text()).items()}
    report = out / "reward" / "reward_eval.json"
    if report.is_file():
        figures["reward_eval"] = json.loads(report.read_text())

    print("5. export, load with transformers, sample", flush=True)
    tcsm("export", str(out / "reward"), "-o", str(out / "export"), "--overwrite")
    import transformers as tf

    import tcsm as lib

    hf = tf.AutoModelForMaskedLM.from_pretrained(str(out / "export"), trust_remote_code=True).eval()
    ours = lib.from_pretrained(out / "export")
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randint(0, 66, (4, seq), generator=g)
    with torch.no_grad():
        diff = (hf(input_ids=x).logits - ours(x)).abs().max().item()
    figures["export_max_abs_logit_diff"] = diff
    tok = tf.AutoTokenizer.from_pretrained(str(out / "export"), trust_remote_code=True)
    prompt = "ROMEO:\nWhat light through yonder window breaks?\n\n"
    ids = torch.tensor(tok(prompt)["input_ids"])
    path = lib.MaskedPath(vocab_size=65, schedule=lib.LogLinearSchedule())
    B = 4

    def denoise(xt, t):
        return hf(input_ids=xt, timesteps=t).logits

    with torch.no_grad():
        samples = lib.sample(denoise, path, batch_size=B, length=seq, num_steps=64, generator=g, prompt=ids,
                             time_independent=True)  # fmt: skip
    figures["samples"] = [tok.decode(s.tolist()) for s in samples]
    figures["load_avg_end"] = os.getloadavg()
    (out / "figures.json").write_text(json.dumps(figures, indent=1, default=str))
    print(json.dumps({k: v for k, v in figures.items() if k != "samples"}, indent=1, default=str))
    for s in figures["samples"]:
        print("---\n" + s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
