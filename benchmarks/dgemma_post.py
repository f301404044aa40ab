"""A tiny DiffusionGemma trained from random weights on TinyStories, then post-trained with tcsm (CPU, one thread).

Stages (each resumes: a finished run is not redone), all through the `tcsm` CLI except the timing:

1. data: the first 2 MiB of TinyStories train (../shared/data), a byte-level BPE of `--vocab` tokens trained by
   `tcsm prepare`, `--seq-len`-token chunks; prompt/completion records (the first `--prompt-words` words of a
   story, the next words as the completion, fitted to the length) for SFT.
2. a random `DiffusionGemmaForBlockDiffusion` of transformers' own classes (a few experts, canvas `--canvas`),
   saved as its own directory; `tcsm train model.name=diffusion_gemma` on the chunks for `--pretrain-steps`.
3. SFT (`tcsm finetune sft`): the reference recipe (`objective.recipe=reference`) and TCSM's L_distrib on the
   same uniform block path; the completion | prompt bound (eval.t_max) before (a 1-step run at lr 0) and after,
   and samples of both models with the prompt "Once upon a time".
4. reward (`tcsm finetune reward --reward vader`, on-policy x_t), seeds `--seeds`: mean reward before and after.
5. step time: the reference SFT step through tcsm (its objective and model, AdamW, clipping) against the same
   recipe written by hand with plain PyTorch and transformers' own calls, interleaved rounds, CPU time.
6. LoRA against full SFT: trainable parameters and the peak resident set of a whole `tcsm finetune sft` run,
   each in a fresh process.

    nice -n 10 .venv/bin/python benchmarks/dgemma_post.py --work runs/dgemma_post       # everything
    .venv/bin/python benchmarks/dgemma_post.py --work /tmp/dgp --only step --rounds 1    # one stage, smoke
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "tinystories" / "train_head_2MiB.txt.gz"
PROMPT = "Once upon a time"
QUIET = ["train.device=cpu", "train.threads=1", "train.progress=false", "train.tensorboard=false",
         "train.precision=fp32"]  # fmt: skip


def stories() -> list[str]:
    with gzip.open(DATA, "rt", encoding="utf-8") as f:
        raw = f.read().split("<|endoftext|>")[:-1]  # the last story is cut off
    return [" ".join(s.encode("ascii", "ignore").decode().split()) for s in raw if s.strip()]


def cli(*argv) -> None:
    """`tcsm ARGV` as a user runs it (`python -m tcsm.cli`), one thread; its CPU time counts in `cpu()`."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "tcsm.cli", *map(str, argv)], env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"tcsm {' '.join(map(str, argv[:2]))} failed ({done.returncode})")


