"""The target interface: what p_{1|t} the denoiser must match (DESIGN.md, MATH.md §3).

A target turns a `Batch` of clean proposals x_1 (plus conditioning positions and weights) and times t into a
`TargetBatch`: the noisy input x_t the student sees and, for every position, the N^1 target conditional
q^i(·) = p_{1|t}(x_1^i = · | x_1^{≠i}, x_t) — either explicitly (`log_q`, a distribution over the V clean
tokens) or as a Monte Carlo sample (the observed token `x1`, when `log_q` is None). Objectives consume
only `TargetBatch`, so a new target never touches an objective or the trainer.

Call contract: `target(batch, t, path, generator=None, *, model=None)`. `model` is the model being trained,
handed over by the objective on every call (on-policy targets sample it; others ignore it); frozen models a
target owns (teachers, the run's frozen reference) are given to its constructor once, when the run is built. What a call
wants logged travels back in `TargetBatch.stats` (detached 0-d tensors), never in target state.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from tcsm.core.batch import Batch, as_batch
from tcsm.paths import ProbabilityPath


@dataclass
class TargetBatch:
    xt: Tensor  # LongTensor[B, L]: the student's input
    t: Tensor  # FloatTensor[B]
    x1: Tensor  # LongTensor[B, L]: clean proposal; the observed token of the Monte Carlo target
    loss_mask: Tensor  # BoolTensor[B, L]: positions whose target is not a point mass
    log_q: Tensor | None = None  # FloatTensor[B, L, V]: explicit N^1 target conditionals
    weight: Tensor | None = None  # FloatTensor[B]: per-sequence weights (e.g. importance weights)
    stats: dict[str, Tensor] = field(default_factory=dict)  # what the target reports about this call
    # BoolTensor[B, L]: a sampler step's reveal set R whose tokens `x1` were drawn jointly (MATH.md §10); a model
    # with a step head reads them, left to right over R (`models.kinds.denoise`)
    reveal: Tensor | None = None
    # LongTensor[B, L]: the clean sequences a block model reads its prefixes from where `x1` is not them (the joint
    # student on a block path: x1 holds the teacher's draws at R; `models.kinds.denoise`); None: x1
    clean: Tensor | None = None

    @property
    def explicit(self) -> bool:
        return self.log_q is not None

    def with_weight(self, weight: Tensor) -> TargetBatch:
        return replace(self, weight=weight if self.weight is None else self.weight * weight)


def freeze(model):
    """Eval mode and no gradients: how targets hold teachers and references (never trained through)."""
    if isinstance(model, torch.nn.Module):
        model.eval().requires_grad_(False)
    return model


class Target:
    """Base class. Subclasses implement `__call__(batch, t, path, generator=None, *, model=None)`.

    Targets may hold frozen models (teachers, references); they are never trained through. Statistics of a call
    (e.g. mean reward, effective sample size) go in the returned `TargetBatch.stats`; the objective logs them as
    `target/<name>` metrics.
    """

    def __call__(
        self,
        batch: Batch | Tensor,
        t: Tensor,
        path: ProbabilityPath,
        generator: torch.Generator | None = None,
        *,
        model=None,
    ) -> TargetBatch:
        raise NotImplementedError

    def to(self, device) -> Target:
        return self


class DataTarget(Target):
    """h = p_{1|t} realised by data: x_1 ~ data, x_t ~ p_{t|1}(· | x_1); the target is the observed token
    (Monte Carlo form, MATH.md §3.4)."""

    def __call__(self, batch, t, path, generator=None, *, model=None):
        batch = as_batch(batch)
        xt = batch.noised(path, batch.x1, t, generator)
        return TargetBatch(xt=xt, t=t, x1=batch.x1, loss_mask=batch.scored(path, xt))


class ConditionalTarget(Target):
    """Explicit target from an LM of the data: `log_p1_cond(x1)` → log p_1(y | x_1^{≠i}) [B, L, V],
    combined with the kernel: q^i ∝ p_1(· | x_1^{≠i}) k_t(x_t^i | ·) (MATH.md §1.3, §4).

    Any callable works: the exact conditionals of an enumerable toy, a BERT / AR / Hollow teacher.
    """

    def __init__(self, log_p1_cond):
        self.log_p1_cond = log_p1_cond

    def __call__(self, batch, t, path, generator=None, *, model=None):
        batch = as_batch(batch)
        x1 = batch.x1
        xt = batch.noised(path, x1, t, generator)
        with torch.no_grad():
            log_p1 = self.log_p1_cond(x1)
            # Half precision would blur small target probabilities; float64 oracles stay exact.
            if log_p1.dtype in (torch.float16, torch.bfloat16):
                log_p1 = log_p1.float()
            log_q = path.target_conditional(log_p1, xt, t)
        return TargetBatch(xt=xt, t=t, x1=x1, loss_mask=batch.scored(path, xt), log_q=log_q)
