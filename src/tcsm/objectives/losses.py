"""The per-position N^1 losses L_distrib and L_score with their divergences, and the capped L_score gradient
(MATH.md §3, §3.6). A loss is `(logits, batch, path, **kw) -> Tensor` [B, L] or [B]; `LOSSES` names them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from tcsm.core.parts import Parts
from tcsm.objectives.divergences import BregmanGenerator, get_bregman, get_f_divergence
from tcsm.paths import ProbabilityPath
from tcsm.targets.base import TargetBatch

#: Floor on log-probabilities wherever a loss needs ratios of them (MATH.md §3.4: "clamp log-probs, e.g. at −30").
DEFAULT_CLAMP = -30.0


LossFn = Callable[..., Tensor]




def _compute_dtype(x: Tensor) -> torch.dtype:
    """Losses run in at least float32 (bf16/fp16 logits are upcast), float64 stays float64."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _loss_rows(logits: Tensor, batch: TargetBatch) -> tuple[Tensor, Tensor, Tensor | None]:
    """Logits, observed tokens and explicit target log q as rows [B·L, V], [B·L], [B·L, V], with every row off the
    loss mask replaced by a neutral one (zero logits, uniform q).

    Neutral rows rather than selected ones: selecting rows by a boolean mask reads the number of selected rows
    back to the host, a stall on every step of an accelerator and a graph break under torch.compile. Replacing
    them keeps what selection gave: whatever a model emits at carry-over positions (even inf/NaN) reaches neither
    the loss nor its gradient (`_place` zeroes their values; `torch.where` passes them no gradient).
    """
    V = logits.shape[-1]
    dtype = _compute_dtype(logits)
    rows = neutral_rows(logits, batch.loss_mask).to(dtype)
    log_q = None
    if batch.explicit:
        uniform = torch.full((), -math.log(V), dtype=dtype, device=logits.device)
        log_q = torch.where(batch.loss_mask.unsqueeze(-1), batch.log_q.to(dtype), uniform).reshape(-1, V)
    z = torch.where(batch.loss_mask, batch.x1, 0)  # ids off the mask need not be valid: never scored
    return rows.reshape(-1, V), z.reshape(-1), log_q


def neutral_rows(logits: Tensor, mask: Tensor) -> Tensor:
    """`logits` [B, L, V] with the rows off `mask` [B, L] set to zero: finite whatever the model emitted there, and
    passing it no gradient (shared by every loss that must ignore carry-over positions without selecting rows)."""
    return torch.where(mask.unsqueeze(-1), logits, logits.new_zeros(()))


def _place(values: Tensor, mask: Tensor) -> Tensor:
    """Per-row values [B·L] as [B, L], zeros off the loss mask (no gradient reaches those rows)."""
    return torch.where(mask, values.reshape(mask.shape), values.new_zeros(()))


def _floor(x: Tensor, clamp: float | None) -> Tensor:
    return x if clamp is None or clamp == -math.inf else x.clamp_min(clamp)


def _gather(x: Tensor, index: Tensor) -> Tensor:
    return x.gather(-1, index.unsqueeze(-1)).squeeze(-1)


def _masked(per_pos: Tensor, mask: Tensor) -> Tensor:
    return torch.where(mask, per_pos, torch.zeros((), dtype=per_pos.dtype, device=per_pos.device))


def _check_logits(logits: Tensor, batch: TargetBatch, path: ProbabilityPath) -> None:
    if logits.shape != batch.xt.shape + (path.vocab_size,):
        raise ValueError(
            f"model returned logits of shape {tuple(logits.shape)}; expected [B, L, V] = "
            f"{tuple(batch.xt.shape) + (path.vocab_size,)} (V clean tokens, no mask logit)"
        )


