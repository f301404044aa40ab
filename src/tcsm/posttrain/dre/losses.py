"""Density-ratio post-training against a frozen reference p^ref_{1|t} (MATH.md §5.1, §8 items 11–14).

The true ratio r = p_{1|t} / p^ref_{1|t} is fitted by Bregman density-ratio estimation, written once from a
generator F of `tcsm.objectives.divergences` and evaluated on log r:

    L_DRE = E_ref[F'(r) r − F(r)] − E_data[F'(r)],   minimiser r = p / p^ref pointwise (MATH.md §5.1).

"data" samples are data x_1 with their own x_t ~ p_{t|1}; "ref" samples are x̂_1 ~ p^ref_{1|t}(· | x_t) for the
same x_t (`draw_reference_samples`). Two parameterisations supply log r:

* (i) a factorized student over the reference, log r = Σ_{i∈M(x_t)} [log m^θ_i − log m^ref_i] at the drawn
  tokens (`factorized_log_ratio`), at the sequence level or per token (the N^1-conditional level);
* (ii) an energy / ratio head, log r = f_θ(x_1, x_t, t), one scalar per sequence (`energy_log_ratio`), so
  p^θ_{1|t} ∝ p^ref_{1|t} e^{f_θ} (EDLM; MATH.md §8 item 13).

The reference is only ever evaluated under `torch.no_grad()`: gradients reach the student or the head alone.
For strategy (ii) the normaliser Z(x_t) = E_ref[e^f] is intractable: `tcsm.posttrain.dre.likelihood` estimates
log Ẑ from reference draws (`log_mean_exp` of f; biased low, see there). The objectives compose these pieces
(`tcsm.posttrain.dre.objective`); tests check them against composed reference losses (tests/.../dre_oracles.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from tcsm.models.kinds import denoise
from tcsm.objectives.divergences import BregmanGenerator, get_bregman
from tcsm.paths import ProbabilityPath

__all__ = [
    "DRE_LOSSES",
    "EnergyFn",
    "draw_reference_samples",
    "dre_loss",
    "energy_log_ratio",
    "factorized_log_ratio",
    "log_mean_exp",
    "reference_log_probs",
]

#: (x_1 LongTensor[b, L], x_t LongTensor[b, L], t FloatTensor[b]) -> f FloatTensor[b], the log-ratio head.
EnergyFn = Callable[[Tensor, Tensor, Tensor], Tensor]
Denoiser = Callable[[Tensor, Tensor], Tensor]

#: The paper's DRE names (MATH.md §5.1 table) → Bregman generators. "bce" is the logistic generator
#: F = r log r − (1+r) log(1+r); "gkl" uses φ = u log u, which differs from r log r − r by a linear term and
#: hence only shifts the loss by a constant (the Bregman divergence is the same).
DRE_LOSSES: dict[str, str] = {"lsif": "squared", "bce": "logistic", "gkl": "gkl"}


def _generator(bregman: str | BregmanGenerator) -> BregmanGenerator:
    if isinstance(bregman, str) and bregman in DRE_LOSSES:
        bregman = DRE_LOSSES[bregman]
    return get_bregman(bregman)


def _weighted(term: Tensor, weight: Tensor | None) -> Tensor:
    if weight is None:
        return term
    weight = torch.as_tensor(weight, dtype=term.dtype, device=term.device)
    # A weight of 0 masks an entry even where its term is ±inf (e.g. log r = −inf at an impossible token).
    return torch.where(weight == 0, torch.zeros((), dtype=term.dtype, device=term.device), weight * term)


def dre_loss(
    log_r_data: Tensor,
    log_r_ref: Tensor,
    bregman: str | BregmanGenerator = "bce",
    *,
    data_weight: Tensor | None = None,
    ref_weight: Tensor | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Bregman DRE loss L = E_ref[F'(r) r − F(r)] − E_data[F'(r)] from log r (MATH.md §5.1); r* = p/p^ref.

    `log_r_data` holds log r at data samples, `log_r_ref` at reference samples (any shapes). Per-entry weights
    (importance weights, masks) multiply the terms. reduction "mean": each expectation is the mean over its
    entries; "sum": the sums. With the generators of `DRE_LOSSES` this is, up to θ-independent constants
    (weighted entry counts c_data, c_ref): lsif = E_ref[r²/2] − E_data[r] + c_data − c_ref/2;
    bce = E_data softplus(−log r) + E_ref softplus(log r) exactly (the appendix sign; MATH.md §8 item 11);
    gkl = E_ref[r] − E_data[log r] − c_data.
    """
    gen = _generator(bregman)
    ref_terms = _weighted(gen.conj_log(log_r_ref), ref_weight)
    data_terms = _weighted(gen.dphi_log(log_r_data), data_weight)
    if reduction == "mean":
        return ref_terms.mean() - data_terms.mean()
    if reduction == "sum":
        return ref_terms.sum() - data_terms.sum()
    raise ValueError(f"unknown reduction {reduction!r}; choose 'mean' or 'sum'")


