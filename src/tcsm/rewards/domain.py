"""Which data a reward is defined on: a reward that scores decoded text on a grid run (or the grid reward on text)
would train on a meaningless signal, so every command that takes a reward checks it first (`check_reward_domain`)."""

from __future__ import annotations

from tcsm.core.errors import ConfigError

__all__ = ["GRID_KINDS", "TEXT_KINDS", "check_reward_domain"]

GRID_KINDS = ("grid",)
TEXT_KINDS = ("text", "text8", "bpe", "shards", "hf", "tokenizer")  # shards / hf / tokenizer: decoded with their tokenizer


def check_reward_domain(spec, ctx, what: str = "target.reward=") -> None:
    """ConfigError unless the reward named by `spec` is defined on the run's data: otherwise it would train on a
    meaningless signal (e.g. the grid reward reads the first token of a text as an x coordinate). `ctx` needs
    `config.data.kind`, `vocab_size` and `seq_len`; `what` names the setting in the message (a flag, a key)."""
    from tcsm.rewards.functions import REWARDS

    name = spec.get("name") if isinstance(spec, dict) else str(spec).partition(":")[0]
    scores = REWARDS.get(name).scores if name in REWARDS else "tokens"  # an unknown name: make_reward says so
    kind = str(ctx.config.data.kind) if ctx.config is not None else None
    if kind in ("pairs", "sft") and ctx.config.data.get("tokenizer"):  # records tokenized by a text run's tokenizer
        kind = str(ctx.config.data.tokenizer.get("kind"))
    shape = f"data.kind={kind}, V={ctx.vocab_size}, L={ctx.seq_len}"
    if scores == "grid" and (kind not in GRID_KINDS or ctx.seq_len != 2):
        raise ConfigError(
            f"{what}grid scores points of a W×W grid (length-2 sequences, data.kind=grid), but this model "
            f"was trained on {shape}; choose a reward for its data (e.g. vader for text)"
        )
    if scores == "text" and kind not in TEXT_KINDS:
        raise ConfigError(
            f"{what}{name} scores decoded text (data.kind in {list(TEXT_KINDS)}), but this model was "
            f"trained on {shape}; choose a reward for its data (e.g. grid for data.kind=grid)"
        )
