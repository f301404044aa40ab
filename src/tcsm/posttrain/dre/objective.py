"""Density-ratio post-training objectives for the trainer (MATH.md §5.1; the contract is `tcsm.core.protocols`).

Each step draws t ~ U(0, 1) (antithetic), x_t from the data batch through the target (conditioning positions
are never noised or scored), n negatives x̂_1 ~ p^ref_{1|t}(· | x_t) from the frozen reference (factorized,
carry-over), and minimises the Bregman DRE loss written once in `tcsm.posttrain.dre.losses.dre_loss`:

    L = E_ref[F'(r) r − F(r)] − E_data[F'(r)],   r* = p_{1|t} / p^ref_{1|t}.

* `DensityRatioObjective`, strategy (i): r = p^θ / p^ref with the student's own factorized denoiser, per
  position at the N^1-conditional level (`level="token"`, the minimiser is the posterior marginal) or for the
  whole sequence; the reference is a frozen model, the trainer's EMA or the previous iterate (`dre_references`).
* `EnergyObjective`, strategy (ii): r = e^{f_θ(x_1, x_t, t)} with the `EnergyModel`'s head over its frozen
  reference; it brings its own evaluation (the IS-estimated masked bound beside the reference's valid bound,
  `tcsm.posttrain.dre.likelihood`) and sampler (SIR, `tcsm.posttrain.dre.sir`).

Scales: token level is nats per token (Σ over positions / L, mean over the batch); sequence level (and
strategy (ii)) is per sequence. Batch weights multiply a sequence's data term and its negatives' terms.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from tcsm.core.batch import Batch, as_batch
from tcsm.core.protocols import StepInfo
from tcsm.models.kinds import denoise
from tcsm.paths import ProbabilityPath
from tcsm.paths.timesteps import sample_times
from tcsm.posttrain.dre.energy import EnergyModel
from tcsm.posttrain.dre.likelihood import energy_estimate_cost, evaluate_energy_estimate
from tcsm.posttrain.dre.losses import (
    DRE_LOSSES,
    draw_reference_samples,
    dre_loss,
    energy_log_ratio,
    factorized_log_ratio,
    log_mean_exp,
    reference_log_probs,
)
from tcsm.posttrain.dre.references import EMAReference, PreviousIterateReference
from tcsm.posttrain.dre.sir import sample_sir
from tcsm.targets.base import DataTarget, Target, TargetBatch

__all__ = ["DensityRatioObjective", "EnergyObjective"]


def _unwrap(model: nn.Module) -> nn.Module:
    """The module inside the trainer's DDP (`.module`) and torch.compile (`._orig_mod`) wrappers."""
    for attr in ("_orig_mod", "module", "_orig_mod"):
        model = getattr(model, attr, model)
    return model


def _mean(x: Tensor) -> Tensor:
    return x.float().sum() / max(1, x.numel())


