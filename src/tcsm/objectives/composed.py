"""TCSM objectives for N^1 targets: L_distrib and L_score, time weighting, reduction (MATH.md §3, §7).

One objective is composed from a path (source + schedule), a target (what p_{1|t} to match), a per-position
loss (distrib / score, with a divergence) and a time weighting ω(t):

    L = E_{t ~ U(0,1)} ω(t) E_{x_1, x_t ~ target} (1/L) Σ_{i ∈ loss positions} ℓ^i(m_θ(· | x_t), q^i)

`Objective(model, batch, generator) -> (loss, metrics)` is the only entry point a trainer needs
(the `TrainingObjective` protocol of `tcsm.core.protocols`; `batch` is a `tcsm.core.batch.Batch` or clean tokens [B, L]). A per-position
loss is any callable `(logits, batch, path, **kw) -> Tensor` of shape [B, L] (per position; positions outside
`batch.loss_mask` are ignored) or [B] (already summed per sequence); register new ones in `LOSSES`, new time
weightings in `WEIGHTINGS`, and new targets through `tcsm.targets.TargetBatch` — none of them edits this file.

Scale conventions: losses are nats per token (Σ over positions / L, mean over the batch). The score loss is
reported at the scale of MATH.md §3.4's box, which is V times the paper's ℓ_pseudo + ℓ_entropy
(`thm:tcsm_train_objective` is off by this factor, MATH.md §8 item 5); pass `paper_scale=True` to divide by V.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import Tensor

from tcsm.core.batch import Batch, as_batch
from tcsm.models.kinds import denoise
from tcsm.objectives.divergences import BregmanGenerator
from tcsm.objectives.losses import LossFn, get_loss
from tcsm.objectives.weighting import WeightFn, get_weighting, reduce_loss
from tcsm.paths import ProbabilityPath
from tcsm.paths.timesteps import sample_times
from tcsm.targets.base import DataTarget, Target, TargetBatch


class Objective:
    """L = E_t ω(t) E_{target} (1/L) Σ_i ℓ^i, composed from path, target, loss, divergence and ω (MATH.md §3, §7).

    `loss`: "distrib" | "score" | any `LOSSES` name | callable (logits, batch, path, **kw) → [B, L] or [B].
    `divergence`: forwarded to the loss (an f-divergence for distrib, a Bregman generator for score).
    `weighting`: a `WEIGHTINGS` name or callable (path, t) → [B]. Extra keyword arguments go to the loss.
    Calling it with (model, x1, generator) draws t (antithetic by default), the target batch and the logits
    `model(x_t, t)`, and returns (scalar loss, metrics of Python floats).
    """

    def __init__(
        self,
        path: ProbabilityPath,
        target: Target | None = None,
        loss: str | LossFn = "distrib",
        divergence: str | Callable | BregmanGenerator | None = None,
        weighting: str | WeightFn = "kappa",
        antithetic: bool = True,
        time_dtype: torch.dtype = torch.float32,
        t_range: tuple[float, float] | None = None,
        **loss_kwargs,
    ):
        self.path = path
        self.target = target if target is not None else DataTarget()
        self.loss_fn = get_loss(loss)
        self.loss_name = loss if isinstance(loss, str) else getattr(loss, "__name__", "custom")
        self.weighting = get_weighting(weighting)
        self.antithetic = bool(antithetic)
        self.time_dtype = time_dtype
        if t_range is not None:
            lo, hi = (float(v) for v in t_range)
            if not 0.0 <= lo < hi <= 1.0:
                raise ValueError(f"t_range must be [lo, hi] with 0 <= lo < hi <= 1, got {list(t_range)}")
            t_range = (lo, hi)
        self.t_range = t_range
        self.loss_kwargs = dict(loss_kwargs)
        if divergence is not None:
            self.loss_kwargs["divergence"] = divergence
        self._validate_loss_kwargs()

    def _validate_loss_kwargs(self) -> None:
        """Fail at construction, not at the first step, on a misspelt option or divergence name."""
        try:
            inspect.signature(self.loss_fn).bind(None, None, None, **self.loss_kwargs)
        except TypeError as err:
            raise ValueError(
                f"invalid options {sorted(self.loss_kwargs)} for loss {self.loss_name!r}: {err}"
            ) from None
        validate = getattr(self.loss_fn, "validate", None)
        if validate is not None:
            validate(**self.loss_kwargs)

    def sample_t(self, batch_size: int, device=None, generator: torch.Generator | None = None) -> Tensor:
        """t ~ U(0, 1) per sequence, antithetic across the batch unless disabled (MATH.md §3.4); U[lo, hi] with
        `t_range` (a clipped schedule, MATH.md §9)."""
        t = sample_times(
            batch_size, antithetic=self.antithetic, generator=generator, device=device, dtype=self.time_dtype
        )
        if self.t_range is None:
            return t
        lo, hi = self.t_range
        return (lo + (hi - lo) * t.double()).to(t.dtype).clamp_max(1.0 - torch.finfo(t.dtype).eps / 2)

    def loss_from_batch(self, logits: Tensor, batch: TargetBatch) -> tuple[Tensor, dict[str, Tensor]]:
        """The reduced loss and metrics (detached 0-d tensors) for logits computed on `batch` (MATH.md §3.4)."""
        per_pos = self.loss_fn(logits, batch, self.path, **self.loss_kwargs)
        omega = self.weighting(self.path, batch.t)
        loss = reduce_loss(per_pos, batch, omega)
        with torch.no_grad():
            raw = reduce_loss(per_pos.detach(), batch, None)
            frac = batch.loss_mask.float().mean()
            metrics = {
                "loss": loss.detach().float(),
                "loss_unweighted": raw.float(),
                "loss_positions": frac,
                "t_mean": batch.t.float().mean(),
            }
            dropped = getattr(self.loss_fn, "dropped_positions", None)
            if dropped is not None and batch.explicit:
                metrics["dropped_positions"] = dropped(batch, **self.loss_kwargs).sum().float()
        return loss, metrics

    def __call__(
        self, model, batch: Batch | Tensor, generator: torch.Generator | None = None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """Draw t and a target batch for the clean batch, run `model(x_t, t)`, return (loss, metrics).

        `generator` (None: the global RNG) must live on the batch's device; it drives t, the noise and the
        target. `model` is handed to the target (on-policy targets sample it).
        Metrics are detached 0-d tensors on the batch's device (no host sync per step).
        """
        batch = as_batch(batch)
        x1 = batch.x1
        t = self.path.draw_times(lambda n: self.sample_t(n, device=x1.device, generator=generator), *x1.shape)
        tb = self.target(batch, t, self.path, generator, model=model)
        if batch.weight is not None:  # targets may expand each sequence into several rows (N^full)
            tb = tb.with_weight(batch.weight.repeat_interleave(tb.xt.shape[0] // batch.x1.shape[0]))
        logits = denoise(model, tb.xt, tb.t, tb.x1, tb.reveal, tb.clean)
        loss, metrics = self.loss_from_batch(logits, tb)
        return loss, {**metrics, **{f"target/{k}": v for k, v in tb.stats.items()}}

    def to(self, device) -> Objective:
        self.target = self.target.to(device)
        return self

    def __repr__(self) -> str:
        kw = ", ".join(f"{k}={v!r}" for k, v in self.loss_kwargs.items())
        return (
            f"Objective(path={self.path!r}, target={type(self.target).__name__}, loss={self.loss_name!r}"
            f"{', ' + kw if kw else ''}, weighting={getattr(self.weighting, '__name__', self.weighting)!r}, "
            f"antithetic={self.antithetic})"
        )