def distrib_loss(
    logits: Tensor,
    batch: TargetBatch,
    path: ProbabilityPath,
    divergence: str | Callable[[Tensor, Tensor], Tensor] = "kl",
    clamp: float | None = None,
) -> Tensor:
    """Per-position L_distrib [B, L] (MATH.md §3.2, §3.4, §4): D(q^i ‖ m^i_θ(· | x_t)) at loss positions, 0 elsewhere.

    "kl" is reported as the cross-entropy −Σ_y q^i(y) log m^i_θ(y) (= KL + H(q^i)), so that the Monte Carlo
    form −log m^i_θ(x_1^i) (target without `log_q`) is its unbiased estimate. Other divergences (`F_DIVERGENCES`)
    need the explicit q; their log-probabilities are floored at `clamp` (default `DEFAULT_CLAMP`; −inf: none),
    KL is exact unless `clamp` is given.
    """
    _check_logits(logits, batch, path)
    is_kl = isinstance(divergence, str) and divergence == "kl"
    if not batch.explicit and not is_kl:
        raise ValueError(
            f"divergence {divergence!r} needs an explicit target conditional (TargetBatch.log_q); "
            "a Monte Carlo (data) target only supports 'kl' — use a parametric target or the score loss"
        )
    rows, z, log_q = _loss_rows(logits, batch)
    if not batch.explicit and clamp is None:
        value = F.cross_entropy(rows, z, reduction="none")
    elif not batch.explicit:
        value = -_gather(_floor(torch.log_softmax(rows, -1), clamp), z)
    elif is_kl:
        value = -(log_q.exp() * _floor(torch.log_softmax(rows, -1), clamp)).sum(-1)
    else:
        clamp = DEFAULT_CLAMP if clamp is None else clamp
        value = get_f_divergence(divergence)(_floor(log_q, clamp), _floor(torch.log_softmax(rows, -1), clamp))
    return _place(value, batch.loss_mask)