class _DRE:
    """What both strategies share: t and x_t from the batch, negatives from p^ref, the weighted loss, metrics."""

    level = "sequence"

    def __init__(
        self,
        path: ProbabilityPath,
        *,
        loss: str = "bce",
        num_negatives: int = 1,
        target: Target | None = None,
        antithetic: bool = True,
        time_dtype: torch.dtype = torch.float32,
    ):
        if loss not in DRE_LOSSES:
            raise ValueError(f"unknown DRE loss {loss!r}; choose one of {sorted(DRE_LOSSES)}")
        if int(num_negatives) < 1:
            raise ValueError(f"num_negatives must be >= 1, got {num_negatives}")
        self.path, self.loss, self.num_negatives = path, loss, int(num_negatives)
        self.target = target if target is not None else DataTarget()
        self.antithetic, self.time_dtype = bool(antithetic), time_dtype

    def _draw(self, batch: Batch, reference, generator) -> tuple[TargetBatch, Tensor, Tensor]:
        """(x_t batch, log m^ref [B, L, V], negatives [B, n, L]) for one step."""
        B = batch.x1.shape[0]
        t = sample_times(
            B, antithetic=self.antithetic, generator=generator, device=batch.x1.device, dtype=self.time_dtype
        )
        tb = self.target(batch, t, self.path, generator)
        ref_lp = reference_log_probs(reference, tb.xt, tb.t, tb.x1)
        neg = draw_reference_samples(
            ref_lp, tb.xt, self.path, self.num_negatives, generator, fixed=batch.cond_mask, values=batch.x1
        )
        return tb, ref_lp, neg

    def _loss(self, l_data: Tensor, l_ref: Tensor, tb: TargetBatch, batch: Batch) -> tuple[Tensor, dict]:
        """dre_loss with per-entry weights: the batch mean (and, per token, Σ over positions / L)."""
        B, n = l_ref.shape[:2]
        w = torch.ones(B, device=l_data.device) if batch.weight is None else batch.weight.float()
        if self.level == "token":
            w_data = tb.loss_mask.float() * w[:, None] / (B * tb.xt.shape[1])
            w_ref = w_data.unsqueeze(1).expand_as(l_ref) / n
            keep_data, keep_ref = tb.loss_mask, tb.loss_mask.unsqueeze(1).expand_as(l_ref)
        else:
            w_data, w_ref = w / B, (w / (B * n)).unsqueeze(1).expand_as(l_ref)
            keep_data, keep_ref = (
                torch.ones_like(l_data, dtype=torch.bool),
                torch.ones_like(l_ref, dtype=torch.bool),
            )
        loss = dre_loss(l_data, l_ref, self.loss, data_weight=w_data, ref_weight=w_ref, reduction="sum")
        with torch.no_grad():
            d, r = l_data.detach()[keep_data], l_ref.detach()[keep_ref]
            # The ratio as a classifier of data vs reference draws (threshold r = 1; ties count half).
            acc_d = _mean((d > 0).float() + 0.5 * (d == 0).float())
            acc_r = _mean((r < 0).float() + 0.5 * (r == 0).float())
            metrics = {
                "loss": loss.detach().float(),
                "log_r_data": _mean(d),
                "log_r_ref": _mean(r),
                "accuracy": 0.5 * (acc_d + acc_r),
                "masked_fraction": tb.loss_mask.float().mean(),
                "t_mean": tb.t.float().mean(),
            }
        return loss, metrics

    def to(self, device):
        self.target = self.target.to(device)
        return self


class DensityRatioObjective(_DRE):
    """Strategy (i): r = p^θ/p^ref, log r = Σ_{i∈M(x_t)} [log m^θ_i − log m^ref_i] at the drawn tokens, per position
    (level "token") or summed (level "sequence") (MATH.md §5.1 (i), §8 item 13).

    `reference`: a frozen denoiser (any callable (x_t, t) → logits), "ema" or "previous" (with `refresh_every`).
    The run's frozen reference (`reference.path`) is given here once, when the run is built. The objective is a
    `TrainerCallback` so that the EMA / previous-iterate references see the trainer's models.
    """

    def __init__(
        self,
        path: ProbabilityPath,
        reference: nn.Module | str | None = None,
        *,
        level: str = "token",
        refresh_every: int = 100,
        **kwargs,
    ):
        super().__init__(path, **kwargs)
        if level not in ("token", "sequence"):
            raise ValueError(f"level must be token or sequence, got {level!r}")
        self.level = level
        if reference == "ema":
            self.source = EMAReference()
        elif reference == "previous":
            self.source = PreviousIterateReference(refresh_every)
        elif isinstance(reference, str):
            raise ValueError(f"reference must be a model, 'ema' or 'previous', got {reference!r}")
        else:
            self.source = None
            self.reference = reference

    def _reference(self):
        ref = self.source.module if self.source is not None else self.reference
        if ref is None:
            raise RuntimeError(
                "this DRE objective has no reference yet: give it one (reference=...), or let the trainer call on_fit_start"
            )
        return ref

    def on_fit_start(self, info: StepInfo) -> None:
        if self.source is not None:
            self.source.on_fit_start(info)

    def on_step_end(self, info: StepInfo) -> None:
        if self.source is not None:
            self.source.on_step_end(info)

    def __call__(self, model, batch, generator=None) -> tuple[Tensor, dict[str, Tensor]]:
        batch = as_batch(batch)
        tb, ref_lp, neg = self._draw(batch, self._reference(), generator)
        stu_lp = torch.log_softmax(denoise(model, tb.xt, tb.t, tb.x1).float(), dim=-1)
        per_token = self.level == "token"
        l_data = factorized_log_ratio(stu_lp, ref_lp, tb.x1, tb.loss_mask, per_token=per_token)
        l_ref = factorized_log_ratio(stu_lp, ref_lp, neg, tb.loss_mask, per_token=per_token)
        return self._loss(l_data, l_ref, tb, batch)