def cpu() -> float:
    """CPU seconds of this process and of the finished `tcsm` runs it started."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def tiny_dgemma(V: int, k: int, a) -> torch.nn.Module:
    import transformers as T

    text = T.DiffusionGemmaTextConfig(
        vocab_size=V, hidden_size=a.hidden, intermediate_size=2 * a.hidden, num_hidden_layers=a.layers,
        num_attention_heads=2, num_key_value_heads=1, head_dim=a.hidden // 2, global_head_dim=a.hidden // 2,
        num_experts=4, top_k_experts=2, moe_intermediate_size=a.hidden, sliding_window=2 * k,
        layer_types=["sliding_attention", "full_attention"] * (a.layers // 2), max_position_embeddings=a.seq_len,
        pad_token_id=0, eos_token_id=0, bos_token_id=0,
    )  # fmt: skip
    vision = T.Gemma4VisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=1,
                                  num_key_value_heads=1, head_dim=8)  # fmt: skip
    cfg = T.DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=k, image_token_id=V + 100,
                                 boi_token_id=V + 101, eoi_token_id=V + 102)  # fmt: skip
    torch.manual_seed(0)
    return T.DiffusionGemmaForBlockDiffusion(cfg)


# ------------------------------------------------------------------------------------------------ stages


def stage_data(w: Path, a) -> None:
    from tcsm.data.prepare import prepare

    if (w / "shards" / "index.json").is_file():
        return
    docs = stories()
    (w / "stories.txt").write_text("\n".join(docs), encoding="utf-8")
    prepare([str(w / "stories.txt")], w / "shards", f"bpe:{a.vocab}", doc_separator="\n", progress=False,
            valid_fraction=0.05, test_fraction=0)  # fmt: skip
    recs = []
    for s in docs:
        words = s.split()
        if len(words) > a.prompt_words + 4:
            recs.append({"prompt": " ".join(words[: a.prompt_words]),
                         "completion": " " + " ".join(words[a.prompt_words : a.prompt_words + a.completion_words])})
    (w / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[: a.sft_records]))


def vocab(w: Path) -> int:
    return int(json.loads((w / "shards" / "index.json").read_text())["vocab_size"])


def stage_pretrain(w: Path, a) -> dict:
    if not (w / "model").is_dir():
        tiny_dgemma(vocab(w), a.canvas, a).save_pretrained(w / "model")
    t0 = cpu()
    if not (w / "pre" / "summary.json").is_file():
        cli("train", "-o", w / "pre", "data.kind=shards", f"data.path={w / 'shards'}", f"data.seq_len={a.seq_len}",
            "data.windows=random", "path.source=uniform", f"path.block_length={a.canvas}", "model.name=diffusion_gemma",
            f"model.name_or_path={w / 'model'}", f"train.steps={a.pretrain_steps}", "train.batch_size=16",
            "optim.lr=2e-3", "train.eval_every=0", "train.sample_every=0", "sample.num=0", "train.eval_examples=128",
            f"eval.t_max={a.t_max}", *QUIET)  # fmt: skip
    import transformers as T

    hf = T.DiffusionGemmaForBlockDiffusion.from_pretrained(w / "model")
    text = hf.num_parameters()  # tied copies once
    return {"pretrain_cpu_s": round(cpu() - t0, 1), "params": text,
            "pretrain_bound": {k: v for k, v in summary(w / "pre").items() if not isinstance(v, (dict, list))}}


def sft(w: Path, name: str, a, *extra) -> Path:
    out = w / name
    if not (out / "summary.json").is_file():
        cli("finetune", "sft", "--from", w / "pre", "--data", w / "sft.jsonl", "-o", out, "--truncate",
            "train.eval_every=0", "train.sample_every=0", "sample.num=0", "objective.eval_num_t=4",
            "train.eval_examples=64", "data.valid_frac=0.1", f"eval.t_max={a.t_max}", "train.batch_size=16", *extra,
            *QUIET)  # fmt: skip
    return out


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def samples(run: Path, w: Path, tag: str) -> list[str]:
    out = w / f"samples-{tag}.jsonl"
    if not out.is_file():
        cli("sample", run, "--prompt", PROMPT, "-n", "4", "--steps", "8", "--seed", "0", "--format", "jsonl", "-o", out,
            "--no-progress")  # fmt: skip
    return [json.loads(r)["text"] for r in out.read_text().splitlines()]


def stage_sft(w: Path, a) -> dict:
    res = {}
    t0 = cpu()
    before = sft(w, "sft-before", a, "--steps", "1", "optim.lr=1e-12", "objective.recipe=reference")  # lr 0 refused
    ref = sft(w, "sft-ref", a, "--steps", str(a.sft_steps), "objective.recipe=reference", "optim.lr=1e-3")
    tcsm = sft(w, "sft-tcsm", a, "--steps", str(a.sft_steps), "optim.lr=1e-3")
    res["sft_cpu_s"] = cpu() - t0
    for tag, run in (("before", before), ("reference", ref), ("tcsm", tcsm)):
        s = summary(run)
        res[f"bound_{tag}"] = {k: s[k] for k in ("bound", "bpc", "bpc_stderr", "nats_per_token", "num_sequences")
                               if k in s}  # fmt: skip
        res[f"samples_{tag}"] = samples(run, w, tag)
    return res


def stage_reward(w: Path, a) -> dict:
    rows = []
    for seed in a.seeds:
        out = w / f"reward-{seed}"
        if not (out / "reward_eval.json").is_file():
            cli("finetune", "reward", "--from", w / "pre", "--reward", "vader", "--prompt", PROMPT, "-B", "4",
                "--xt-source", "model", "--steps", str(a.reward_steps), "--eval-samples", "64", "-o", out,
                "target.pool_size=64", "target.refresh_every=10",
                f"train.seed={seed}", "train.batch_size=16", "sample.steps=8", "optim.lr=1e-3", "train.eval_every=0",
                "train.sample_every=0", "sample.num=0", *QUIET)  # fmt: skip
        r = json.loads((out / "reward_eval.json").read_text())
        rows.append({"seed": seed, **{k: r[k] for k in r if k.endswith(("_mean", "_stderr"))}})
    return {"reward": rows}


# ------------------------------------------------------------------------------------------------ step time


def stage_step(w: Path, a) -> dict:
    """Objective-level step (loss, backward, clipping, AdamW) on identical batches: a prompt canvas then a response
    canvas cut from the training chunks."""
    import torch.nn.functional as F
    import transformers as T

    from tcsm.core.batch import Batch
    from tcsm.models.diffusion_gemma import DiffusionGemmaDenoiser
    from tcsm.posttrain.sft.reference import ReferenceBlockSFT

    torch.set_num_threads(1)
    V, k, B = vocab(w), a.canvas, 16
    hf_a = T.DiffusionGemmaForBlockDiffusion.from_pretrained(w / "model").float().train()
    hf_b = T.DiffusionGemmaForBlockDiffusion.from_pretrained(w / "model").float().train()
    ours = DiffusionGemmaDenoiser(hf_a)
    for m in (hf_a, hf_b):
        for n, p in m.named_parameters():
            p.requires_grad_(".router." not in n)
    loss_fn = ReferenceBlockSFT(V, k, eps=1e-3, ar_weight=1.0, self_cond_prob=0.5)
    opt_a = torch.optim.AdamW([p for p in hf_a.parameters() if p.requires_grad], lr=1e-4)
    opt_b = torch.optim.AdamW([p for p in hf_b.parameters() if p.requires_grad], lr=1e-4)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, V, (64, 2 * k), generator=g)
    cond = torch.zeros(64, 2 * k, dtype=torch.bool)
    cond[:, :k] = True
    cap = hf_b.config.get_text_config().final_logit_softcapping

    def tcsm_step(i):
        rows = slice((i * B) % 64, (i * B) % 64 + B)
        loss, _ = loss_fn(ours, Batch(x1=x[rows], cond_mask=cond[rows]), g)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ours.parameters(), 1.0)
        opt_a.step()
        opt_a.zero_grad(set_to_none=True)

    def hand_step(i):  # the recipe as a user writes it with the model's own calls
        x1 = x[(i * B) % 64 : (i * B) % 64 + B]
        c = 1e-3 + (1 - 1e-3) * torch.rand(B, 1, generator=g)
        resp = x1[:, k:]
        xt = torch.where(torch.rand(B, k, generator=g) < c, torch.randint(0, V, (B, k), generator=g), resp)
        on = torch.rand(B, generator=g) < 0.5
        cache = T.DynamicCache()  # full layers: the prompt (k < sliding window) fits every layer whole
        hidden = hf_b.model.encoder(input_ids=x1, cache=cache).last_hidden_state
        enc = torch.tanh(hf_b.lm_head(hidden) / cap) * cap
        cache.crop(-k)  # drop the response keys: the decoder reads the prompt (the first k) only
        sc = {}
        if on.any():
            with torch.no_grad():
                first = hf_b(cache=cache, decoder_input_ids=xt).logits
            sc = {"self_conditioning_logits": first, "self_conditioning_mask": on}
        logits = hf_b(cache=cache, decoder_input_ids=xt, **sc).logits
        loss = F.cross_entropy(logits.reshape(-1, V), resp.reshape(-1))
        loss = loss + F.cross_entropy(enc[:, k - 1 : -1].reshape(-1, V), resp.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(hf_b.parameters(), 1.0)
        opt_b.step()
        opt_b.zero_grad(set_to_none=True)

    for f in (tcsm_step, hand_step):  # warm up
        f(0)
    rounds = []
    for r in range(a.rounds):
        order = [("tcsm", tcsm_step), ("hand", hand_step)][:: 1 if r % 2 == 0 else -1]
        times = {}
        for name, f in order:
            t0 = time.process_time()
            for i in range(a.steps_per_round):
                f(i)
            times[name] = (time.process_time() - t0) / a.steps_per_round
        rounds.append({**times, "ratio": times["tcsm"] / times["hand"]})
    ratios = sorted(r["ratio"] for r in rounds)
    return {"step": {"rounds": rounds, "median_ratio": ratios[len(ratios) // 2], "batch": B, "length": 2 * k}}


# ------------------------------------------------------------------------------------------------ LoRA


def stage_lora(w: Path, a) -> dict:
    rows = {}
    lora = ["train.lora.r=8", 'train.lora.target_modules=["re:.*(language_model|decoder).*(q_proj|v_proj)"]']
    for mode, extra in (("full", []), ("lora", lora)):
        out = w / f"lora-{mode}"
        argv = [sys.executable, __file__, "--work", str(w), "--child-sft", str(out), *extra]
        res = subprocess.run(argv, capture_output=True, text=True, check=True)
        rows[mode] = json.loads(res.stdout.strip().splitlines()[-1])
    return {"lora": rows}


def child_sft(w: Path, out: Path, extra: list[str], a) -> None:
    """One whole SFT run in this fresh process (the library's `sft_config` + `fit`, what `tcsm finetune sft` runs),
    so that the process's peak resident set is the run's."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from tcsm.recipes.sft.compose import sft_config
    from tcsm.train.fit import fit

    overrides = ["data.truncate=true", "train.eval_every=0", "train.sample_every=0", "sample.num=0",
                 "objective.eval_num_t=4", "train.eval_examples=64", "data.valid_frac=0.1", f"eval.t_max={a.t_max}",
                 "train.batch_size=16", "train.steps=3", "objective.recipe=reference", *QUIET, *extra]  # fmt: skip
    buf = io.StringIO()
    with redirect_stdout(buf), redirect_stderr(buf):
        fit(sft_config(w / "pre", w / "sft.jsonl", overrides=overrides), out)
    from safetensors.torch import load_file

    ckpt = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip() / "model.safetensors"
    weights = load_file(str(ckpt))
    lora = sum(v.numel() for k, v in weights.items() if "lora_" in k)
    line = next((s for s in buf.getvalue().splitlines() if s.startswith("model:")), "")
    # VmHWM, not ru_maxrss: Linux carries the parent's peak into ru_maxrss across fork + exec
    status = Path("/proc/self/status").read_text().splitlines()
    peak = next(int(s.split()[1]) for s in status if s.startswith("VmHWM:")) / 1024
    print(json.dumps({"model_line": line, "peak_rss_mb": round(peak, 1), "lora_params": lora,
                      "stored_params": sum(v.numel() for v in weights.values())}))


# ------------------------------------------------------------------------------------------------ main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--only", nargs="*", default=["data", "pretrain", "sft", "reward", "step", "lora"])
    p.add_argument("--vocab", type=int, default=512)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--canvas", type=int, default=8)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--prompt-words", type=int, default=4)
    p.add_argument("--completion-words", type=int, default=20)
    p.add_argument("--sft-records", type=int, default=2000)
    p.add_argument("--pretrain-steps", type=int, default=1200)
    p.add_argument("--sft-steps", type=int, default=150)
    p.add_argument("--reward-steps", type=int, default=30)
    p.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    p.add_argument("--t-max", type=float, default=0.95)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps-per-round", type=int, default=10)
    p.add_argument("--child-sft", type=Path, help=argparse.SUPPRESS)
    a, rest = p.parse_known_args()
    torch.set_num_threads(1)
    w = a.work.resolve()
    w.mkdir(parents=True, exist_ok=True)
    if a.child_sft:
        return child_sft(w, a.child_sft, rest, a)
    res_file = w / "results.json"
    res = json.loads(res_file.read_text()) if res_file.is_file() else {}
    stages = {"data": stage_data, "pretrain": stage_pretrain, "sft": stage_sft, "reward": stage_reward,
              "step": stage_step, "lora": stage_lora}  # fmt: skip
    for name in a.only:
        t0 = cpu()
        out = stages[name](w, a) or {}
        res.update(out)
        res.setdefault("cpu_s", {})[name] = round(cpu() - t0, 1)
        res_file.write_text(json.dumps(res, indent=1))
        print(f"[{name}] done in {res['cpu_s'][name]} CPU s", flush=True)
    print(json.dumps({k: v for k, v in res.items() if not k.startswith("samples")}, indent=1))


if __name__ == "__main__":
    main()
