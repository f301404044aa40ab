"""What the model config dataclasses (`DenoiserConfig`, `CleanLMConfig`) share: the size checks every rotary
transformer here needs, and a dict round trip that rejects unknown keys (checkpoints store configs as dicts)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

__all__ = ["ModelConfig"]


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
