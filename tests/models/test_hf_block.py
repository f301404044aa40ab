"""A block denoiser started from a Hugging Face causal LM (`model.name=hf_denoiser` with `path.block_length`), on
tiny random GPT-2 / Llama / Qwen2 models built offline: the cached logits through the model's own DynamicCache equal the
one-pass logits (fp32, ≤ 1e-5) with prompts of several blocks, lockstep blocks and both attention implementations;
block b reads x_t^b and x_1^{<b} only; kept causal and fed x_t = x_1 it is the pretrained AR model (the shift is
right); decode_blocks draws with it; what it cannot be is refused in one line."""

from __future__ import annotations

import pytest
import torch

from tcsm.models.hf import HFCausalLM
from tcsm.models.hf_block import HFBlockDenoiser
from tcsm.models.kinds import denoise, kind_of
from tcsm.paths import MaskedPath
from tcsm.sampling.blocks import decode_blocks
from tcsm.sampling.registry import sampler_class

tf = pytest.importorskip("transformers")

HF_VOCAB, BOS = 40, 1
TOKEN_IDS = list(range(10, 18))  # our 8 tokens as HF ids
V, K, L = 8, 4, 16


def _config(arch: str):
    if arch == "gpt2":
        return tf.GPT2Config(vocab_size=HF_VOCAB, n_positions=40, n_embd=32, n_layer=2, n_head=2, bos_token_id=BOS,
                             eos_token_id=2)  # fmt: skip
    if arch == "qwen2":
        return tf.Qwen2Config(vocab_size=HF_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40,
                              bos_token_id=BOS, eos_token_id=2)  # fmt: skip
    return tf.LlamaConfig(vocab_size=HF_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40, bos_token_id=BOS,
                          eos_token_id=2)  # fmt: skip


def _hf(arch: str, impl: str = "sdpa"):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return tf.AutoModelForCausalLM.from_config(_config(arch), attn_implementation=impl).eval()


def _model(arch="gpt2", impl="sdpa", timed=False, **kw):
    model = HFBlockDenoiser(_hf(arch, impl), TOKEN_IDS, block_length=K, num_states=V + 1, time_conditioning=timed,
                            cond_dim=16, **kw).eval()  # fmt: skip
    if timed:  # the time path starts at zero; give it weight so that the time input matters in the test
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            model.time_proj.weight.normal_(0, 0.5)
    return model


