"""What the model config dataclasses (`DenoiserConfig`, `LMConfig`) share: the size checks every rotary
transformer here needs, and a dict round trip that rejects unknown keys (checkpoints store configs as dicts)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["ModelConfig", "TrunkConfig"]


class ModelConfig:
    """Mixin for a model config dataclass with fields vocab_size, d_model, n_heads, dropout and integer sizes."""

    #: how `from_dict` errors name the config
    label: ClassVar[str] = "model config"

    def check_sizes(self, positive: tuple[str, ...]) -> None:
        """Raise ValueError unless V >= 2, every field in `positive` is >= 1, n_heads splits d_model into heads
        of even width, and 0 <= dropout < 1."""
        if self.vocab_size < 2:
            raise ValueError(f"vocab_size must be >= 2, got {self.vocab_size}")
        for name in positive:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.d_model % self.n_heads or (self.d_model // self.n_heads) % 2:
            raise ValueError(
                f"d_model={self.d_model} must be a multiple of n_heads={self.n_heads} with an even head "
                "dimension (rotary embeddings rotate pairs of channels)"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown {cls.label} keys {unknown}; known keys: {sorted(known)}")
        return cls(**d)


@dataclass
class TrunkConfig(ModelConfig):
    """The bidirectional rotary transformer trunk shared by the `Denoiser` and the DRE `RatioHead`: vocab_size = V
    clean tokens, num_states = size of the input alphabet, adaLN time conditioning of width cond_dim."""

    vocab_size: int
    num_states: int
    max_len: int
    d_model: int
    n_layers: int
    n_heads: int
    mlp_ratio: float = 4
    dropout: float = 0.0
    time_conditioning: bool = True
    cond_dim: int = 128  # width of the time embedding; SEDD's choice, small so adaLN costs few parameters
    norm: str = "layernorm"  # or "rmsnorm"
    rope_base: float = 10000.0

    def check_trunk(self) -> None:
        """Raise ValueError unless the input alphabet holds the clean tokens and the sizes are valid."""
        if self.num_states < self.vocab_size:
            raise ValueError(
                f"num_states={self.num_states} < vocab_size={self.vocab_size}: use V for the uniform source "
                "and V+1 (mask id V) for the masked source"
            )
        self.check_sizes(("max_len", "d_model", "n_layers", "n_heads", "cond_dim"))
