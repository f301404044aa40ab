"""Reusing a round's teacher rollouts across updates (MATH.md §10, "Cost"). A round's target does not depend on the
student: x_t comes from the data and the frozen teacher's rollout from x_t. So a row rolled out at an earlier update
is still a draw of the target, and a pool of earlier rows gives an unbiased loss at a fraction of the teacher's calls.
`Replayed` rolls out ⌈B / reuse⌉ rows of each batch and takes the others from a pool of earlier rows, drawn without
replacement; the pool keeps the last `reuse` × B rows rolled out. Every row then serves `reuse` updates on average,
spread over about reuse² of them; the rows of one update are not independent across updates (more variance per
update for the same expectation). The pool is training state (`core.protocols.KeepsState`), so a resumed round
continues exactly."""

from __future__ import annotations

from dataclasses import fields, replace

import torch
from torch import Tensor

from tcsm.core.batch import as_batch
from tcsm.targets.base import Target, TargetBatch

__all__ = ["Replayed"]

#: the per-row fields of a `TargetBatch` a pooled row keeps
_ROWS = ("xt", "t", "x1", "loss_mask", "log_q", "weight", "reveal", "clean")


def _first_rows(batch, n: int):
    return replace(batch, **{f.name: None if getattr(batch, f.name) is None else getattr(batch, f.name)[:n]
                             for f in fields(batch)})  # fmt: skip


class Replayed(Target):
    """`target` whose rollouts each serve `reuse` updates on average (module doc). Stats: the target's, and
    `reused`, the share of the batch's rows taken from the pool."""

    def __init__(self, target: Target, reuse: int):
        if int(reuse) < 2:
            raise ValueError(f"reuse must be >= 2 (1: no pool, the target itself), got {reuse}")
        self.target, self.reuse = target, int(reuse)
        self.pool: dict[str, Tensor] = {}

    def __call__(self, batch, t, path, generator=None, *, model=None):
        batch = as_batch(batch)
        B = batch.x1.shape[0]
        held = self.pool["xt"].shape[0] if self.pool else 0
        fresh = max(-(-B // self.reuse), B - held)
        new = self.target(_first_rows(batch, fresh), t[:fresh], path, generator, model=model)
        if new.xt.shape[0] != fresh:
            raise ValueError(f"{type(self.target).__name__} returns {new.xt.shape[0]} rows for {fresh}: a pool keeps "
                             "targets of one row per sequence")  # fmt: skip
        rows = {name: getattr(new, name) for name in _ROWS if getattr(new, name) is not None}
        self.pool = {name: value.to(new.xt.device) for name, value in self.pool.items()}  # as restored: on the CPU
        if fresh < B:
            pick = torch.randperm(held, generator=generator, device=generator.device if generator else None)[: B - fresh]
            pick = pick.to(new.xt.device)
            out = {name: torch.cat([value, self.pool[name][pick]]) for name, value in rows.items()}
        else:
            out = rows
        keep = self.reuse * B
        self.pool = {name: (torch.cat([self.pool[name], value]) if self.pool else value)[-keep:].detach()
                     for name, value in rows.items()}  # fmt: skip
        stats = {**new.stats, "reused": torch.tensor((B - fresh) / B, device=new.xt.device)}
        return TargetBatch(**out, stats=stats)

    def training_state(self) -> dict:
        return {"pool": {name: value.cpu() for name, value in self.pool.items()}}

    def load_training_state(self, state: dict) -> None:
        self.pool = {name: torch.as_tensor(value) for name, value in state.get("pool", {}).items()}

    def to(self, device):
        self.target = self.target.to(device)
        self.pool = {name: value.to(device) for name, value in self.pool.items()}
        return self

    def __repr__(self) -> str:
        return f"Replayed({self.target!r}, reuse={self.reuse})"
