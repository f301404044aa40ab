"""`eval_mode`: run a block with a model in eval mode (no dropout), then put it back in the mode it was in. Every
place that evaluates or samples a model that may be training (held-out metrics, on-policy samples, reward pools,
teachers) uses this one helper."""

from __future__ import annotations

import contextlib

import torch

__all__ = ["eval_mode"]


@contextlib.contextmanager
def eval_mode(model):
    """`model` in eval mode for the block (a plain callable is left alone), restored afterwards even on error."""
    was_training = isinstance(model, torch.nn.Module) and model.training
    if was_training:
        model.eval()
    try:
        yield model
    finally:
        if was_training:
            model.train()
