"""Where strategy (i)'s reference p^ref comes from when it is not a fixed checkpoint (MATH.md §5.1 "Reference
choices"): the trainer's EMA copy of the student, or the student's previous iterate (SPIN-like). Both are
`TrainerCallback`s that the DRE objective forwards the trainer's calls to; both are only ever read without
gradient (`tcsm.posttrain.dre.losses.reference_log_probs`), so no gradient reaches them.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn

from tcsm.core.errors import CheckpointError, ConfigError
from tcsm.core.protocols import StepInfo
from tcsm.storage.checkpoint import PREFIX, load_weights_into, read_weights, validate_checkpoint

__all__ = ["EMAReference", "PreviousIterateReference"]


class EMAReference:
    """p^ref = the trainer's EMA of the student θ_ema (updated by the trainer after each step; exact on resume,
    since the EMA weights are part of every checkpoint)."""

    def __init__(self):
        self.module: nn.Module | None = None

    def on_fit_start(self, info: StepInfo) -> None:
        if info.ema_model is None:
            raise ConfigError("objective.reference=ema needs the trainer's EMA: set train.ema > 0")
        self.module = info.ema_model

    def on_step_end(self, info: StepInfo) -> None:
        pass


class PreviousIterateReference:
    """p^ref = θ_{k·N}, the student as it was at the last multiple of N = `refresh_every` steps (SPIN-like).

    The copy is refreshed after every N-th step. A run resumed at step s continues exactly when s is a multiple
    of N (the restored student is the reference) or when the checkpoint of step N⌊s/N⌋ is still in the run
    directory (its weights are loaded); otherwise resuming would silently change the reference, so it is refused.
    """

    def __init__(self, refresh_every: int):
        if int(refresh_every) < 1:
            raise ConfigError(f"objective.refresh_every must be >= 1, got {refresh_every}")
        self.refresh_every = int(refresh_every)
        self.module: nn.Module | None = None

    def _copy(self, model: nn.Module) -> None:
        if self.module is None:
            try:
                self.module = copy.deepcopy(model).eval().requires_grad_(False)
            except (RuntimeError, AssertionError) as e:  # FSDP2 refuses to deep-copy a sharded module
                raise ConfigError(
                    f"objective.reference=previous cannot copy this student ({e}); use train.strategy=ddp, or "
                    "objective.reference=ema"
                ) from None
        with torch.no_grad():
            for dst, src in zip(self.module.state_dict().values(), model.state_dict().values()):
                dst.copy_(src)

    def on_fit_start(self, info: StepInfo) -> None:
        self._copy(info.model)
        anchor = info.step - info.step % self.refresh_every
        if anchor == info.step:
            return
        where = None if info.run_dir is None else Path(info.run_dir) / "checkpoints" / f"{PREFIX}{anchor:08d}"
        try:
            validate_checkpoint(where)
        except (CheckpointError, TypeError):
            raise CheckpointError(
                f"cannot resume at step {info.step} exactly: the previous-iterate reference is the student of "
                f"step {anchor}, whose checkpoint is not in the run directory; resume from a step that is a "
                "multiple of objective.refresh_every, or keep every checkpoint (train.keep_last=0)"
            ) from None
        weights = read_weights(where, device=next(self.module.parameters()).device)
        load_weights_into(self.module, weights, str(where))

    def on_step_end(self, info: StepInfo) -> None:
        if info.step % self.refresh_every == 0:
            self._copy(info.model)
