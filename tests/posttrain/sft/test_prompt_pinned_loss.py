"""SFT's loss on prompt-pinned batches (`Batch.cond_mask`): the model's output at prompt positions never enters it."""

from __future__ import annotations

import torch

from tcsm.core.batch import Batch
from tcsm.objectives import Objective
from tcsm.paths import make_path


def test_loss_ignores_the_prompt_positions_exactly():
    """The objective's value does not move when the model's logits at prompt positions are replaced by noise."""
    path = make_path("masked", 5, "linear")
    g = torch.Generator().manual_seed(0)
    x1 = torch.randint(0, 5, (4, 10), generator=g)
    cond = torch.zeros(4, 10, dtype=torch.bool)
    cond[:, :4] = True
    w = torch.randn(6, 5, generator=g)

    def model(xt, t, noisy_prompt=False):
        out = w[xt] * (1 + t[:, None, None])
        return torch.where(cond[..., None], torch.randn(out.shape) * 100, out) if noisy_prompt else out

    obj = Objective(path, None, loss="distrib", weighting="kappa")
    a, _ = obj(model, Batch(x1, cond_mask=cond), torch.Generator().manual_seed(1))
    b, _ = obj(lambda xt, t: model(xt, t, True), Batch(x1, cond_mask=cond), torch.Generator().manual_seed(1))
    assert torch.equal(a, b)
