"""Deterministic, resumable, DDP-aware batch indices.

`EpochBatches(num_examples, global_batch, seed, rank=0, world_size=1)` walks epochs forever. Epoch e visits
a permutation of 0..N−1 that depends only on (seed, e); batch k of that epoch is the global batch
perm[k·B:(k+1)·B] (B = global_batch; the N mod B leftover examples of each epoch are skipped, and differ
from epoch to epoch). Rank r of W gets the contiguous slice [r·B/W, (r+1)·B/W) of every global batch, so
W processes together see exactly the batches one process would, in the same order — concatenating the rank
slices in rank order gives the single-process batch.

State is (epoch, position) = how many global batches have been handed out; `state_dict()` /
`load_state_dict()` restore it exactly. Because the state counts global batches, a run may resume with a
different world size (the global batch must stay the same).

    batches = EpochBatches(len(bundle.train), 256, seed=0, rank=rank, world_size=world)
    for step in range(steps):
        x1 = bundle.get_batch("train", next(batches), device)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from tcsm.data.base import DataError

__all__ = ["EpochBatches"]


class EpochBatches:
    """Infinite iterator of this rank's example indices (LongTensor [global_batch / world_size])."""

    def __init__(
        self, num_examples: int, global_batch: int, seed: int = 0, rank: int = 0, world_size: int = 1,
        draws: bool = True,
    ):
        """`draws=False`: an order that is saved but never drawn from (an import, `train.steps=0`), so a split of
        fewer rows than a batch (none: `data.kind=tokenizer`) is allowed."""
        num_examples, global_batch, world_size, rank = (
            int(num_examples),
            int(global_batch),
            int(world_size),
            int(rank),
        )
        if world_size < 1 or not 0 <= rank < world_size:
            raise DataError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
        if global_batch < 1 or global_batch % world_size:
            raise DataError(
                f"global batch size {global_batch} must be a positive multiple of the world size {world_size}"
            )
        if draws and num_examples < global_batch:
            raise DataError(
                f"the split has {num_examples} examples, fewer than one global batch of {global_batch}; "
                "lower the batch size or use more data"
            )
        self.num_examples, self.global_batch, self.seed = num_examples, global_batch, int(seed)
        self.rank, self.world_size = rank, world_size
        self.local_batch = global_batch // world_size
        self.batches_per_epoch = num_examples // global_batch
        self.epoch, self.position = 0, 0
        self._perm_epoch, self._perm = -1, None

    def __len__(self) -> int:
        return self.batches_per_epoch

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of epoch `epoch`: a function of (seed, epoch) only (numpy PCG64, platform-stable)."""
        if self._perm_epoch != epoch:
            rng = np.random.default_rng(np.random.SeedSequence([self.seed, int(epoch)]))
            self._perm, self._perm_epoch = rng.permutation(self.num_examples), int(epoch)
        return self._perm

    def global_indices(self, epoch: int, position: int) -> Tensor:
        """All global_batch indices of batch `position` of `epoch` (what a single process would get)."""
        start = position * self.global_batch
        return torch.from_numpy(self.permutation(epoch)[start : start + self.global_batch].copy())

    def __iter__(self) -> EpochBatches:
        return self

    def __next__(self) -> Tensor:
        g = self.global_indices(self.epoch, self.position)
        self.position += 1
        if self.position == self.batches_per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
        return g[self.rank * self.local_batch : (self.rank + 1) * self.local_batch]

    @property
    def step(self) -> int:
        """Global batches handed out so far."""
        return self.epoch * self.batches_per_epoch + self.position

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "num_examples": self.num_examples,
            "global_batch": self.global_batch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("seed", "num_examples", "global_batch"):
            if key in state and int(state[key]) != getattr(self, key):
                raise DataError(
                    f"cannot resume batching: checkpoint has {key}={state[key]}, this run has "
                    f"{getattr(self, key)}; resume with the same data, seed and global batch size"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position < self.batches_per_epoch:
            raise DataError(f"corrupt batching state: epoch={epoch}, position={position}")
        self.epoch, self.position = epoch, position
