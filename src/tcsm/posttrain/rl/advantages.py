"""Group-relative advantages (GRPO): each prompt's G rollouts are compared with each other, not with a critic."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["group_advantages"]


def group_advantages(rewards: Tensor, scale: bool = True) -> Tensor:
    """A_{g,j} = (R_{g,j} − mean_j R_g) / std_j R_g for rewards [N, G] (N prompts, G rollouts each).

    `std` is the unbiased sample standard deviation (GRPO's); a group whose rewards are all equal carries no
    signal and gets A = 0 exactly (not 0/0). `scale=False` keeps only the centring (Dr. GRPO). Needs G >= 2. Integer or
    boolean rewards give float32 advantages.
    """
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"group advantages need rewards [N prompts, G >= 2 rollouts], got shape {tuple(rewards.shape)}")
    out_dtype = rewards.dtype if rewards.dtype.is_floating_point else torch.float32  # integer rewards: float A
    r = rewards.double()
    centred = r - r.mean(1, keepdim=True)
    if not scale:
        return centred.to(out_dtype)
    std = r.std(1, keepdim=True)
    flat = std == 0
    return torch.where(flat, torch.zeros_like(centred), centred / torch.where(flat, torch.ones_like(std), std)).to(
        out_dtype
    )
