"""Time sampling for training losses and likelihood estimates (MATH.md §2.4, §3.4)."""

from __future__ import annotations

import torch
from torch import Tensor

#: the smallest t a bound is evaluated at: t > 0, where the weights w(t) are finite (float32's smallest normal)
T_MIN = torch.finfo(torch.float32).tiny


def sample_times(
    batch_size: int,
    *,
    antithetic: bool = True,
    generator: torch.Generator | None = None,
    device=None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """t ~ U(0, 1) per sequence; antithetic (MDLM `_sample_t`): t_b = (u + b / B) mod 1 with one shared u,
    so that the batch covers [0, 1) evenly while each t_b is still marginally uniform."""
    if antithetic:
        u = torch.rand((), generator=generator, device=device, dtype=torch.float64)
        t = (u + torch.arange(batch_size, device=device, dtype=torch.float64) / batch_size) % 1.0
    else:
        t = torch.rand(batch_size, generator=generator, device=device, dtype=torch.float64)
    return _below_one(t, dtype)


def _below_one(t: Tensor, dtype: torch.dtype) -> Tensor:
    """Cast to `dtype` keeping t < 1: values within half an ulp of 1 would round to t = 1 exactly, where κ_t is
    the floored 1/tiny (~1e38 in float32) and a single such draw would swamp a κ-weighted loss."""
    # The largest float below 1 of a binary format is 1 − eps/2, exactly; a Python scalar, so that no tensor is
    # copied to the device (a blocking copy would stall an accelerator on every step).
    return t.to(dtype).clamp_max(1.0 - torch.finfo(dtype).eps / 2)


def stratified_times(
    num: int, batch_size: int, *, generator: torch.Generator | None = None, device=None, dtype=torch.float32
) -> Tensor:
    """[num, B] times: stratum k holds t = (k + u_b) / num with u_b ~ U(0, 1) independent per sequence, so
    each column is a stratified sample of U(0, 1) and every t is marginally uniform (unbiased estimates)."""
    u = torch.rand(num, batch_size, generator=generator, device=device, dtype=torch.float64)
    k = torch.arange(num, device=device, dtype=torch.float64).unsqueeze(1)
    return _below_one((k + u) / num, dtype)
