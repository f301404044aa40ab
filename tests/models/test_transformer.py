"""Shape, conditioning, attention-direction and accounting checks for tcsm.models."""

import math

import pytest
import torch

from tcsm.models import (
    PRESETS,
    DenoiserConfig,
    MultiHeadAttention,
    RotaryEmbedding,
    TransformerBlock,
    build_denoiser,
    count_parameters,
    flops_per_token,
    init_weights,
)

V = 7


def _model(time_conditioning=True, randomize_head=True, seed=0, **kw):
    torch.manual_seed(seed)
    model = build_denoiser("tiny", vocab_size=V, num_states=V + 1, time_conditioning=time_conditioning, **kw)
    if randomize_head:
        # The zero-initialised head and adaLN gates make every output constant; perturb them so that
        # dependence tests can see information flow.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "head" in name or "adaLN" in name:
                    p.normal_(0, 0.2)
    return model.eval()


def _tokens(b=3, length=10, seed=1, high=V + 1):
    return torch.randint(0, high, (b, length), generator=torch.Generator().manual_seed(seed))


def test_shapes_and_dtype():
    model = _model()
    xt, t = _tokens(), torch.rand(3)
    out = model(xt, t)
    assert out.shape == (3, 10, V) and out.dtype == torch.float32
    assert torch.isfinite(out).all()
    out.sum().backward()  # gradients flow end to end


def test_zero_init_gives_uniform_logits():
    model = build_denoiser("tiny", vocab_size=V, num_states=V + 1)
    logits = model(_tokens(), torch.rand(3))
    assert torch.equal(logits, torch.zeros_like(logits))
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), _tokens(high=V).reshape(-1))
    assert math.isclose(loss.item(), math.log(V), rel_tol=1e-6)


def test_time_conditioning_off_ignores_t_exactly():
    model = _model(time_conditioning=False)
    assert model.time_embed is None and model.final_adaLN is None
    assert not any("adaLN" in n or "time" in n for n, _ in model.named_parameters())
    xt = _tokens()
    a = model(xt, torch.zeros(3))
    b = model(xt, torch.rand(3))
    c = model(xt, None)
    assert torch.equal(a, b) and torch.equal(a, c)


def test_time_conditioning_on_uses_t():
    model = _model()
    xt = _tokens()
    assert not torch.allclose(model(xt, torch.zeros(3)), model(xt, torch.full((3,), 0.9)))
    # a scalar t broadcasts over the batch
    assert torch.allclose(model(xt, torch.tensor(0.3)), model(xt, torch.full((3,), 0.3)))


def test_bidirectional_output_depends_on_later_tokens():
    model = _model()
    xt, t = _tokens(b=1), torch.rand(1)
    x2 = xt.clone()
    x2[0, 7] = (x2[0, 7] + 1) % (V + 1)
    diff = (model(xt, t) - model(x2, t)).abs().amax(-1)[0]
    assert (diff[:7] > 1e-6).all()  # positions before 7 see the change


def test_causal_block_does_not_look_ahead():
    torch.manual_seed(0)
    for cond_dim in (None, 8):
        block = TransformerBlock(32, 4, cond_dim=cond_dim, causal=True).eval()
        block.apply(init_weights)
        if cond_dim:
            torch.nn.init.normal_(block.adaLN[1].weight, std=0.3)
        rope = RotaryEmbedding(8, 16)(6)
        cond = torch.randn(2, cond_dim) if cond_dim else None
        x = torch.randn(2, 6, 32)
        x2 = x.clone()
        x2[:, 4] += torch.randn(2, 32)  # not a constant shift: LayerNorm would erase that
        diff = (block(x, rope, cond) - block(x2, rope, cond)).abs().amax(-1)
        assert torch.all(diff[:, :4] == 0) and torch.all(diff[:, 4:] > 0)


def test_causal_attention_with_mask_and_kv_cache_agree():
    torch.manual_seed(0)
    attn = MultiHeadAttention(32, 4).eval()
    attn.apply(init_weights)
    rot = RotaryEmbedding(8, 16)
    x = torch.randn(2, 6, 32)
    full = attn(x, rot(6), is_causal=True)
    allow_all = torch.ones(6, 6, dtype=torch.bool)
    assert torch.allclose(attn(x, rot(6), attn_mask=allow_all, is_causal=True), full, atol=1e-6)
    # queries for the last two positions against all keys (a KV cache) match the full causal pass
    tail = attn(x[:, 4:], rot(2, offset=4), is_causal=True, kv=x, rope_kv=rot(6))
    assert torch.allclose(tail, full[:, 4:], atol=1e-6)


def test_adaln_block_is_identity_at_init():
    block = TransformerBlock(16, 2, cond_dim=8)
    block.apply(init_weights)  # must not overwrite the zero-initialised modulation
    x = torch.randn(2, 5, 16)
    assert torch.equal(block(x, None, torch.randn(2, 8)), x)


def test_input_validation_errors():
    model = _model()
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, PRESETS["tiny"]["max_len"] + 1, dtype=torch.long), torch.rand(1))
    with pytest.raises(ValueError, match="num_states"):
        model(torch.full((1, 4), V + 1), torch.rand(1))
    with pytest.raises(ValueError, match="num_states"):
        model(torch.full((1, 4), -1), torch.rand(1))
    with pytest.raises(ValueError, match="t must"):
        model(_tokens(b=3), torch.rand(2))
    with pytest.raises(ValueError, match="num_states"):
        DenoiserConfig(vocab_size=5, num_states=4, max_len=8, d_model=16, n_layers=1, n_heads=2)
    with pytest.raises(ValueError, match="n_heads"):
        DenoiserConfig(vocab_size=5, num_states=6, max_len=8, d_model=30, n_layers=1, n_heads=4)
    with pytest.raises(ValueError, match="unknown model preset"):
        build_denoiser("huge", vocab_size=5, num_states=6)
    with pytest.raises(ValueError, match="missing"):
        build_denoiser("tiny")