def _inputs(seed=0, B=3):
    g = torch.Generator().manual_seed(seed)
    x1 = torch.randint(0, V, (B, L), generator=g)
    xt = torch.where(torch.rand(B, L, generator=g) < 0.5, V, x1)
    t = torch.rand(B, L // K, generator=g).repeat_interleave(K, 1)
    return xt, t, x1


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2"])
@pytest.mark.parametrize("timed", [False, True])
def test_cached_logits_equal_the_one_pass(arch, impl, timed):
    model = _model(arch, impl, timed)
    xt, t, x1 = _inputs()
    with torch.no_grad():
        full = model(xt, t, x1=x1)
        for prompt_blocks in (0, 1, 2):  # a prompt of whole blocks enters the cache in one call
            cache = model.new_cache(3)
            model.extend_cache(cache, x1[:, : prompt_blocks * K])
            for b in range(prompt_blocks, L // K):
                got = model.denoise(xt[:, b * K : (b + 1) * K], t[:, b * K], cache)
                assert cache.length == b * K  # denoise leaves the cache as it was
                torch.testing.assert_close(got, full[:, b * K : (b + 1) * K], atol=1e-5, rtol=0)
                model.extend_cache(cache, x1[:, b * K : (b + 1) * K])


def test_kept_causal_on_clean_input_it_is_the_pretrained_ar_model():
    """With causal attention everywhere and x_t = x_1, position i's logits are p^AR(x^i | x^{<i}): the anchor and the
    next-token shift put every HF output where the AR model has it."""
    for arch in ("gpt2", "llama"):
        model = _model(arch, bidirectional=False)
        _, t, x1 = _inputs()
        with torch.no_grad():
            torch.testing.assert_close(model(x1, t, x1=x1), HFCausalLM(model.hf, TOKEN_IDS, BOS)(x1), atol=1e-5, rtol=0)
            shifted = torch.roll(HFCausalLM(model.hf, TOKEN_IDS, BOS)(x1), 1, dims=1)
            assert (model(x1, t, x1=x1) - shifted).abs().max() > 1e-3


@pytest.mark.parametrize("timed", [False, True])
def test_block_b_reads_its_noisy_block_and_the_clean_blocks_before_it(timed):
    model = _model("llama", timed=timed)
    xt, t, x1 = _inputs(seed=3)
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        base = model(xt, t, x1=x1)
        for b in range(L // K):
            lo, hi = b * K, (b + 1) * K
            xt2, x12, t2 = xt.clone(), x1.clone(), t.clone()
            outside = torch.ones(L, dtype=torch.bool)
            outside[lo:hi] = False
            xt2[:, outside] = torch.randint(0, V + 1, (3, L - K), generator=g)
            x12[:, lo:] = torch.randint(0, V, (3, L - lo), generator=g)
            t2[:, outside] = torch.rand(3, L - K, generator=g)
            torch.testing.assert_close(model(xt2, t2, x1=x12)[:, lo:hi], base[:, lo:hi], atol=1e-6, rtol=0)
            inside = xt.clone()
            inside[:, hi - 1] = (inside[:, hi - 1] + 1) % (V + 1)  # the block's last token is read by the others
            assert (model(inside, t, x1=x1)[:, lo:hi] - base[:, lo:hi]).abs().max() > 1e-6
            if b:
                before = x1.clone()
                before[:, lo - 1] = (before[:, lo - 1] + 1) % V  # the clean token just before the block: the anchor
                assert (model(xt, t, x1=before)[:, lo:hi] - base[:, lo:hi]).abs().max() > 1e-6


def test_it_is_a_block_model_and_decodes_with_prompts_and_eos():
    model = _model("gpt2")
    assert kind_of(model).blocks and kind_of(model).family == "denoiser"
    xt, t, x1 = _inputs()
    assert torch.equal(denoise(model, xt, t, x1), model(xt, t, x1=x1))
    path = MaskedPath(V, block_length=K)
    fixed = torch.zeros(3, L, dtype=torch.bool)
    fixed[0, :6], fixed[1, :1] = True, True  # prompts of 6, 1 and 0 tokens: ending inside blocks 1 and 0, none
    values = torch.where(fixed, x1, 0)
    # greedy blocks (one step, argmax) through the cache equal the argmax of the one pass given the decoded prefix
    cls = sampler_class("ancestral")
    x, st = decode_blocks(model, path, cls(cls.settings_type(steps=1, final_argmax=True)), 3, L, fixed=fixed,
                          values=values)  # fmt: skip
    ref = torch.where(fixed, values, torch.full_like(values, V))
    with torch.no_grad():
        for lo in range(0, L, K):
            best = model(ref, None, x1=torch.where(ref == V, 0, ref))[:, lo : lo + K].argmax(-1)
            ref[:, lo : lo + K] = torch.where(fixed[:, lo : lo + K], values[:, lo : lo + K], best)
    assert torch.equal(x, ref) and st.counts == {"blocks": 4, "cache_calls": 3}
    assert len(set(x[~fixed].tolist())) >= 2  # the argmax depends on the context
    cls = sampler_class("confidence")
    x, stats = decode_blocks(model, path, cls(cls.settings_type(steps=K)), 3, L, fixed=fixed, values=values,
                             generator=torch.Generator().manual_seed(0), eos_id=3)  # fmt: skip
    assert x.shape == (3, L) and ((x >= 0) & (x < V)).all() and torch.equal(x[fixed], x1[fixed])
    assert stats.counts["blocks"] >= 1 and stats.num_calls >= 1


def test_what_it_cannot_be_is_refused_in_one_line():
    hf = _hf("gpt2")
    with pytest.raises(ValueError, match="started from a causal LM"):
        HFBlockDenoiser(hf, TOKEN_IDS, block_length=K, num_states=V + 1, kind="mlm")
    with pytest.raises(ValueError, match="uniform source needs its time input"):
        HFBlockDenoiser(hf, TOKEN_IDS, block_length=K, num_states=V)
    HFBlockDenoiser(hf, TOKEN_IDS, block_length=K, num_states=V, time_conditioning=True)  # uniform with time: fine
    with pytest.raises(ValueError, match="block_length must be an integer"):
        HFBlockDenoiser(hf, TOKEN_IDS, block_length=0, num_states=V + 1)
    model = _model("gpt2")
    xt, t, x1 = _inputs()
    with pytest.raises(ValueError, match="needs the clean sequence"):
        model(xt, t)
    with pytest.raises(ValueError, match="not a multiple of the model's block_length"):
        model(xt[:, :6], t[:, :6], x1=x1[:, :6])
    with pytest.raises(ValueError, match=r"x1 token ids must lie in \[0, 8\)"):
        model(xt, t, x1=xt)
    cache = model.new_cache(3)
    with pytest.raises(ValueError, match="cache holds 3 rows"):
        model.denoise(xt[:2, :K], None, cache)
    with pytest.raises(ValueError, match="at most 4 positions"):
        model.denoise(xt[:, : 2 * K], None, cache)
    model.extend_cache(cache, x1[:, :2])
    with pytest.raises(ValueError, match="ends inside a block"):
        model.denoise(xt[:, :K], None, cache)
    with pytest.raises(TypeError, match="made by this model's new_cache"):
        model.denoise(xt[:, :K], None, object())
