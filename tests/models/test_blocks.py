"""The block diffusion denoiser: the exact KV cache against the one-pass forward, the dependency structure of the
one-pass mask, k = L as the full-sequence denoiser, k = 1, the FlexAttention one pass against the explicit mask,
the FLOP count, errors, and the builder's choice of model."""

import pytest
import torch

from tcsm.models import Denoiser, DenoiserConfig, flops_per_token
from tcsm.models.blocks import (
    BlockDenoiser,
    BlockDenoiserConfig,
    block_attention_mask,
    block_flops_per_sequence,
    block_mask_mod,
    build_block_denoiser,
)
from tcsm.models.kinds import kind_of

V = 7


def _model(k, time_conditioning=True, L=16, seed=0, attention="auto"):
    torch.manual_seed(seed)
    cfg = BlockDenoiserConfig(vocab_size=V, num_states=V + 1, max_len=L, d_model=32, n_layers=2, n_heads=4,
                              cond_dim=16, time_conditioning=time_conditioning, block_length=k,
                              attention=attention)  # fmt: skip
    model = BlockDenoiser(cfg)
    with torch.no_grad():  # the zero-initialised head and gates hide every dependence: randomise them
        for name, p in model.named_parameters():
            if "head" in name or "adaLN" in name:
                p.normal_(0, 0.2)
    return model.eval()