def score_loss(
    logits: Tensor,
    batch: TargetBatch,
    path: ProbabilityPath,
    bregman: str | BregmanGenerator = "gkl",
    clamp: float | None = DEFAULT_CLAMP,
    paper_scale: bool = False,
    divergence: str | BregmanGenerator | None = None,
    tilt: bool | None = None,
    weight_cap: float | str | None = None,
) -> Tensor:
    """Per-position L_score [B, L] (MATH.md §3.2, §3.4): N^1 concrete-score matching with Bregman generator φ.

    Monte Carlo target (z = x_1^i observed): ℓ_φ(z) = Σ_y[ρ_y φ'(ρ_y) − φ(ρ_y)] − Σ_y φ'(1/ρ_y), ρ_y = m_y/m_z;
    for GKL the box ℓ = −V log m_z + 1/m_z + Σ_y log m_y. Explicit target: Σ_y D_φ(q_y/q_z, m_y/m_z) at z = x_1^i.
    Positions where the target gives the observed token (numerically) zero mass, log q^i(x_1^i) ≤ `clamp` (−inf
    when clamp is None), are dropped (loss 0, no gradient; counted by `score_loss.dropped_positions`): under
    z ~ q^i such a z has probability 0, so it carries no weight in E_z Σ_y D_φ(q_y/q_z, m_y/m_z) (MATH.md §3.4),
    while the floor would turn its ratios into ≈ e^{30} q_y (e.g. a reward N^1 target with R = −∞ or −10^5 on the
    data's token, whose per-position losses then reach ~1e14).
    Log-probabilities are floored at `clamp` (MATH.md §8 item 6); `paper_scale=True` divides by V (§8 item 5).
    `divergence` is an alias of `bregman` (so that `Objective(divergence=...)` reaches it).

    `tilt` (Monte Carlo target only; default off — the capped untilted estimator below trains better on the
    uniform source at equal CPU time, docs/benchmarks.md "At an equal CPU-hour budget"; `objective.tilt=true`
    selects it): the kernel-tilted estimator (k_min/k_z) ℓ_φ(m̃, z) with
    m̃ ∝ m/k, k_y = k_t(x_t^i | y). Since q^i ∝ p_1(· | x_1^{≠i}) k (MATH.md §1.3), z ~ q^i reweighted by
    k_min/k_z is z ~ r ∝ q^i/k = p_1(· | x_1^{≠i}), so by §3.4 applied to (r, m̃) its expectation is
    R · E_{z~r} Σ_y D_φ(r_y/r_z, m̃_y/m̃_z) + C with R = Σ_z q^i_z k_min/k_z independent of θ. The loss is linear
    in q^i, so averaging over x_1^{≠i} keeps the factorized minimiser m̃ ∝ q̄/k, i.e. m = the marginal posterior
    (MATH.md §3.4), the same as untilted. It is a reweighting across (t, x_t, i), not the untilted value
    (V KL + IS, §3.3). For GKL this is exact homogeneity: D(q_y/q_z, m_y/m_z) = (k_y/k_z) D(r_y/r_z, m̃_y/m̃_z),
    and the tilt drops the factor k_y/k_min = 1 + b_t on the y = x_t^i ≠ z term. Why: for the uniform source
    the untilted 1/m_z sees m_z ~ (1 − t)/V whenever x_t^i ≠ x_1^i, so κ_t/m_z ~ V/(1 − t)² with probability
    ~(1 − t) — infinite variance under κ_t weighting even at the optimum; the tilted 1/m̃_z is O(1/p_1(z | ·))
    and the weight at z = x_t^i is 1/(1 + b_t). Masked source: k is constant at masked positions, so the tilt
    is the identity there. See docs/benchmarks.md "Pre-training: quality" for the measurement.

    `weight_cap` (Monte Carlo target, GKL and IS generators; MATH.md §3.6): the value returned is the estimator's,
    its gradient is that of the estimator with every importance weight 1/m_y capped at c. None (the default) is
    c = V for the untilted estimator (the default for both sources) and no cap under the tilt; "V" or a number
    sets c for both; `inf` is the paper's gradient. The expected gradient vanishes at the posterior marginal for every c,
    so the optimum does not move, while the 1/m_z term's unbounded gradient — which stops masked L_score from
    training — is bounded by c.
    """
    _check_logits(logits, batch, path)
    gen = get_bregman(divergence if divergence is not None else bregman)
    rows, z, log_q = _loss_rows(logits, batch)
    log_m = _floor(torch.log_softmax(rows, -1), clamp)
    log_m_z = _gather(log_m, z)
    if batch.explicit:
        keep = ~_impossible(_gather(log_q, z), clamp)
        log_q = _floor(log_q, clamp)
        # Dropped rows get a harmless denominator, so that neither their value nor their gradient is inf/NaN.
        log_q_z = torch.where(keep, _gather(log_q, z), torch.zeros((), dtype=log_q.dtype, device=log_q.device))
        log_w = log_q - log_q_z.unsqueeze(-1)
        value = gen.divergence_log(log_w, log_m - log_m_z.unsqueeze(-1)).sum(-1)
        value = torch.where(keep, value, torch.zeros((), dtype=value.dtype, device=value.device))
    elif tilt:
        # A cap on top of the tilt is used only when asked for: measured, the two together diverge
        # (docs/benchmarks.md "At an equal CPU-hour budget").
        cap = math.inf if weight_cap is None else _weight_cap(weight_cap, path.vocab_size)
        value = _tilted_mc_score(gen, rows, z, batch, path, clamp, cap)
    else:
        value = _with_capped_gradient(gen, gen.mc_score(log_m, log_m_z), log_m, log_m_z,
                                      _weight_cap(weight_cap, path.vocab_size))
    if paper_scale:
        value = value / path.vocab_size
    return _place(value, batch.loss_mask)


