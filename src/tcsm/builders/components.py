"""Built-in registry entries (the denoiser, the data target, the composed TCSM objective) and the functions
that turn a run config into the objects a run trains: data → path → model → target → objective.

Nothing here knows a method: each component is whatever its registry entry builds from its config section.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch

from tcsm.builders.registry import MODELS, OBJECTIVES, BuildContext
from tcsm.core.errors import ConfigError

__all__ = [
    "Components",
    "DataInfo",
    "build_data",
    "build_model_for_checkpoint",
    "build_objective",
    "build_path",
    "section",
]


def section(cfg, name: str, key: str = "name") -> tuple[str, dict]:
    """(entry name, the section's other keys as a plain dict) of a component section."""
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(cfg[name], resolve=True)
    return node.pop(key), node


# --------------------------------------------------------------------------------------------------- assembly


@dataclass
class DataInfo:
    """What a model needs to know about its data when the data itself is not loaded (checkpoint loading)."""

    name: str
    vocab_size: int
    seq_len: int
    label: str = ""
    nats_per_token_floor: float | None = None
    chars: str | None = None  # the character vocabulary, for character-level tokenizers
    #: sha256 of the tokenizer (tcsm.data.tokenizer_spec.identity), when the data records it (shards, hf)
    tokenizer_identity: str | None = None
    #: sha256 of a prepared corpus' index.json (data.kind=shards): the exact token stream the run trained on
    index_checksum: str | None = None

    @classmethod
    def of(cls, bundle) -> DataInfo:
        floor = getattr(bundle, "nats_per_token_floor", None)
        chars = getattr(getattr(bundle, "tokenizer", None), "chars", None)
        meta = getattr(bundle, "meta", None) or {}
        return cls(
            bundle.name,
            int(bundle.vocab_size),
            int(bundle.seq_len),
            getattr(bundle, "label", bundle.name),
            None if floor is None else float(floor),
            chars if isinstance(chars, str) else None,
            meta.get("tokenizer_identity"),
            meta.get("index_checksum"),
        )

    def check_compatible(self, bundle, where: str) -> None:
        """Raise CheckpointError unless `bundle` uses the token ids this model was trained on."""
        from tcsm.core.errors import CheckpointError

        other = DataInfo.of(bundle)
        if self.tokenizer_identity and other.tokenizer_identity and self.tokenizer_identity != other.tokenizer_identity:
            raise CheckpointError(
                f"the data was tokenised with another tokenizer than the one {where!r} was trained with "
                f"(tokenizer sha256 {other.tokenizer_identity[:12]}… vs {self.tokenizer_identity[:12]}…); prepare "
                "the corpus with the run's tokenizer.json"
            )
        if other.vocab_size != self.vocab_size or (self.chars and other.chars and other.chars != self.chars):
            hint = f"; pass data.vocab={self.chars!r}" if self.chars else ""
            raise CheckpointError(
                f"the data's vocabulary ({other.vocab_size} tokens) is not the one {where!r} was trained on "
                f"({self.vocab_size} tokens){hint}"
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def build_data(cfg):
    """The run's DataBundle from the `data` section (tcsm.data.build_data)."""
    from omegaconf import OmegaConf

    from tcsm.data import build_data as _build_data

    return _build_data(OmegaConf.to_container(cfg.data, resolve=True))


def build_path(cfg, vocab_size: int, seq_len: int | None = None):
    """The probability path of the `path` section for V = vocab_size clean tokens (and, when given, sequences of
    seq_len tokens: a block length must divide it)."""
    from tcsm.paths import make_path

    try:
        path = make_path(
            cfg.path.source, vocab_size, cfg.path.schedule, block_length=cfg.path.get("block_length"),
            **dict(cfg.path.schedule_kwargs),
        )
        if seq_len is not None:
            path.block_size(seq_len)
        return path
    except (TypeError, ValueError) as e:
        raise ConfigError(f"path: {e}") from None


@dataclass
class Components:
    """What a Trainer trains: data, path, model, target and objective, the run's frozen `reference` (handed to what
    needs it when it was built; the trainer never passes it) and the `callbacks` it calls (`tcsm.core.protocols`)."""

    data: Any
    path: Any
    model: torch.nn.Module
    target: Any
    objective: Any
    context: BuildContext | None = None
    reference: torch.nn.Module | None = None
    callbacks: list = field(default_factory=list)


def build_objective(cfg, ctx: BuildContext):
    """The objective of the `objective` section for the context's path, model and target, on ctx.device."""
    name, node = section(cfg, "objective")
    objective = OBJECTIVES.build(name, node, ctx)
    return objective.to(ctx.device) if hasattr(objective, "to") else objective


def build_model_for_checkpoint(cfg, data_info: dict, device) -> torch.nn.Module:
    """The model a checkpoint's config describes, without loading its data."""
    info = DataInfo(**data_info)
    ctx = BuildContext(config=cfg, device=torch.device(device), data=info)
    ctx.path = build_path(cfg, info.vocab_size)
    name, node = section(cfg, "model")
    from tcsm.builders.lora import with_lora

    return with_lora(MODELS.build(name, node, ctx), cfg).to(device)
