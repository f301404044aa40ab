"""Reference implementations the DRE tests check the library against (kept here, not in the library: the
objectives and the energy-model estimate compute the same quantities inline, batched and chunked).

* `strategy_i_loss` / `strategy_ii_loss`: L_DRE composed from its pieces for one batch (MATH.md §5.1 (i), (ii));
* `estimate_log_partition`: log Ẑ(x_t) from n reference draws (§5.1, §8 item 14);
* `energy_log_marginals`: the energy model's estimated per-token marginals (§5.1)."""

from __future__ import annotations

import torch
from torch import Tensor

from tcsm.objectives.divergences import BregmanGenerator
from tcsm.paths import ProbabilityPath
from tcsm.posttrain.dre.losses import (
    Denoiser,
    EnergyFn,
    draw_reference_samples,
    dre_loss,
    energy_log_ratio,
    factorized_log_ratio,
    log_mean_exp,
    reference_log_probs,
)


def strategy_i_loss(
    student: Denoiser,
    reference: Denoiser,
    path: ProbabilityPath,
    x1: Tensor,
    xt: Tensor,
    t: Tensor,
    *,
    bregman: str | BregmanGenerator = "bce",
    num_negatives: int = 1,
    per_token: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    """L_DRE with r = p^θ/p^ref for a factorized student (MATH.md §5.1 (i)): positives (x_1, x_t) from data,
    n negatives per x_t from the frozen reference. Sequence level by default; `per_token` fits each
    position's N^1 conditional ratio (minimiser: the student's marginals equal the posterior's)."""
    ref_lp = reference_log_probs(reference, xt, t)
    stu_lp = torch.log_softmax(student(xt, t), dim=-1)
    neg = draw_reference_samples(ref_lp, xt, path, num_negatives, generator)
    mask = path.loss_mask(xt)
    l_data = factorized_log_ratio(stu_lp, ref_lp, x1, mask, per_token=per_token)
    l_ref = factorized_log_ratio(stu_lp, ref_lp, neg, mask, per_token=per_token)
    if not per_token:
        return dre_loss(l_data, l_ref, bregman)
    # Per position: weights 1/B and 1/(B n) on M(x_t) make the sums the batch mean of Σ_i over positions.
    B, n = l_ref.shape[:2]
    w = mask.to(l_data.dtype)
    return dre_loss(
        l_data,
        l_ref,
        bregman,
        data_weight=w / B,
        ref_weight=(w / (B * n)).unsqueeze(1).expand_as(l_ref),
        reduction="sum",
    )


def strategy_ii_loss(
    energy: EnergyFn,
    reference: Denoiser,
    path: ProbabilityPath,
    x1: Tensor,
    xt: Tensor,
    t: Tensor,
    *,
    bregman: str | BregmanGenerator = "bce",
    num_negatives: int = 1,
    generator: torch.Generator | None = None,
) -> Tensor:
    """L_DRE with r = e^{f_θ(x_1, x_t, t)} at the sequence level (MATH.md §5.1 (ii)); "bce" is EDLM's NCE,
    E_data softplus(−f) + E_ref softplus(f), with negatives from the frozen reference."""
    ref_lp = reference_log_probs(reference, xt, t)
    neg = draw_reference_samples(ref_lp, xt, path, num_negatives, generator)
    return dre_loss(energy_log_ratio(energy, x1, xt, t), energy_log_ratio(energy, neg, xt, t), bregman)


# --- the normaliser of strategy (ii) ---------------------------------------------------------------------------



def estimate_log_partition(
    energy: EnergyFn,
    reference_log_probs: Tensor,
    xt: Tensor,
    t: Tensor,
    path: ProbabilityPath,
    num_samples: int,
    generator: torch.Generator | None = None,
) -> Tensor:
    """log Ẑ(x_t) = log (1/n) Σ_j e^{f(x̂_j, x_t)}, x̂_j ~ p^ref_{1|t}(· | x_t): [B] (MATH.md §5.1, §8 item 14).

    Ẑ is unbiased for Z = E_ref[e^f], so E[log Ẑ] ≤ log Z (Jensen): biased low, by ≈ Var_ref[e^f] / (2 n Z²)
    for large n, and consistent as n → ∞. Z = 1 at the DRE optimum (self-normalisation).
    """
    x_hat = draw_reference_samples(reference_log_probs, xt, path, num_samples, generator)
    return log_mean_exp(energy_log_ratio(energy, x_hat, xt, t), dim=-1)


def energy_log_marginals(
    energy: EnergyFn,
    reference_log_probs: Tensor,
    xt: Tensor,
    t: Tensor,
    path: ProbabilityPath,
    num_samples: int,
    generator: torch.Generator | None = None,
    *,
    tokens: Tensor | None = None,
) -> Tensor:
    """Estimated per-token marginals of p^θ_{1|t} ∝ p^ref_{1|t} e^f (factorized reference; MATH.md §5.1):

        log m̂^θ_i(y | x_t) = log m^ref_i(y | x_t) + log (1/n) Σ_j e^{f([y, x̂_j^{≠i}], x_t)} − log Ẑ(x_t),

    with one set of n reference samples x̂_j shared by every (i, y) and by Ẑ (common random numbers). `tokens`
    [B, L, C] selects the y to score (default: all V, giving [B, L, V]); the result is [B, L, C].
    Carry-over positions (off `path.loss_mask`) get the point mass δ_{x_t^i}. Cost: n·(1 + L·C) energy rows.

    How the bound uses it: the masked bound of MATH.md §2.2 for the energy model is
    ∫ κ_t E[Σ_{i: x_t^i = M} −log m̂^θ_i(x_1^i | x_t)] dt (pass tokens = x_1[..., None]); i.e. the reference's
    integrand −Σ log m^ref_i(x_1^i) plus Σ_i [log Ẑ − log Ẑ_i(x_1^i)]. log Ẑ enters with a plus sign and is biased
    low, log Ẑ_i with a minus sign, so the result is a consistent *estimate*, not a guaranteed bound (§8 item 14).
    The full [B, L, V] table can also be fed, as logits, to a path's bound integrand (e.g. the uniform §2.3(B)).
    """
    B, L, V = reference_log_probs.shape
    n = int(num_samples)
    if tokens is None:
        tokens = torch.arange(V, device=xt.device).expand(B, L, V)
    C = tokens.shape[-1]
    x_hat = draw_reference_samples(reference_log_probs, xt, path, n, generator)  # [B, n, L]
    log_z = log_mean_exp(energy_log_ratio(energy, x_hat, xt, t), dim=-1)  # [B]
    # Substitute y at position i into every sample: [B, L, C, n, L] → one batched energy call.
    subst = x_hat[:, None, None, :, :].expand(B, L, C, n, L).clone()
    pos = torch.arange(L, device=xt.device)
    subst[:, pos, :, :, pos] = tokens.permute(1, 0, 2).unsqueeze(-1).expand(L, B, C, n)
    f = energy_log_ratio(energy, subst.reshape(B, L * C * n, L), xt, t).reshape(B, L, C, n)
    ref = reference_log_probs.gather(-1, tokens)
    out = ref.to(f.dtype) + log_mean_exp(f, dim=-1) - log_z[:, None, None]
    free = path.loss_mask(xt).unsqueeze(-1)
    carried = torch.where(tokens == xt.unsqueeze(-1), 0.0, -torch.inf).to(out.dtype)
    return torch.where(free, out, carried)