def _tilted_mc_score(
    gen: BregmanGenerator, rows: Tensor, z: Tensor, batch: TargetBatch, path: ProbabilityPath, clamp, cap: float
) -> Tensor:
    """Kernel-tilted MC score (k_min/k_z) ℓ_φ(m̃, z), m̃ ∝ m/k, k_y = k_t(x_t^i | y) (MATH.md §1.3, §3.4; `score_loss`).

    The floor applies to log m̃ (what the estimator divides by), so it bounds the loss as in the untilted form.
    The cap applies to m̃'s importance weights: under z ~ r ∝ q/k the tilted loss is the untilted one in m̃ (§3.6).
    """
    mask = batch.loss_mask
    log_k = torch.where(mask.unsqueeze(-1), path.log_kernel(batch.xt, batch.t), 0.0)
    log_k = log_k.reshape(rows.shape).to(rows.dtype)
    log_k = log_k - log_k.min(-1, keepdim=True).values
    log_mt = _floor(torch.log_softmax(rows - log_k, -1), clamp)
    log_mt_z = _gather(log_mt, z)
    value = _with_capped_gradient(gen, gen.mc_score(log_mt, log_mt_z), log_mt, log_mt_z, cap)
    return torch.exp(-_gather(log_k, z)) * value


def _weight_cap(cap: float | str | None, vocab_size: int) -> float:
    """The importance-weight cap c of `score_loss` as a number: None or "V" → V, "inf" → ∞ (MATH.md §3.6)."""
    if cap is None or cap == "V":
        return float(vocab_size)
    return float(cap)


def _with_capped_gradient(gen: BregmanGenerator, value: Tensor, log_m: Tensor, log_m_z: Tensor, cap: float) -> Tensor:
    """`value` (the estimator), carrying the gradient of the generator's capped surrogate instead of its own."""
    if cap == math.inf or not gen.importance_weighted:
        return value
    surrogate = gen.mc_score_surrogate(log_m, log_m_z, cap)
    return value.detach() + (surrogate - surrogate.detach())


def _impossible(log_q_z: Tensor, clamp: float | None) -> Tensor:
    """log q(z) at or below the floor (−inf without one): the target gives the observed token no mass."""
    return log_q_z <= (-math.inf if clamp is None else clamp)


def _score_dropped(batch: TargetBatch, clamp: float | None = DEFAULT_CLAMP, **_) -> Tensor:
    """Loss positions the explicit score loss drops (the target's mass on x_1^i is numerically zero), [B, L]."""
    if not batch.explicit:
        return torch.zeros_like(batch.loss_mask)
    log_q_z = _gather(batch.log_q, batch.x1.long())
    return batch.loss_mask & _impossible(log_q_z, clamp)


# Optional `validate(**kwargs)` hooks let `Objective` reject bad names when it is built; optional
# `dropped_positions(batch, **kwargs)` hooks say which loss positions a loss leaves out (reported in the metrics).
score_loss.dropped_positions = _score_dropped


distrib_loss.validate = lambda divergence="kl", **_: get_f_divergence(divergence)


def _validate_score(bregman="gkl", divergence=None, weight_cap=None, **_) -> None:
    gen = get_bregman(divergence if divergence is not None else bregman)
    if weight_cap is None or weight_cap == "V":
        return
    try:
        cap = float(weight_cap)
    except (TypeError, ValueError):
        raise ValueError(f"weight_cap must be a number ≥ 0, 'V' or 'inf', not {weight_cap!r}") from None
    if not cap >= 0:
        raise ValueError(f"weight_cap must be ≥ 0 (0: V × cross-entropy, inf: the paper's), not {weight_cap!r}")
    if cap != math.inf and not gen.importance_weighted:
        raise ValueError(f"weight_cap applies to the gkl and is score losses; the {gen.name!r} estimator has no "
                         "importance weights to cap (MATH.md §3.6)")


score_loss.validate = _validate_score


LOSSES = Parts("loss", {"distrib": distrib_loss, "score": score_loss}, passes=callable)


def get_loss(name: str | LossFn) -> LossFn:
    """Look up a per-position loss by name (one of `LOSSES`) or pass a callable through."""
    return LOSSES.lookup(name)

