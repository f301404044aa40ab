"""The contract between the trainer and what it trains (DESIGN.md "The objective contract").

The trainer calls an objective and nothing else method-specific; optional capabilities are declared by these
protocols and checked with `isinstance`, never discovered by attribute probing:

* `TrainingObjective`: `objective(model, batch, generator)` → (scalar loss, metrics), where `batch` is a
  `tcsm.core.batch.Batch` (or clean tokens [B, L]) and metrics are detached 0-d tensors. A run's frozen reference
  is handed to the objective (or its target) once, by its constructor, when the run is built; no call passes it.
* `Evaluates`: the objective brings its own validation metric (an LM's NLL instead of a diffusion bound);
* `Samples`: the objective brings its own sampler (an AR model, SIR over an energy model), or says it has none
  (returns no tokens); it receives the settings of the registered sampler its `sampler` attribute names (default "own") and any pinned positions;
* `TrainerCallback`: something of the run (an objective, a target) wants to act at fixed points of training,
  e.g. refresh a previous-iterate reference or a sample pool. The trainer calls every callback it is given;
* `KeepsState`: an objective or target carries state across steps that an exact resume needs (a rollout buffer);
  checkpoints store `training_state()` and a resume hands it back to `load_training_state`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

__all__ = ["Evaluates", "KeepsState", "Samples", "StepInfo", "TrainerCallback", "TrainingObjective"]


@runtime_checkable
class TrainingObjective(Protocol):
    def __call__(
        self, model, batch, generator: torch.Generator | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]: ...


@runtime_checkable
class Evaluates(Protocol):
    def evaluate(
        self, model, data: Tensor, *, batch_size: int, generator=None, device=None, progress=False
    ) -> dict:
        """`progress` (optional: an evaluator may leave it out): the caller wants progress on stderr, which an
        evaluation that can take minutes should show. An evaluation that is costly also offers
        `evaluation_cost(num_sequences, length, which) -> str`: one line saying what it will cost, which `tcsm eval`
        prints before it starts (`which` names the sequences, e.g. "the first 64 of 512 valid sequences")."""
        ...


@runtime_checkable
class Samples(Protocol):
    def sample(
        self,
        model,
        num: int,
        length: int,
        generator=None,
        device=None,
        *,
        settings=None,
        fixed=None,
        values=None,
    ) -> tuple[Tensor | None, Any]:
        """(tokens [num, length] or None when the model has no sampler, stats with `.method` and `.num_calls`).
        `settings`: the run's settings of the sampler it names (None: their defaults); `fixed` / `values` [num, length] pin
        positions (a prompt, an infilling template), or raise ValueError if this sampler cannot honour them."""
        ...


@dataclass(frozen=True)
class StepInfo:
    """What a callback sees: the step just completed (0 before the first), the trained model, its EMA copy."""

    step: int
    model: torch.nn.Module
    ema_model: torch.nn.Module | None
    run_dir: Any = None


@runtime_checkable
class TrainerCallback(Protocol):
    def on_fit_start(self, info: StepInfo) -> None: ...

    def on_step_end(self, info: StepInfo) -> None: ...


@runtime_checkable
class KeepsState(Protocol):
    def training_state(self) -> dict:
        """Tensors, numbers, strings, lists and dicts of them (what a checkpoint can hold, without pickle)."""
        ...

    def load_training_state(self, state: dict) -> None: ...
