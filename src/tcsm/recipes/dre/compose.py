"""Density-ratio post-training as a recipe (MATH.md §5.1): the run config of a DRE fine-tune, and its report.

A DRE fine-tune is an ordinary run over the reference run's data and path: the reference run's config < the
`finetune-dre` preset < overrides < `values`. Strategy (ii) replaces the model section by an energy model
(`model.name: energy`) around the frozen reference — only its head trains, and its trunk starts as a copy of the
reference's; strategy (i) keeps the reference's denoiser, starts the student from the reference's weights through
`train.init_from` and uses the reference checkpoint as `reference.path` unless `ema` / `previous` is asked.
"""

from __future__ import annotations

import copy
import math

import torch

from tcsm.builders.config import load_config, set_values
from tcsm.builders.loading import load_checkpoint
from tcsm.builders.source import source_run
from tcsm.core.errors import ConfigError
from tcsm.evaluation.likelihood import evaluate_bound
from tcsm.recipes.spec import from_source, lazy_report

__all__ = ["dre_config", "dre_report"]


def _strategy(base: dict, preset: str | None, overrides, values: dict) -> str:
    """objective.strategy as the config loader resolves it from the reference run's config, the preset and the
    overrides, with a flag's value on top (flags are set last)."""
    cfg = load_config(preset, list(overrides), base=copy.deepcopy(base))
    if cfg.objective.name != "dre":
        raise ConfigError("tcsm finetune dre needs objective.name=dre (the finetune-dre preset sets it)")
    return str(values.get("objective.strategy", cfg.objective.strategy))


def dre_config(checkpoint, preset: str | None = "finetune-dre", overrides=(), values: dict | None = None):
    """The DRE fine-tuning config for the reference checkpoint `checkpoint` (a `tcsm train` run, step or
    checkpoints directory): its config < preset < overrides < `values` (dotted key → value)."""
    values = dict(values or {})
    directory, base = source_run(checkpoint, "dre")
    # Never write into the reference run, and never inherit its own warm start.
    base["train"] = {**base.get("train", {}), "out_dir": None, "init_from": None}
    strategy = _strategy(base, preset, overrides, values)
    given = values.pop("objective.reference", None)  # --reference: ema | previous | a checkpoint
    if given is not None:
        values["objective.reference" if given in ("ema", "previous") else "reference.path"] = given
    if strategy != "i" and given is not None:
        raise ConfigError(
            f"--reference belongs to strategy i (the student's frozen reference); strategy {strategy}'s reference "
            "is the --from run itself: drop --reference, or give --strategy i"
        )
    start: dict = {}
    if strategy == "ii":
        base["model"] = {"name": "energy", "reference_model": base["model"]}
        start["reference.path"] = str(directory)
    elif strategy == "i":
        weights = "ema" if (directory / "ema.safetensors").is_file() else "model"
        start = {"train.init_from": str(directory), "train.init_weights": weights}
    cfg = load_config(preset, list(overrides), base=base)
    if strategy == "i" and cfg.objective.reference is None and cfg.reference.path is None:
        start["reference.path"] = str(directory)
    return set_values(cfg, {**{k: v for k, v in start.items() if k not in values}, **values})


def dre_report(run_dir, num_examples: int, seed: int = 0) -> dict:
    """The fine-tuned model against its reference on `num_examples` sequences of the eval split.

    Strategy (ii): the reference's valid masked bound and the energy model's IS estimate for every n of
    `objective.log_z_samples` (labelled; MATH.md §5.1, §8 item 14). Strategy (i): both models' valid bounds."""
    from tcsm.builders.assemble import build_objective_for_checkpoint
    from tcsm.core.protocols import Evaluates

    post = load_checkpoint(run_dir)
    cfg = post.config
    data = post.build_data()
    path = post.build_path()
    x = data.split(cfg.eval.split)[: int(num_examples)]
    if x.shape[0] == 0:
        raise ConfigError(f"the {cfg.eval.split} split is empty")
    e = cfg.eval
    out = {
        "strategy": cfg.objective.strategy,
        "loss": cfg.objective.bregman,
        "split": e.split,
        "step": post.step,
    }
    objective = build_objective_for_checkpoint(cfg, post.model, data, "cpu")
    if isinstance(objective, Evaluates):
        g = torch.Generator().manual_seed(seed)
        res = objective.evaluate(post.model, x, batch_size=e.batch_size, generator=g)
        keep = [k for k in res if k.startswith(("reference_bpc", "bpc_estimate", "log_z_mean"))]
        out.update({k: res[k] for k in keep}, log_z_samples=list(cfg.objective.log_z_samples))
    else:
        ref = load_checkpoint(cfg.reference.path) if cfg.objective.reference is None else None
        for name, model in (("reference", ref.model if ref else None), ("finetuned", post.model)):
            if model is None:
                continue
            g = torch.Generator().manual_seed(seed)  # the same draws for both models
            res = evaluate_bound(model, x, path, batch_size=e.batch_size, num_t=e.num_t, generator=g)
            out[f"{name}_bpc"], out[f"{name}_bpc_stderr"] = res["bpc"], res["bpc_stderr"]
    floor = getattr(data, "nats_per_token_floor", None)
    if floor is not None:
        out["floor_bpc"] = floor / math.log(2)
    return out


def compose(args, config: str, values: dict):
    """`tcsm finetune dre`'s run config from its arguments."""
    return from_source(args, dre_config, config, values, "the reference run", "finetune dre")


def report_of(args):
    return lazy_report("tcsm.recipes.dre.compose:dre_report", args.eval_examples)