class EnergyObjective(_DRE):
    """Strategy (ii): r = e^{f_θ(x_1, x_t, t)} for an `EnergyModel` (frozen p^ref + head), sequence level; "bce" is
    EDLM's NCE (MATH.md §5.1 (ii)). Data and negatives go through the model in one call (one forward per step,
    as DDP expects).

    `evaluate`: the reference's valid masked bound and the energy model's IS estimate for each n in
    `log_z_samples` (`tcsm.posttrain.dre.likelihood`). `sample`: SIR, with the run's sampler settings (the
    config's `sample:` section: `sir_k` candidates inside `sir_window`, `sir_temperature`).
    """

    #: the registered sampler `sample` implements (`tcsm.posttrain.dre.sampler`)
    sampler = "sir"

    def __init__(
        self,
        path: ProbabilityPath,
        *,
        eval_num_t: int = 8,
        log_z_samples: Sequence[int] = (1, 4, 16),
        eval_max_rows: int = 8192,
        **kwargs,
    ):
        super().__init__(path, **kwargs)
        ns = [int(n) for n in log_z_samples]
        if not ns or min(ns) < 1:
            raise ValueError(
                f"log_z_samples must be a non-empty list of positive integers, got {list(log_z_samples)}"
            )
        if int(eval_max_rows) < 1:
            raise ValueError(f"eval_max_rows must be >= 1, got {eval_max_rows}")
        self.eval_num_t, self.log_z_samples, self.eval_max_rows = int(eval_num_t), ns, int(eval_max_rows)

    @staticmethod
    def _energy_model(model) -> EnergyModel:
        net = _unwrap(model)
        if not isinstance(net, EnergyModel):
            raise TypeError(f"strategy (ii) trains an EnergyModel, got {type(net).__name__}")
        return net

    def __call__(self, model, batch, generator=None) -> tuple[Tensor, dict[str, Tensor]]:
        batch = as_batch(batch)
        tb, _, neg = self._draw(batch, self._energy_model(model).reference, generator)
        f = energy_log_ratio(model, torch.cat([tb.x1.unsqueeze(1), neg], dim=1), tb.xt, tb.t)
        loss, metrics = self._loss(f[:, 0], f[:, 1:], tb, batch)
        metrics["log_z_plugin"] = log_mean_exp(f[:, 1:].detach().float(), dim=-1).mean()
        return loss, metrics

    def evaluate(
        self, model, data: Tensor, *, batch_size: int, generator=None, device=None, progress=False
    ) -> dict:
        net = self._energy_model(model)
        return evaluate_energy_estimate(
            net.reference,
            net,
            data,
            self.path,
            batch_size=batch_size,
            num_t=self.eval_num_t,
            num_samples=self.log_z_samples,
            generator=generator,
            max_rows=self.eval_max_rows,
            device=device,
            progress=progress,
        )

    def evaluation_cost(self, num_sequences: int, length: int, which: str) -> str:
        """What `evaluate` on `num_sequences` sequences of `length` tokens (`which`, for the message) will cost: the
        IS estimate's energy calls (`likelihood.energy_estimate_cost`), in one line."""
        ns = max(self.log_z_samples)
        rows = energy_estimate_cost(self.path, num_sequences, length, self.eval_num_t, ns)
        return (f"energy-model estimate on {which} x {self.eval_num_t} times x n={ns} reference draws: about "
                f"{rows:,.0f} energy calls")  # fmt: skip

    def sample(self, model, num: int, length: int, generator=None, device=None, *, settings=None, fixed=None,
               values=None):  # fmt: skip
        """SIR over the energy model's frozen reference (MATH.md §6.3) with the run's `SIRSettings`: `steps`,
        `grid`, `sir_k` candidates inside `sir_window`, selection temperature `sir_temperature`."""
        from tcsm.posttrain.dre.sampler import SIRSettings

        s = settings or SIRSettings()
        net = self._energy_model(model)
        return sample_sir(
            net.reference,
            net,
            self.path,
            batch_size=num,
            length=length,
            num_steps=s.steps,
            num_candidates=s.sir_k,
            window=s.sir_window,
            temperature=s.sir_temperature,
            grid=s.grid,
            fixed=fixed,
            values=values,
            generator=generator,
            device=device,
            return_stats=True,
        )
