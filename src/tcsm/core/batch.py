"""What one training step feeds an objective: clean sequences plus what post-training attaches to them.

`Batch` is the objective contract's input (DESIGN.md "The objective contract"):

* `x1` [B, L]: clean sequences (for preference pairs: the chosen / winner sequences);
* `cond_mask` [B, L] (optional): conditioning positions (prompts) — never noised, never scored;
* `weight` [B] (optional): per-sequence weights, multiplied into the reduced loss as given;
* `rejected` [B, L] (optional): the rejected / loser sequence of each pair, sharing `cond_mask` with `x1`.

A plain LongTensor is accepted wherever a `Batch` is, and means `Batch(x1=tensor)`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

__all__ = ["Batch", "as_batch"]


@dataclass
class Batch:
    x1: Tensor
    cond_mask: Tensor | None = None
    weight: Tensor | None = None
    rejected: Tensor | None = None

    def __post_init__(self):
        shape = tuple(self.x1.shape)
        if self.x1.dim() != 2:
            raise ValueError(f"Batch.x1 must be [B, L], got shape {shape}")
        for name in ("cond_mask", "rejected"):
            v = getattr(self, name)
            if v is not None and tuple(v.shape) != shape:
                raise ValueError(f"Batch.{name} has shape {tuple(v.shape)}; x1 has {shape}")
        if self.cond_mask is not None and self.cond_mask.dtype != torch.bool:
            raise ValueError(f"Batch.cond_mask must be a BoolTensor, got {self.cond_mask.dtype}")
        if self.weight is not None and tuple(self.weight.shape) != shape[:1]:
            raise ValueError(f"Batch.weight has shape {tuple(self.weight.shape)}; expected [{shape[0]}]")

    @property
    def paired(self) -> bool:
        return self.rejected is not None

    def noised(self, path, x1: Tensor, t: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """x_t ~ p_{t|1}(· | x1) with conditioning positions kept clean (MATH.md §1.1)."""
        xt = path.draw_xt(x1, t, generator)
        return xt if self.cond_mask is None else torch.where(self.cond_mask, x1, xt)

    def scored(self, path, xt: Tensor) -> Tensor:
        """The path's loss positions for x_t, minus the conditioning positions."""
        mask = path.loss_mask(xt)
        return mask if self.cond_mask is None else mask & ~self.cond_mask

    def to(self, device) -> Batch:
        return replace(self, **{f.name: _to(getattr(self, f.name), device) for f in fields(self)})


def _to(v, device):
    return v.to(device) if isinstance(v, Tensor) else v


def as_batch(batch: Batch | Tensor) -> Batch:
    """A `Batch` from a `Batch` or from clean sequences [B, L]."""
    return batch if isinstance(batch, Batch) else Batch(x1=batch)