# --- log-ratios of the two parameterisations -----------------------------------------------------------------


def _lift(x: Tensor, target_dim: int) -> Tensor:
    """Insert sample axes after the batch axis: [B, ...] → [B, 1, ..., 1, ...] with `target_dim` dims."""
    while x.dim() < target_dim:
        x = x.unsqueeze(1)
    return x


def factorized_log_ratio(
    student_log_probs: Tensor,
    reference_log_probs: Tensor,
    x1: Tensor,
    loss_mask: Tensor,
    *,
    per_token: bool = False,
) -> Tensor:
    """Strategy (i): log r = Σ_{i∈M(x_t)} [log m^θ_i(x_1^i|x_t) − log m^ref_i(x_1^i|x_t)] (MATH.md §5.1, §5.3);
    carry-over positions contribute 0.

    Log-probs are [B, L, V] at one x_t per row; `x1` is [B, L] or [B, n, L] (n samples sharing each x_t) and
    `loss_mask` [B, L] marks M(x_t) (`path.loss_mask(xt)`). Returns [B] / [B, n], or with `per_token` the
    per-position log-ratios [B, L] / [B, n, L] (the N^1-conditional level, 0 off M(x_t)).
    """
    d = x1.dim() + 1
    diff = _lift(student_log_probs, d) - _lift(reference_log_probs, d).to(student_log_probs.dtype)
    diff = diff.expand(*x1.shape, diff.shape[-1])
    per_pos = diff.gather(-1, x1.unsqueeze(-1)).squeeze(-1)
    mask = _lift(loss_mask, x1.dim()).expand(x1.shape)
    per_pos = torch.where(mask, per_pos, torch.zeros((), dtype=per_pos.dtype, device=per_pos.device))
    return per_pos if per_token else per_pos.sum(-1)


def energy_log_ratio(energy: EnergyFn, x1: Tensor, xt: Tensor, t: Tensor) -> Tensor:
    """Strategy (ii): log r = f_θ(x_1, x_t, t), one scalar per sequence (MATH.md §5.1, §8 items 12–13).

    `x1` is [B, L] or [B, n, L] (n candidates per x_t, evaluated in one batched call); returns [B] or [B, n].
    """
    if x1.dim() == xt.dim():
        return energy(x1, xt, t)
    B, n, L = x1.shape
    flat_xt = xt.unsqueeze(1).expand(B, n, L).reshape(B * n, L)
    flat_t = t.reshape(-1).expand(B).unsqueeze(1).expand(B, n).reshape(B * n)
    return energy(x1.reshape(B * n, L), flat_xt, flat_t).reshape(B, n)


# --- reference samples -----------------------------------------------------------------------------------------


def reference_log_probs(reference: Denoiser, xt: Tensor, t: Tensor, x1: Tensor | None = None) -> Tensor:
    """log m^ref(· | x_t) [B, L, V], computed without a graph: the reference is frozen (MATH.md §5.1); a block
    reference reads the clean blocks of x1 (MATH.md §9)."""
    with torch.no_grad():
        return torch.log_softmax(denoise(reference, xt, t, x1), dim=-1)


def draw_reference_samples(
    reference_log_probs: Tensor,
    xt: Tensor,
    path: ProbabilityPath,
    num_samples: int,
    generator: torch.Generator | None = None,
    *,
    fixed: Tensor | None = None,
    values: Tensor | None = None,
) -> Tensor:
    """x̂_1 ~ Π_{i∈M(x_t)} m^ref_i(· | x_t), x̂^i = x_t^i elsewhere (carry-over) — n per x_t: [B, n, L]
    (MATH.md §5.1 negatives, §6.3 step 1). Uniform source: every position is drawn; `fixed`/`values` [B, L]
    pin conditioned positions (prompts) to their clean tokens."""
    B, L, V = reference_log_probs.shape
    n = int(num_samples)
    if n < 1:
        raise ValueError(f"num_samples must be >= 1, got {num_samples}")
    probs = reference_log_probs.detach().exp().reshape(B * L, V)
    # multinomial draws n tokens per (row, position) without materialising [B, n, L, V] Gumbel noise.
    draws = (
        torch.multinomial(probs, n, replacement=True, generator=generator).reshape(B, L, n).transpose(1, 2)
    )
    keep = ~path.loss_mask(xt)
    out = torch.where(keep.unsqueeze(1), xt.unsqueeze(1), draws)
    if fixed is not None:
        out = torch.where(fixed.unsqueeze(1), values.unsqueeze(1), out)
    return out


def log_mean_exp(values: Tensor, dim: int = -1) -> Tensor:
    """log (1/n) Σ_j e^{v_j} along `dim`, stable for large |v|."""
    return torch.logsumexp(values, dim=dim) - math.log(values.shape[dim])
