"""Numeric precision of a run: `train.precision` auto resolved to fp32 or bf16 for a device and model, and the
autocast context that applies it. The trainer, `tcsm eval` and the evaluators share it, so a metric is computed
in the precision the run trained in."""

from __future__ import annotations

import contextlib

import torch

__all__ = ["CPU_BF16_MIN_WIDTH", "autocast", "resolve_precision"]

#: On CPU, bf16 autocast pays off only once matmuls are wide: measured here, a 4 × 256 denoiser trains 1.5× faster
#: in bf16 while a 2 × 64 one runs 1.5× slower (the casts cost more than the matmuls save).
CPU_BF16_MIN_WIDTH = 256


def resolve_precision(precision: str, device: torch.device, model: torch.nn.Module | None = None) -> str:
    """auto → bf16 on GPUs that support it, and on CPU for models whose widest linear layer has at least
    CPU_BF16_MIN_WIDTH inputs; fp32 otherwise (fp16 is never chosen: it is very slow on CPU)."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    if device.type == "cpu" and model is not None:
        widths = [m.in_features for m in model.modules() if isinstance(m, torch.nn.Linear)]
        return "bf16" if widths and max(widths) >= CPU_BF16_MIN_WIDTH else "fp32"
    return "fp32"


def autocast(device: torch.device, precision: str):
    """bf16 autocast for precision "bf16", a no-op for "fp32"."""
    if precision == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()