def _batch(B=3, L=16, k=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randint(0, V, (B, L), generator=g)
    xt = torch.where(torch.rand(B, L, generator=g) < 0.5, V, x1)
    tb = torch.rand(B, L // k, generator=g)
    return xt, x1, tb


@pytest.mark.parametrize("tc", [True, False])
@pytest.mark.parametrize("k, L", [(4, 16), (1, 6), (16, 16)])
def test_cache_equals_one_pass(tc, k, L):
    """new_cache / extend_cache / denoise block by block give the one-pass logits of every block (fp32, ≤ 1e-5)."""
    B = 3
    model = _model(k, tc, L=L)
    xt, x1, tb = _batch(B, L, k)
    with torch.no_grad():
        ref = model(xt, tb.repeat_interleave(k, 1), x1=x1)
        cache = model.new_cache(B)
        for b in range(L // k):
            lo = b * k
            assert cache.length == lo
            out = model.denoise(xt[:, lo : lo + k], tb[:, b], cache)
            assert cache.length == lo  # denoise leaves the cache as it was
            torch.testing.assert_close(out, ref[:, lo : lo + k], atol=1e-5, rtol=0)
            again = model.denoise(xt[:, lo : lo + k], tb[:, b], cache)  # free slots overwritten, not appended
            torch.testing.assert_close(again, out, atol=1e-6, rtol=0)
            model.extend_cache(cache, x1[:, lo : lo + k])


def test_cache_prefill_of_many_blocks_and_a_partial_block():
    """A prompt of several blocks in one extend_cache call (block-causal among themselves) equals block-by-block
    extension; the last block may be denoised partially (its first n ≤ k positions)."""
    B, L, k = 2, 16, 4
    model = _model(k)
    xt, x1, tb = _batch(B, L, k)
    with torch.no_grad():
        ref = model(xt, tb.repeat_interleave(k, 1), x1=x1)
        cache = model.new_cache(B)
        model.extend_cache(cache, x1[:, :12])
        assert cache.length == 12
        torch.testing.assert_close(model.denoise(xt[:, 12:], tb[:, 3], cache), ref[:, 12:], atol=1e-5, rtol=0)
        # positions 12..13 only: the one pass over the shorter sequence ending inside the block is not defined,
        # but the partial block attends to the cache and itself, like the one pass over a model of L = 14
        part = model.denoise(xt[:, 12:14], tb[:, 3], cache)
        assert part.shape == (B, 2, V)
        model.extend_cache(cache, x1[:, 12:14])  # the tail of the last block
        with pytest.raises(ValueError, match="inside a block"):
            model.denoise(xt[:, 14:], tb[:, 3], cache)


def test_cache_grows_and_stays_exact():
    """The cache's buffers grow as blocks arrive (64 → 128 → 160 positions here) and keep what they held."""
    B, L, k = 2, 160, 40
    model = _model(k, L=L)
    xt, x1, tb = _batch(B, L, k)
    with torch.no_grad():
        ref = model(xt, tb.repeat_interleave(k, 1), x1=x1)
        cache = model.new_cache(B)
        sizes = []
        for b in range(L // k):
            lo = b * k
            torch.testing.assert_close(model.denoise(xt[:, lo : lo + k], tb[:, b], cache), ref[:, lo : lo + k],
                                       atol=1e-5, rtol=0)  # fmt: skip
            model.extend_cache(cache, x1[:, lo : lo + k])
            sizes.append(cache.keys[0].shape[2])
    assert sizes == [64, 128, 128, 160]


@pytest.mark.parametrize("n", [8, 12])
def test_a_prefill_of_two_or_more_blocks_is_block_causal(n):
    """Prefills of exactly two and of three blocks (k = 4) need the block-causal mask among their own tokens: the next
    block's logits are the one pass's."""
    B, L, k = 2, 16, 4
    model = _model(k)
    xt, x1, tb = _batch(B, L, k)
    with torch.no_grad():
        ref = model(xt, tb.repeat_interleave(k, 1), x1=x1)
        cache = model.new_cache(B)
        model.extend_cache(cache, x1[:, :n])
        torch.testing.assert_close(model.denoise(xt[:, n : n + k], tb[:, n // k], cache), ref[:, n : n + k],
                                   atol=1e-5, rtol=0)  # fmt: skip


def test_a_long_prompt_prefilled_in_one_call_equals_the_one_pass():
    """One extend_cache of 100 positions (more than the buffer's first 64, at max_len 256) sizes the buffer for all
    of them at once and gives the one-pass logits of the blocks after it."""
    B, L, k = 2, 256, 4
    model = _model(k, L=L)
    xt, x1, tb = _batch(B, L, k)
    with torch.no_grad():
        ref = model(xt, tb.repeat_interleave(k, 1), x1=x1)
        cache = model.new_cache(B)
        model.extend_cache(cache, x1[:, :100])
        assert cache.length == 100 and cache.keys[0].shape[2] >= 100
        for lo in (100, 104):
            b = lo // k
            torch.testing.assert_close(model.denoise(xt[:, lo : lo + k], tb[:, b], cache), ref[:, lo : lo + k],
                                       atol=1e-5, rtol=0)  # fmt: skip
            model.extend_cache(cache, x1[:, lo : lo + k])


def test_dependency_structure():
    """Block b's logits read x_t^b, t_b and x_1^{<b} only: perturbing x_t outside b, t of other blocks or x_1 at
    blocks ≥ b leaves them unchanged; perturbing x_1 at a block < b changes them."""
    B, L, k, b = 2, 12, 4, 1
    model = _model(k, L=L)
    xt, x1, tb = _batch(B, L, k)
    t = tb.repeat_interleave(k, 1)
    inside = slice(b * k, (b + 1) * k)
    with torch.no_grad():
        ref = model(xt, t, x1=x1)[:, inside]
        for pos in range(L):
            if pos // k != b:
                xt2 = xt.clone()
                xt2[:, pos] = (xt2[:, pos] + 1) % (V + 1)
                t2 = t.clone()
                other = slice(pos // k * k, pos // k * k + k)
                t2[:, other] = 0.5 * t2[:, other] + 0.25
                torch.testing.assert_close(model(xt2, t2, x1=x1)[:, inside], ref, atol=1e-6, rtol=0)
            x12 = x1.clone()
            x12[:, pos] = (x12[:, pos] + 1) % V
            out = model(xt, t, x1=x12)[:, inside]
            if pos // k >= b:
                torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
            else:
                assert (out - ref).abs().max() > 1e-4
        xt2 = xt.clone()
        xt2[:, b * k] = (xt2[:, b * k] + 1) % (V + 1)
        assert (model(xt2, t, x1=x1)[:, inside] - ref).abs().max() > 1e-4


def test_mask_by_enumeration():
    """The one-pass mask, position by position against its definition (MATH.md §9)."""
    L, k = 6, 2
    mask = block_attention_mask(L, k)
    for q in range(2 * L):
        for j in range(2 * L):
            bq, bj = (q % L) // k, (j % L) // k
            if q < L:
                want = (j < L and bq == bj) or (j >= L and bj < bq)
            else:
                want = j >= L and bj <= bq
            assert bool(mask[q, j]) == want


@pytest.mark.parametrize("tc", [True, False])
def test_one_block_is_the_full_sequence_denoiser(tc):
    """k = L: the one block sees only its noisy self, so the model is the `Denoiser` with the same weights on x_t
    (x_1 ignored); and a full-sequence checkpoint's weights load into a block model by name."""
    L = 16
    model = _model(L, tc)
    full = Denoiser(DenoiserConfig(**{k: v for k, v in model.cfg.to_dict().items() if k != "block_length"}))
    full.load_state_dict(model.state_dict())
    full.eval()
    xt, x1, tb = _batch(3, L, L)
    with torch.no_grad():
        want = full(xt, tb[:, 0])
        torch.testing.assert_close(model(xt, tb[:, 0], x1=x1), want, atol=1e-5, rtol=0)
        torch.testing.assert_close(model(xt, tb[:, 0], x1=torch.zeros_like(x1)), want, atol=1e-5, rtol=0)


def test_one_position_blocks_are_autoregressive():
    """k = 1: position i reads x_t^i and x_1^{<i}; with x_t all masks the logits are an AR model's."""
    B, L = 2, 8
    model = _model(1, L=L)
    x1 = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(3))
    xt = torch.full_like(x1, V)
    t = torch.full((B,), 0.3)
    with torch.no_grad():
        ref = model(xt, t, x1=x1)
        for i in range(L):
            x12 = x1.clone()
            x12[:, i:] = (x12[:, i:] + 1) % V  # the future (and the present) of position i
            torch.testing.assert_close(model(xt, t, x1=x12)[:, i], ref[:, i], atol=1e-6, rtol=0)


def test_per_sequence_and_per_position_times_agree():
    B, L, k = 2, 8, 4
    model = _model(k, L=L)
    xt, x1, _ = _batch(B, L, k)
    t = torch.tensor([0.2, 0.7])
    with torch.no_grad():
        a = model(xt, t, x1=x1)
        torch.testing.assert_close(model(xt, t[:, None].expand(B, L), x1=x1), a, atol=0, rtol=0)
        assert (model(xt, t.flip(0), x1=x1) - a).abs().max() > 1e-4  # t is read
        uneven = t[:, None].expand(B, L).clone()
        uneven[:, 1] = 0.5
        with pytest.raises(ValueError, match="constant inside each block"):
            model(xt, uneven, x1=x1)


def test_gradients_flow_through_both_halves_and_denoise():
    B, L, k = 2, 8, 4
    model = _model(k, L=L).train()
    xt, x1, tb = _batch(B, L, k)
    model(xt, tb.repeat_interleave(k, 1), x1=x1).logsumexp(-1).sum().backward()
    assert model.embed.weight.grad.abs().sum() > 0
    model.zero_grad()
    cache = model.new_cache(B)
    model.extend_cache(cache, x1[:, :k])
    model.denoise(xt[:, k:], tb[:, 1], cache).logsumexp(-1).sum().backward()
    assert model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0


def test_errors():
    model = _model(4)
    xt, x1, tb = _batch(2, 16, 4)
    t = tb.repeat_interleave(4, 1)
    with pytest.raises(ValueError, match="needs the clean sequence"):
        model(xt, t)
    with pytest.raises(ValueError, match="not a multiple of the model's block_length=4"):
        model(xt[:, :10], t[:, :10], x1=x1[:, :10])
    long = torch.zeros(2, 20, dtype=torch.long)
    with pytest.raises(ValueError, match="exceeds the model's max_len=16"):
        model(long, torch.ones(2), x1=long)
    with pytest.raises(ValueError, match="x1 token ids"):
        model(xt, t, x1=torch.full_like(x1, V))  # the mask id is not a clean token
    with pytest.raises(ValueError, match="shape"):
        model(xt, t[:, :4], x1=x1)
    with pytest.raises(ValueError, match="time-conditioned"):
        model(xt, None, x1=x1)
    cache = model.new_cache(2)
    with pytest.raises(ValueError, match="holds 2 rows"):
        model.denoise(xt[:1, :4], tb[:1, 0], cache)
    with pytest.raises(ValueError, match="one block of at most 4"):
        model.denoise(xt[:, :8], tb[:, 0], cache)
    model.extend_cache(cache, x1)
    with pytest.raises(ValueError, match="exceed the model's max_len"):
        model.denoise(xt[:, :4], tb[:, 0], cache)
    with pytest.raises(ValueError, match="block_length must be an integer"):
        build_block_denoiser("tiny", 0, vocab_size=V, num_states=V + 1)


def test_declared_kind_and_builder():
    model = build_block_denoiser("tiny", 4, vocab_size=V, num_states=V + 1)
    kind = kind_of(model)
    assert kind.blocks and kind.is_denoiser and kind.sampler == "blocks" and model.block_length == 4
    from types import SimpleNamespace

    from tcsm.builders.models import build_denoiser_model
    from tcsm.paths import make_path

    for k, cls in ((4, BlockDenoiser), (None, Denoiser)):
        ctx = SimpleNamespace(vocab_size=V, seq_len=16, path=make_path("masked", V, block_length=k))
        built = build_denoiser_model({"preset": "tiny", "max_len": 16}, ctx)
        assert type(built) is cls
    from tcsm.core.errors import ConfigError

    ctx = SimpleNamespace(vocab_size=V, seq_len=16, path=make_path("masked", V, block_length=4))
    assert build_denoiser_model({"preset": "tiny", "max_len": 16, "attention": "flex"}, ctx).uses_flex("cpu")
    ctx = SimpleNamespace(vocab_size=V, seq_len=16, path=make_path("masked", V))
    with pytest.raises(ConfigError, match="flex: block models only"):
        build_denoiser_model({"preset": "tiny", "max_len": 16, "attention": "flex"}, ctx)


@pytest.mark.parametrize("L, k", [(6, 2), (16, 4), (12, 12), (8, 1), (20, 5)])
def test_mask_mod_is_the_explicit_mask(L, k):
    """FlexAttention's mask_mod, evaluated at every (query, key) pair of the [x_t; x_1] pass, is
    `block_attention_mask` (itself checked against its definition above)."""
    pos = torch.arange(2 * L)
    allowed = block_mask_mod(L, k)(0, 0, pos[:, None], pos[None, :])
    assert torch.equal(allowed, block_attention_mask(L, k))


@pytest.mark.parametrize("tc", [True, False])
@pytest.mark.parametrize("k, L", [(4, 16), (1, 6), (16, 16), (8, 24)])
def test_flex_one_pass_equals_the_explicit_mask(tc, k, L):
    """fp32, CPU: the one pass under FlexAttention block masks gives the logits of SDPA and of the explicit kernel
    under the boolean mask, for the same weights; the flex model's KV cache decode (dense, unchanged) gives them
    block by block."""
    models = {att: _model(k, tc, L=L, attention=att) for att in ("flex", "sdpa", "math")}
    assert models["flex"].uses_flex("cpu") and not models["sdpa"].uses_flex("cpu")
    xt, x1, tb = _batch(3, L, k)
    t = tb.repeat_interleave(k, 1)
    with torch.no_grad():
        logits = {att: m(xt, t, x1=x1) for att, m in models.items()}
        for att in ("sdpa", "math"):
            torch.testing.assert_close(logits["flex"], logits[att], atol=1e-5, rtol=0)
        flex, cache = models["flex"], models["flex"].new_cache(3)
        for b in range(L // k):
            lo = b * k
            out = flex.denoise(xt[:, lo : lo + k], tb[:, b], cache)
            torch.testing.assert_close(out, logits["flex"][:, lo : lo + k], atol=1e-5, rtol=0)
            flex.extend_cache(cache, x1[:, lo : lo + k])


def test_masks_are_built_once_per_shape_and_auto_picks_flex_on_a_gpu():
    model = _model(4, attention="flex")
    xt, x1, tb = _batch(2, 16, 4)
    with torch.no_grad():
        model(xt, tb.repeat_interleave(4, 1), x1=x1)
        first = model.attention_mask(16, xt.device)
        model(xt, tb.repeat_interleave(4, 1), x1=x1)
    assert len(model._masks) == 1 and model.attention_mask(16, xt.device) is first
    full, noisy = first
    assert full.shape[-2:] == (28, 28) and noisy.shape[-2:] == (16, 28)  # 2L − k keys; L noisy queries
    auto = _model(4)
    assert auto.uses_flex(torch.device("cuda")) and not auto.uses_flex("cpu")
    dense = auto.attention_mask(16, "cpu")[0]
    assert torch.equal(dense, block_attention_mask(16, 4)[:28, :28])
    dropout = BlockDenoiser(BlockDenoiserConfig(vocab_size=V, num_states=V + 1, max_len=16, d_model=32, n_layers=1,
                                                n_heads=4, dropout=0.1, block_length=4))  # fmt: skip
    assert not dropout.uses_flex(torch.device("cuda"))  # FlexAttention has no attention dropout


def test_flex_errors():
    with pytest.raises(ValueError, match="flex: block models only"):
        DenoiserConfig(vocab_size=V, num_states=V + 1, max_len=8, d_model=32, n_layers=1, n_heads=4, attention="flex")
    with pytest.raises(ValueError, match="no attention dropout"):
        BlockDenoiserConfig(vocab_size=V, num_states=V + 1, max_len=8, d_model=32, n_layers=1, n_heads=4,
                            dropout=0.1, block_length=4, attention="flex")  # fmt: skip
    model = _model(4, attention="flex").train()
    xt, x1, tb = _batch(2, 16, 4)
    with pytest.raises(ValueError, match="no backward pass on the CPU"):
        model(xt, tb.repeat_interleave(4, 1), x1=x1)


@pytest.mark.parametrize("L, k", [(16, 4), (24, 8), (6, 1), (16, 16)])
def test_block_flops_count_the_pass(L, k):
    """The unmasked count's attention pairs are the mask's (every layer but the last: all 2L − k query rows; the
    last: the L noisy rows), the dense count's all of them; k = L is the full-sequence denoiser's count."""
    cfg = _model(k, L=L).cfg
    d, n, T = cfg.d_model, cfg.n_layers, 2 * L - k
    mask = block_attention_mask(L, k)[:T, :T]
    unmasked, dense = (block_flops_per_sequence(cfg, L, a) for a in ("unmasked", "dense"))
    pairs = (n - 1) * int(mask.sum()) + int(mask[:L].sum())
    assert dense - unmasked == pytest.approx(6 * 2 * d * ((n - 1) * T * T + L * T - pairs))
    if k == L:
        assert unmasked == dense == pytest.approx(flops_per_token(cfg, L) * L)
    else:
        assert unmasked < dense
    if k > 1:
        with pytest.raises(ValueError, match="not a multiple"):
            block_flops_per_sequence(cfg, L + 1)


def test_gpu_step_benchmark_smoke_runs_the_block_step_on_the_cpu(tmp_path):
    """benchmarks/gpu_step.py --smoke: the full-sequence and the block step (sdpa; flex trains on a GPU only) run,
    and the block step's MFU is counted with the block model's FLOPs, dense-equivalent beside it."""
    import gzip
    import importlib.util
    from pathlib import Path

    text = " ".join(["the", "one", "zero", "nine", "of"][i * 7 % 5] for i in range(12000))
    data = tmp_path / "text8.gz"
    with gzip.open(data, "wt") as f:
        f.write(text)
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_step.py"
    spec = importlib.util.spec_from_file_location("gpu_step", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    res = bench.main(["--smoke", "--data", str(data), "--out", str(tmp_path / "gpu_step.json")])
    steps, block = res["summary"]["steps"], "tcsm block k=8 sdpa"
    assert {"tcsm", "hand-written", block} <= set(steps) and not any("flex" in lab for lab in steps)
    unmasked, dense = res["flops"][block]
    assert res["flops"]["tcsm"] < unmasked < dense
    assert steps[block]["mfu_dense_pairs"] / steps[block]["mfu"] == pytest.approx(dense / unmasked)
    assert "Block step (k = 8" in bench.report(res)
