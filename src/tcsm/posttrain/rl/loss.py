"""The GRPO surrogate on sequence log-likelihood estimates: PPO's clipped ratio and a k3 KL to the reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["GRPOTerms", "grpo_loss", "k3_kl"]


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimate of KL(π_θ ‖ π_ref) per rollout x ~ π_θ (Schulman's estimator, as GRPO):
    exp(ℓ_ref − ℓ_θ) − (ℓ_ref − ℓ_θ) − 1 ≥ 0, unbiased when ℓ are the exact log-likelihoods."""
    d = ref_logp - logp
    return torch.expm1(d) - d


@dataclass
class GRPOTerms:
    loss: Tensor  # scalar, minimised
    kl: Tensor  # mean k3 estimate
    clip_fraction: Tensor  # share of rollouts whose clipped term is the one taken (its gradient is zero)
    ratio: Tensor  # mean importance ratio π_θ / π_old


def grpo_loss(logp: Tensor, old_logp: Tensor, advantages: Tensor, *, clip_eps: float, ref_logp: Tensor | None = None,
              kl_coef: float = 0.0, num_tokens: Tensor | None = None) -> GRPOTerms:  # fmt: skip
    """−mean_j[min(ρ_j A_j, clip(ρ_j, 1 − ε, 1 + ε) A_j)] + β_KL · mean_j k3_j over rollouts j, with
    ρ_j = exp(ℓ_θ,j − ℓ_old,j) (GRPO, PPO's clipped objective). `num_tokens` [B]: divide each log-ratio and each
    log-difference to the reference by the rollout's completion length (ESPO's per-token normalisation, which
    keeps ρ near 1 for long completions); None: sequence-level ratios. On-policy (ℓ_old = ℓ_θ, no clipping active)
    the gradient is −mean_j A_j ∇ℓ_θ,j (÷ length when normalised): REINFORCE with the group baseline.
    """
    n = torch.ones_like(logp) if num_tokens is None else num_tokens.to(logp.dtype).clamp_min(1)
    ratio = torch.exp((logp - old_logp.detach()) / n)
    a = advantages.detach().to(logp.dtype)
    unclipped = ratio * a
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * a
    surrogate = torch.minimum(unclipped, clipped)
    loss = -surrogate.mean()
    kl = torch.zeros((), device=logp.device)
    if ref_logp is not None:
        kl_j = k3_kl(logp / n, ref_logp.detach().to(logp.dtype) / n)
        kl = kl_j.mean()
        if kl_coef:
            loss = loss + float(kl_coef) * kl
    taken_clip = (clipped < unclipped).float().mean()
    return GRPOTerms(loss, kl.detach(), taken_clip.detach(), ratio.detach().mean())
