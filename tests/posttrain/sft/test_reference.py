"""The reference block-diffusion SFT recipe (`tcsm.posttrain.sft.reference`) on a tiny random DiffusionGemma from
transformers' own classes: its loss equals the recipe written out by hand with the model's own per-canvas calls
and its own encoder, with self-conditioning off, on and mixed; an optimizer step leaves the routers as they were
when they are frozen; settings the model does not offer are refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "DiffusionGemmaForBlockDiffusion"):
    pytest.skip("this transformers has no DiffusionGemma", allow_module_level=True)

from diffusion_gemma_helpers import tiny_hf

from tcsm.core.batch import Batch
from tcsm.models.diffusion_gemma import DiffusionGemmaDenoiser
from tcsm.posttrain.sft.reference import ReferenceBlockSFT

pytestmark = pytest.mark.usefixtures("one_thread")

V, K, B, L, P = 16, 2, 3, 8, 3  # vocabulary, canvas, batch, length, prompt (it ends inside the second canvas)


def _batch():
    x1 = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(5))
    cond = torch.zeros(B, L, dtype=torch.bool)
    cond[:, :P] = True
    return Batch(x1=x1, cond_mask=cond)


def _by_hand(hf, batch, seed, eps, lam, p):
    """The recipe with the model's own calls: canvas b as hf(input_ids=x_1^{<b}, decoder_input_ids=x_t^b)."""
    g = torch.Generator().manual_seed(seed)
    x1, sup = batch.x1, ~batch.cond_mask
    c = (eps + (1 - eps) * torch.rand(B, L // K, generator=g)).repeat_interleave(K, 1)
    coins, noise = torch.rand(B, L, generator=g), torch.randint(0, V, (B, L), generator=g)
    xt = torch.where((coins < c) & sup, noise, x1)
    on = torch.rand(B, generator=g) < p if p > 0 else torch.zeros(B, dtype=torch.bool)
    ce, n = 0.0, 0
    for b in range(1, L // K):  # canvas 0 is all prompt here: never scored
        s = slice(b * K, (b + 1) * K)
        sc = {}
        if on.any():
            first = hf(input_ids=x1[:, : b * K], decoder_input_ids=xt[:, s]).logits
            sc = {"self_conditioning_logits": first, "self_conditioning_mask": on}
        logits = hf(input_ids=x1[:, : b * K], decoder_input_ids=xt[:, s], **sc).logits
        m = sup[:, s]
        ce = ce + F.cross_entropy(logits[m], x1[:, s][m], reduction="sum")
        n += int(m.sum())
    hidden = hf.model.encoder(input_ids=x1).last_hidden_state
    cap = hf.config.get_text_config().final_logit_softcapping
    enc = torch.tanh(hf.lm_head(hidden) / cap) * cap
    nxt = sup[:, 1:]
    ar = F.cross_entropy(enc[:, :-1][nxt], x1[:, 1:][nxt])
    return ce / n + lam * ar


@pytest.mark.parametrize("p", [0.0, 1.0, 0.5])
def test_the_loss_is_the_recipe_written_out_by_hand(p):
    hf = tiny_hf(V=V, k=K)
    model = DiffusionGemmaDenoiser(hf)
    batch = _batch()
    loss_fn = ReferenceBlockSFT(V, K, eps=0.05, ar_weight=0.3, self_cond_prob=p)
    with torch.no_grad():
        loss, metrics = loss_fn(model, batch, torch.Generator().manual_seed(11))
        want = _by_hand(hf, batch, 11, 0.05, 0.3, p)
    torch.testing.assert_close(loss, want, atol=1e-5, rtol=1e-5)
    assert set(metrics) == {"ce", "ar", "corrupt"}
    if p == 0.5:  # the seed mixes: some sequences self-conditioned, some not
        on = torch.rand(B, generator=_after_corruption(11)) < 0.5
        assert 0 < int(on.sum()) < B


def _after_corruption(seed):
    g = torch.Generator().manual_seed(seed)
    torch.rand(B, L // K, generator=g), torch.rand(B, L, generator=g), torch.randint(0, V, (B, L), generator=g)
    return g


def test_self_conditioning_changes_the_loss_and_off_skips_the_first_pass():
    model = DiffusionGemmaDenoiser(tiny_hf(V=V, k=K))
    calls = []
    model.hf.model.decoder.register_forward_hook(lambda *a: calls.append(1))  # decoder passes
    with torch.no_grad():
        off, _ = ReferenceBlockSFT(V, K, self_cond_prob=0.0)(model, _batch(), torch.Generator().manual_seed(3))
        assert len(calls) == 1
        on, _ = ReferenceBlockSFT(V, K, self_cond_prob=1.0)(model, _batch(), torch.Generator().manual_seed(3))
        assert len(calls) == 3  # on: the decoder twice, on one encoder cache
    assert abs(float(on - off)) > 1e-4


def test_a_step_leaves_frozen_routers_and_trains_the_rest():
    from tcsm.builders.registry import BuildContext
    from tcsm.recipes.sft.builder import _reference

    model = DiffusionGemmaDenoiser(tiny_hf(V=V, k=K))
    routers = model.router_parameters()
    assert routers and all(p.requires_grad for p in routers)
    ctx = BuildContext(config=None, device="cpu", model=model)
    ctx.path = type("P", (), {"num_states": V, "vocab_size": V, "block_length": K})()
    loss_fn = _reference({"eps": 1e-3, "ar_weight": 1.0, "self_cond_prob": 0.5, "freeze_router": True}, ctx)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    loss, _ = loss_fn(model, _batch(), torch.Generator().manual_seed(0))
    loss.backward()
    opt.step()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    router_names = {n for n, p in model.named_parameters() if any(p is r for r in routers)}
    assert router_names and not moved & router_names
    assert any(".experts." in n for n in moved) and any("embed_tokens" in n for n in moved)


def test_what_the_model_does_not_offer_is_refused():
    class Plain(torch.nn.Module):
        from tcsm.models.kinds import BLOCK_DENOISER as model_kind

    with pytest.raises(ValueError, match="set ar_weight=0"):
        ReferenceBlockSFT(V, K, ar_weight=1.0, self_cond_prob=0.0).check(Plain())
    with pytest.raises(ValueError, match="set self_cond_prob=0"):
        ReferenceBlockSFT(V, K, ar_weight=0.0, self_cond_prob=0.5).check(Plain())
    with pytest.raises(ValueError, match="eps must be in"):
        ReferenceBlockSFT(V, K, eps=1.0)
