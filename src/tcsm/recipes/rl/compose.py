"""GRPO as a recipe: the run config of an RL fine-tune from a trained run (its data, path and model; the run itself
as the KL reference and the starting weights), and the before / after report on held-out prompts."""

from __future__ import annotations

import torch

from tcsm.builders.config import load_config, set_values
from tcsm.builders.loading import load_checkpoint
from tcsm.builders.registry import family_of_name
from tcsm.builders.source import source_run
from tcsm.data.prompted import held_out_rows
from tcsm.data.tasks import run_task_options
from tcsm.recipes.spec import from_source, lazy_report
from tcsm.rewards.functions import evaluate_reward, make_reward
from tcsm.sampling.settings import draw, sample_settings

__all__ = ["compose", "report_of", "rl_config", "rl_report"]

#: the policies GRPO trains: a diffusion denoiser (one_step, elbo) or an autoregressive LM (exact)
POLICY_FAMILIES = ("denoiser", "causal")


def _source(checkpoint) -> tuple:
    """(checkpoint directory, its run config without its frozen model); CheckpointError unless it trained a policy."""
    needs = "a policy with a sampler: a diffusion denoiser or an autoregressive LM run"
    return source_run(checkpoint, "rl", POLICY_FAMILIES, needs)


def rl_config(checkpoint, preset: str | None = "finetune-rl", overrides=(), values: dict | None = None):
    """The fine-tuning config: the source run's config < preset < overrides < `values` (dotted key → value), with
    `reference.path` (the KL reference) and `train.init_from` set to the source checkpoint."""
    directory, base = _source(checkpoint)
    base["train"] = {**base.get("train", {}), "out_dir": None}  # never write into the source run
    for key in ("objective", "target"):  # the source's training objective is not this run's
        base.pop(key, None)
    cfg = load_config(preset, list(overrides), base=base)
    cfg = set_values(cfg, {"reference.path": str(directory), **(values or {})})
    start = {"train.init_from": str(directory), "train.init_weights": "ema" if cfg.reference.ema else "model"}
    return set_values(cfg, {k: v for k, v in start.items() if k not in (values or {})})


@torch.no_grad()
def rl_report(run_dir, num_prompts: int, seed: int = 0) -> dict:
    """Mean reward and accuracy (reward == objective.success) of one completion per held-out prompt, drawn by the
    run's sampler from the source (reference) model and from the fine-tuned (EMA) model."""
    post = load_checkpoint(run_dir)
    cfg = post.config
    pre = load_checkpoint(cfg.reference.path)
    data, path = post.build_data(), post.build_path()
    x1, cond = held_out_rows(data, num_prompts)
    if cond is None:  # rows without their own prompts: the first objective.prompt_len tokens are the prompt
        cond = torch.zeros_like(x1, dtype=torch.bool)
        cond[:, : int(cfg.objective.prompt_len)] = True
    reward = make_reward(cfg.objective.reward, decode=getattr(data, "decode", None), vocab_size=data.vocab_size,
                         task_options=run_task_options(cfg.data))
    owner = None
    if family_of_name(cfg.model.get("name")).is_autoregressive:
        from tcsm.objectives.lm import make_lm_loss

        owner = make_lm_loss("causal")
    out = {"reward": str(cfg.objective.reward), "num_prompts": int(x1.shape[0]), "sample_steps": int(cfg.sample.steps)}
    pinned = bool(cond.any())
    for name, ck in (("source", pre), ("finetuned", post)):
        g = torch.Generator().manual_seed(seed)
        x, _ = draw(ck.model, path, x1.shape[0], x1.shape[1], sample_settings(cfg.sample), objective=owner, generator=g,
                    fixed=cond if pinned else None, values=x1 if pinned else None)  # fmt: skip
        r = evaluate_reward(reward, torch.where(cond, x1, x.long())).double()
        out[f"{name}_reward"] = float(r.mean())
        out[f"{name}_accuracy"] = float((r == float(cfg.objective.success)).double().mean())
    return out


def compose(args, config: str, values: dict):
    """`tcsm finetune rl`'s run config from its arguments."""
    return from_source(args, rl_config, config, values, "the run to start from", "finetune rl")


def report_of(args):
    return lazy_report("tcsm.recipes.rl.compose:rl_report", args.eval_prompts)
