"""The instruction fine-tuning run config: the pre-trained run's path and model, the `sft` data kind over the
records with the pre-trained run's tokenizer, `objective.name: sft`, and the pre-trained weights as the start."""

from __future__ import annotations

from tcsm.core.errors import ConfigError
from tcsm.recipes.records import records_config

__all__ = ["sft_config"]


def sft_config(checkpoint, records, preset: str | None = "finetune-sft", overrides=(), values: dict | None = None):
    """Pre-trained run's config < preset < overrides < `values`, with `data` the records file tokenized by the
    pre-trained run's tokenizer and `train.init_from` the checkpoint (set train.init_from=null to start afresh)."""
    return records_config(
        checkpoint, "sft", "sft", records, preset, overrides, values, what="an instruction fine-tune",
        is_dir="--data {path!r} is a directory; give the JSONL file of prompt/completion or messages records",
        missing="instruction data file not found: {path}",
    )  # fmt: skip


def compose(args, config: str, values: dict):
    """`tcsm finetune sft`'s run config from its arguments."""
    if not args.checkpoint or not args.data:
        raise ConfigError("give the pre-trained model and the data: tcsm finetune sft --from RUN --data FILE")
    return sft_config(args.checkpoint, args.data, config, args.overrides, values)
