"""The "positions" offer (`ModelKind.offers`): a model that declares it gives, for `model(x_t, t, at=M)`, the logits at
the positions M alone, bit for bit its full logits there; `denoise(..., at=M)` takes them from any other model's full
logits."""

from __future__ import annotations

import pytest
import torch

from tcsm.models import build_denoiser
from tcsm.models.blocks import build_block_denoiser
from tcsm.models.kinds import denoise, kind_of

V, L, B = 7, 8, 3


def _models():
    torch.manual_seed(0)
    yield build_denoiser("tiny", vocab_size=V, num_states=V + 1, max_len=L, time_conditioning=True)
    yield build_denoiser("tiny", vocab_size=V, num_states=V + 1, max_len=L, step_head_layers=1)
    yield build_block_denoiser("tiny", 4, vocab_size=V, num_states=V + 1, max_len=L)
    yield build_block_denoiser("tiny", 4, vocab_size=V, num_states=V + 1, max_len=L, step_head_layers=1)


def _randomise(model):
    with torch.no_grad():  # the zero-initialised head would make every logit 0 and the check vacuous
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("model", list(_models()), ids=lambda m: type(m).__name__)
def test_a_model_that_offers_positions_gives_its_full_logits_there(model):
    model = _randomise(model)
    assert "positions" in kind_of(model).offers
    g = torch.Generator().manual_seed(1)
    xt = torch.randint(0, V + 1, (B, L), generator=g)
    x1 = torch.randint(0, V, (B, L), generator=g)
    t = torch.rand(B, generator=g)
    at = torch.rand(B, L, generator=g) < 0.4
    at[0] = False  # a row with no position: it contributes nothing
    with torch.no_grad():
        full = denoise(model, xt, t, x1)
        some = denoise(model, xt, t, x1, at=at)
    assert full.shape == (B, L, V) and some.shape == (int(at.sum()), V)
    assert full.abs().max() > 0.1
    # the bits of the full call's (a row-stable projection): a sampler's draws do not change with the offer
    assert torch.equal(some, full[at])
    one = torch.zeros_like(at)
    one[2, 3] = True  # fewer positions than BLAS's row floor: padded, the same bits
    with torch.no_grad():
        assert torch.equal(denoise(model, xt, t, x1, at=one), full[one])
    with pytest.raises(ValueError, match="boolean"):
        denoise(model, xt, t, x1, at=at.long())


def test_a_model_that_declares_nothing_is_indexed_after_its_full_call():
    seen = []

    def exact(xt, t):  # a user's denoiser: no `at` argument
        seen.append(xt.shape)
        return torch.arange(xt.numel() * V, dtype=torch.float32).view(*xt.shape, V)

    xt = torch.full((B, L), V)
    at = torch.zeros(B, L, dtype=torch.bool)
    at[1, 2] = at[2, 5] = True
    out = denoise(exact, xt, torch.zeros(B), None, at=at)
    assert seen == [(B, L)]
    torch.testing.assert_close(out, exact(xt, None)[at])