def test_uniform_source_alphabet():
    model = build_denoiser("tiny", vocab_size=V, num_states=V)
    assert model(_tokens(high=V), torch.rand(3)).shape == (3, 10, V)
    with pytest.raises(ValueError, match="num_states"):
        model(torch.full((1, 3), V), torch.rand(1))


def test_bf16_autocast_cpu():
    model = _model()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(_tokens(), torch.rand(3))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    ref = model(_tokens(), torch.rand(3, generator=torch.Generator().manual_seed(0)))
    assert ref.shape == out.shape


def test_build_from_dict_and_config_roundtrip():
    model = build_denoiser({"preset": "tiny", "n_layers": 1}, vocab_size=V, num_states=V + 1)
    assert len(model.blocks) == 1
    again = build_denoiser(model.cfg)
    assert again.cfg == model.cfg
    with pytest.raises(ValueError, match="unknown DenoiserConfig keys"):
        build_denoiser("tiny", vocab_size=V, num_states=V + 1, widht=3)


def test_presets_sizes():
    assert {"tiny", "small", "text8"} <= set(PRESETS)
    t8 = PRESETS["text8"]
    assert (t8["n_layers"], t8["d_model"], t8["n_heads"], t8["max_len"]) == (12, 768, 12, 256)
    assert PRESETS["tiny"]["n_layers"] <= 2 and 32 <= PRESETS["tiny"]["d_model"] <= 64
    assert 4 <= PRESETS["small"]["n_layers"] <= 6 and 256 <= PRESETS["small"]["d_model"] <= 384


def test_flops_formula():
    cfg = DenoiserConfig(
        vocab_size=V, num_states=V + 1, max_len=16, d_model=32, n_layers=2, n_heads=4, time_conditioning=False
    )
    model = build_denoiser(cfg)
    # Matmul weights = all parameters minus embedding, norms and biases.
    n_matmul = sum(
        p.numel() for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith("embed")
    )
    assert flops_per_token(cfg, 16) == 6 * n_matmul + 12 * 2 * 32 * 16
    # Grows linearly in the sequence length through the attention term only.
    assert flops_per_token(cfg, 32) - flops_per_token(cfg, 16) == 12 * 2 * 32 * 16
    assert count_parameters(model) > n_matmul


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("mask", ["none", "bool", "float", "causal", "causal+bool"])
def test_math_attention_kernel_equals_sdpa(dtype, mask):
    """The explicit softmax(QKᵀ/√d)V kernel and PyTorch's SDPA are the same function (masks and causality too)."""
    from tcsm.models.layers import MultiHeadAttention

    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 32, generator=g, dtype=dtype)
    a = MultiHeadAttention(32, 4, kernel="sdpa").to(dtype)
    b = MultiHeadAttention(32, 4, kernel="math").to(dtype)
    b.load_state_dict(a.state_dict())
    attn_mask = None
    if "bool" in mask:
        attn_mask = torch.rand(7, 7, generator=g) < 0.7
        attn_mask |= torch.eye(7, dtype=torch.bool)  # no fully masked row
    elif mask == "float":
        attn_mask = torch.randn(7, 7, generator=g, dtype=dtype)
    causal = "causal" in mask
    ya, yb = a(x, attn_mask=attn_mask, is_causal=causal), b(x, attn_mask=attn_mask, is_causal=causal)
    torch.testing.assert_close(ya, yb, rtol=1e-5, atol=1e-6)
    ga = torch.autograd.grad(ya.square().sum(), a.qkv.weight)[0]
    gb = torch.autograd.grad(yb.square().sum(), b.qkv.weight)[0]
    torch.testing.assert_close(ga, gb, rtol=1e-4, atol=1e-6)


def test_attention_kernel_choice_and_bf16_denoiser_matches_fp32():
    """auto picks the explicit kernel for CPU bf16 (measured faster) and SDPA elsewhere; a bf16-autocast denoiser
    stays within bf16 rounding of its fp32 output."""
    from tcsm.models.layers import attention_kernel

    assert attention_kernel("cpu", torch.bfloat16) == "math"
    assert attention_kernel("cpu", torch.float32) == "sdpa" and attention_kernel("cuda", torch.bfloat16) == "sdpa"
    model = build_denoiser("tiny", vocab_size=11, num_states=12)
    for p in model.parameters():  # leave the zero-initialised gates: give every weight a real value
        torch.nn.init.normal_(p, std=0.05, generator=torch.Generator().manual_seed(p.numel()))
    xt = torch.randint(0, 12, (4, 16), generator=torch.Generator().manual_seed(1))
    t = torch.rand(4, generator=torch.Generator().manual_seed(2))
    ref = model(xt, t)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(xt, t)
    assert low.dtype == torch.float32
    assert (low - ref).abs().max() < 0.05 * ref.abs().max()
    with pytest.raises(ValueError, match="attention"):
        build_denoiser("tiny", vocab_size=11, num_states=12, attention="flash")
