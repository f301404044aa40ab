"""Reward fine-tuning as a recipe (MATH.md §5.2): the run config of a fine-tune, and its before/after report.

A fine-tune is an ordinary run: the pre-trained run's config (data, path, model) < the `finetune-reward` preset
< overrides, with `reference.path` and `train.init_from` pointing at the pre-trained checkpoint, trained by
the same Trainer (`tcsm.train.fit`).
"""

from __future__ import annotations

import torch

from tcsm.builders.config import load_config, set_values
from tcsm.builders.loading import load_checkpoint
from tcsm.builders.source import source_run
from tcsm.data.prompted import held_out_rows
from tcsm.data.tasks import run_task_options
from tcsm.recipes.spec import from_source, lazy_report
from tcsm.rewards.functions import evaluate_reward, make_reward
from tcsm.sampling.settings import draw, sample_settings

__all__ = ["reward_config", "reward_report"]


def reward_config(
    checkpoint, preset: str | None = "finetune-reward", overrides=(), values: dict | None = None
):
    """The fine-tuning config: pre-trained run's config < preset < overrides < `values` (dotted key → value),
    with `reference.path` and `train.init_from` set to the checkpoint directory (set train.init_from=null in
    `values` to start the student afresh)."""
    directory, base = source_run(checkpoint, "reward")
    base["train"] = {**base.get("train", {}), "out_dir": None}  # never write into the pre-trained run
    cfg = load_config(preset, list(overrides), base=base)
    cfg = set_values(cfg, {"reference.path": str(directory), **(values or {})})
    # The student starts from the pre-trained weights through the trainer's init_from, like any warm start.
    start = {"train.init_from": str(directory), "train.init_weights": "ema" if cfg.reference.ema else "model"}
    return set_values(cfg, {k: v for k, v in start.items() if k not in (values or {})})


def reward_report(run_dir, num_samples: int, seed: int = 0) -> dict:
    """Mean reward of `num_samples` samples of the pre-trained and of the fine-tuned (EMA) model, same sampler; for
    data whose rows carry prompts (task or SFT records) and no `target.prompt`, completions of the first held-out
    prompts (as many as there are, up to `num_samples`)."""
    post = load_checkpoint(run_dir)
    cfg = post.config
    pre = load_checkpoint(cfg.reference.path)
    data = post.build_data()
    path = post.build_path()
    reward = make_reward(cfg.target.reward, decode=data.decode, vocab_size=data.vocab_size,
                         task_options=run_task_options(cfg.data))
    prompt = data.encode(cfg.target.prompt) if cfg.target.prompt else None
    rows, cond = (None, None) if prompt is not None else held_out_rows(data, num_samples)
    pin = {} if cond is None else {"fixed": cond, "values": rows}
    if cond is not None:
        num_samples = rows.shape[0]
    out = {
        "reward": cfg.target.reward,
        "beta": float(cfg.target.beta),
        "num_samples": int(num_samples),
        "sample_steps": int(cfg.sample.steps),
    }
    for name, ck in (("pretrained", pre), ("finetuned", post)):
        g = torch.Generator().manual_seed(seed)
        x, _ = draw(ck.model, path, num_samples, data.seq_len, sample_settings(cfg.sample), generator=g,
                    prompt=prompt, chunk_size=256, **pin)  # fmt: skip
        if cond is not None:
            x = torch.where(cond, rows, x.long())
        r = evaluate_reward(reward, x, 1024).double()
        out[f"{name}_reward_mean"] = float(r.mean())
        out[f"{name}_reward_stderr"] = float(r.std() / max(1, r.numel()) ** 0.5)
        out[f"{name}_example"] = data.decode(x[0])
        if str(cfg.target.reward).startswith("task:"):  # a task's verifier: 1 solved, 0 not (as tcsm finetune rl)
            out[f"{name}_accuracy"] = float((r == 1.0).double().mean())
    return out


def compose(args, config: str, values: dict):
    """`tcsm finetune reward`'s run config from its arguments."""
    return from_source(args, reward_config, config, values, "the pre-trained model", "finetune reward", "--checkpoint")


def report_of(args):
    return lazy_report("tcsm.recipes.reward.compose:reward_report", args.eval_samples)
