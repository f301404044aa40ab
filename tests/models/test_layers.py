"""`tcsm.models.layers.row_stable`: a sequence's outputs do not depend on how many sequences share the call.

BLAS multiplies matrices of 1-3 rows with other kernels (another summation order) than larger ones, so without the
row floor a per-sequence conditioning vector differs in the last bits between batch 1 and batch 16 (the causal LM's
decode runs its linears per sequence instead). fp32 on the CPU, bit for bit: the denoiser's forward, a block model's cached denoise and the
causal LM's static-cache decode, row 0 alone against row 0 of 16."""

from __future__ import annotations

import pytest
import torch

from tcsm.models.blocks import build_block_denoiser
from tcsm.models.layers import ROW_FLOOR, batch_invariance, batch_invariant, row_stable
from tcsm.models.lm_families import build_lm
from tcsm.models.transformer import build_denoiser

pytestmark = pytest.mark.usefixtures("one_thread")

V, L, B = 7, 16, 16


def _randomised(model):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model.eval()


def test_row_stable_pads_few_rows_and_returns_theirs():
    lin = torch.nn.Linear(64, 48)
    c = torch.randn(16, 64)
    full = row_stable(lin, c)
    for n in range(1, ROW_FLOOR + 2):
        assert torch.equal(row_stable(lin, c[:n]), full[:n])
    assert torch.equal(row_stable(lin, c[:2].reshape(1, 2, 64)), full[:2].reshape(1, 2, 48))


@torch.no_grad()
def test_the_denoiser_gives_a_row_the_same_bits_at_batch_1_and_16():
    model = _randomised(build_denoiser("tiny", vocab_size=V, num_states=V + 1, max_len=L))
    x, t = torch.randint(0, V + 1, (B, L)), torch.rand(B)
    full = model(x, t)
    for n in (1, 2, 3):
        assert torch.equal(model(x[:n], t[:n]), full[:n])


@torch.no_grad()
def test_a_block_models_cached_denoise_gives_a_row_the_same_bits_at_batch_1_and_16():
    model = _randomised(build_block_denoiser("tiny", 4, vocab_size=V, num_states=V + 1, max_len=L))
    clean, xt, t = torch.randint(0, V, (B, 8)), torch.randint(0, V + 1, (B, 4)), torch.rand(B)
    outs = []
    for n in (B, 1):
        cache = model.new_cache(n, fixed_shape=True)
        model.extend_cache(cache, clean[:n])
        outs.append(model.denoise(xt[:n], t[:n], cache))
    assert torch.equal(outs[1], outs[0][:1])


@torch.no_grad()
@pytest.mark.parametrize("preset", ["tiny", "small"])
def test_the_ar_decode_gives_a_row_the_same_bits_at_batch_1_and_16(preset):
    model = _randomised(build_lm("causal", preset, vocab_size=V, max_len=L))
    ids = torch.randint(0, V, (B, 6))
    full = None
    for n in (B, 1, 2, 3):
        cache = model.new_cache(n)
        prefill = model.decode(ids[:n, :5], cache)
        out = (prefill, model.decode(ids[:n, 5:], cache))
        if full is None:
            full = out
        assert all(torch.equal(o, f[:n]) for o, f in zip(out, full))


@torch.no_grad()
def test_outside_batch_invariance_the_ar_decode_runs_one_product_over_all_rows(monkeypatch):
    model = _randomised(build_lm("causal", "tiny", vocab_size=V, max_len=L))
    ids = torch.randint(0, V, (B, 6))
    batched = []
    monkeypatch.setattr(torch, "baddbmm", lambda *a, **k: batched.append(1) or torch.Tensor.baddbmm(*a, **k))

    def decode():
        cache = model.new_cache(B)
        return model.decode(ids[:, :5], cache), model.decode(ids[:, 5:], cache)

    invariant = decode()
    assert batched and batch_invariant()
    batched.clear()
    with batch_invariance(False):
        assert not batch_invariant()
        whole = decode()
    assert not batched and batch_invariant()
    for a, b in zip(invariant, whole):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    c = torch.randn(2, 8)
    with batch_invariance(False):  # and the conditioning linears take their rows unpadded
        assert row_stable(lambda r: torch.full((r.shape[0], 1), float(r.shape[0])), c).flatten().tolist() == [2.0, 2.0]
