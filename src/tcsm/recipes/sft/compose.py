"""The instruction fine-tuning run config: the pre-trained run's path and model, the `sft` data kind over the
records with the pre-trained run's tokenizer, `objective.name: sft`, and the pre-trained weights as the start."""

from __future__ import annotations

from tcsm.builders.config import load_config, set_values
from tcsm.core.errors import ConfigError
from tcsm.recipes.records import records_base

__all__ = ["sft_config"]


def sft_config(checkpoint, records, preset: str | None = "finetune-sft", overrides=(), values: dict | None = None):
    """Pre-trained run's config < preset < overrides < `values`, with `data` the records file tokenized by the
    pre-trained run's tokenizer and `train.init_from` the checkpoint (set train.init_from=null to start afresh)."""
    directory, base = records_base(
        checkpoint, "sft", "sft", records,
        is_dir="--data {path!r} is a directory; give the JSONL file of prompt/completion or messages records",
        missing="instruction data file not found: {path}",
    )  # fmt: skip
    cfg = load_config(preset, list(overrides), base=base)
    if cfg.objective.name != "sft":
        raise ConfigError(f"an instruction fine-tune needs objective.name=sft, got {cfg.objective.name!r}")
    start = {"train.init_from": str(directory), "train.init_weights": "ema"}
    return set_values(cfg, {**{k: v for k, v in start.items() if k not in (values or {})}, **(values or {})})


def compose(args, config: str, values: dict):
    """`tcsm finetune sft`'s run config from its arguments."""
    if not args.checkpoint or not args.data:
        raise ConfigError("give the pre-trained model and the data: tcsm finetune sft --from RUN --data FILE")
    return sft_config(args.checkpoint, args.data, config, args.overrides, values)
