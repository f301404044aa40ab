"""Exponential moving average of the weights, kept as a full model copy for evaluation and sampling."""

from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["EMA"]


class EMA:
    """θ_ema ← d θ_ema + (1 − d) θ with d = min(decay, (1 + n) / (10 + n)) after the n-th update.

    The warm-up of d lets the average follow the fast early changes of the weights instead of remembering the
    random init for ~1/(1 − decay) steps, which matters for short runs. The copy is float32 whatever the
    training precision, and never requires grad.
    """

    def __init__(self, model: nn.Module, decay: float):
        self.decay = float(decay)
        # Frozen parameters (a LoRA run's base) never change: the copy shares them instead of doubling them.
        frozen = {id(p): p for p in model.parameters() if not p.requires_grad}
        self.model = copy.deepcopy(model, frozen).float().eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.num_updates = 0

    def current_decay(self) -> float:
        n = self.num_updates
        return min(self.decay, (1.0 + n) / (10.0 + n))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        d = self.current_decay()
        # Under FSDP sharded parameters are DTensors and replicated (frozen) ones plain tensors; a foreach kernel
        # takes one kind at a time.
        groups: dict[type, tuple[list, list]] = {}
        for e, p in zip(self.model.parameters(), model.parameters()):
            if e is p:  # a shared frozen parameter
                continue
            ema_list, src_list = groups.setdefault(type(e), ([], []))
            ema_list.append(e)
            src_list.append(p.detach().to(e.dtype))
        for ema_list, src_list in groups.values():
            torch._foreach_lerp_(ema_list, src_list, 1.0 - d)
        for e, b in zip(self.model.buffers(), model.buffers()):
            e.copy_(b)
        self.num_updates += 1

    def state(self) -> dict:
        return {"decay": self.decay, "num_updates": self.num_updates}

    def load_state(self, state: dict) -> None:
        self.num_updates = int(state["num_updates"])
