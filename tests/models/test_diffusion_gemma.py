"""DiffusionGemma as a tcsm block denoiser (MATH.md §9), on tiny random instances built from transformers' own config
classes (nothing downloaded): the one-pass logits equal the model's own per-canvas calls, the KV cache is exact, and
on the tiniest instance the uniform time-reversal bound summed over canvases dominates the exact −log p of the
model's own implied distribution and equals the same math written out by hand."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "DiffusionGemmaForBlockDiffusion"):
    pytest.skip("this transformers has no DiffusionGemma", allow_module_level=True)

from diffusion_gemma_helpers import tiny_hf

from tcsm.models.diffusion_gemma import DiffusionGemmaDenoiser, check_canvas_fit
from tcsm.models.kinds import kind_of
from tcsm.paths import UniformPath

pytestmark = pytest.mark.usefixtures("one_thread")


def _pair(B, L, V, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (B, L), generator=g), torch.randint(0, V, (B, L), generator=g)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_one_pass_equals_the_models_own_canvas_calls_and_its_cache(attn):
    """Block b of the one pass = the model's forward(input_ids=x_1^{<b}, decoder_input_ids=x_t^b) (fp32, ≤ 1e-5),
    and = `denoise` after `extend_cache` of the blocks before it (block 0: an empty cache)."""
    hf = tiny_hf(attn=attn)
    model = DiffusionGemmaDenoiser(hf)
    assert kind_of(model).blocks and model.block_length == 2 and model.cfg.num_states == 16
    B, L, k = 3, 8, 2
    x1, xt = _pair(B, L, 16, 1)
    with torch.no_grad():
        one = model(xt, torch.rand(B, L), x1=x1)
        assert one.shape == (B, L, 16) and one.dtype == torch.float32
        cache = model.new_cache(B)
        for b in range(L // k):
            blk = slice(b * k, (b + 1) * k)
            if b:
                own = hf(input_ids=x1[:, : b * k], decoder_input_ids=xt[:, blk]).logits
                torch.testing.assert_close(one[:, blk], own, atol=1e-5, rtol=0)
            torch.testing.assert_close(one[:, blk], model.denoise(xt[:, blk], None, cache), atol=1e-5, rtol=0)
            model.extend_cache(cache, x1[:, blk])
        assert cache.length == L


def test_block_logits_read_only_their_block_and_the_clean_blocks_before_it():
    """Changing x_1 from block b on, x_t outside block b, or t leaves block b's logits as they are; the sliding
    window matters (a mask that let sliding layers read the whole prefix would differ)."""
    model = DiffusionGemmaDenoiser(tiny_hf())
    B, L, k = 2, 8, 2
    x1, xt = _pair(B, L, 16, 2)
    with torch.no_grad():
        base = model(xt, torch.rand(B, L), x1=x1)
        for b in range(L // k):
            x1b, xtb = x1.clone(), xt.clone()
            x1b[:, b * k :] = (x1b[:, b * k :] + 1) % 16
            xtb[:, : b * k] = (xtb[:, : b * k] + 3) % 16
            xtb[:, (b + 1) * k :] = (xtb[:, (b + 1) * k :] + 5) % 16
            out = model(xtb, torch.zeros(B, L), x1=x1b)
            torch.testing.assert_close(out[:, b * k : (b + 1) * k], base[:, b * k : (b + 1) * k], atol=1e-5, rtol=0)
        model.sliding_window = 100
        assert (model(xt, None, x1=x1)[:, 6:] - base[:, 6:]).abs().max() > 1e-3


def test_self_conditioning_is_the_models_own_and_off_by_default():
    """`self_cond` logits reach the model's self-conditioning input; a denoiser made with self_conditioning=True
    feeds each call's logits to the next call on the same block (generate()'s loop), and a new block starts clean."""
    hf = tiny_hf()
    B, L, k = 2, 4, 2
    x1, xt = _pair(B, L, 16, 3)
    sc = torch.randn(B, k, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = DiffusionGemmaDenoiser(hf)
        one = plain(xt, None, x1=x1, self_cond=torch.cat([sc, sc], 1))
        own = hf(input_ids=x1[:, :k], decoder_input_ids=xt[:, k:], self_conditioning_logits=sc).logits
        torch.testing.assert_close(one[:, k:], own, atol=1e-5, rtol=0)
        assert (one - plain(xt, None, x1=x1)).abs().max() > 1e-3
        fed = DiffusionGemmaDenoiser(hf, self_conditioning=True)
        cache = fed.new_cache(B)
        first = fed.denoise(xt[:, :k], None, cache)
        torch.testing.assert_close(first, plain.denoise(xt[:, :k], None, plain.new_cache(B)), atol=1e-6, rtol=0)
        second = fed.denoise(xt[:, :k], None, cache)
        torch.testing.assert_close(second, plain.denoise(xt[:, :k], None, plain.new_cache(B), self_cond=first),
                                   atol=1e-6, rtol=0)  # fmt: skip
        fed.extend_cache(cache, x1[:, :k])
        assert cache.previous_logits is None


def test_state_dict_is_the_models_saved_file(tmp_path):
    """A tcsm checkpoint of the adapter holds exactly what save_pretrained writes (its names, tied copies once);
    loading it back restores every tied copy."""
    from safetensors.torch import load_file

    hf = tiny_hf(seed=1)
    hf.save_pretrained(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    model = DiffusionGemmaDenoiser(hf)
    own = model.state_dict()
    assert set(own) == set(saved)
    fresh = DiffusionGemmaDenoiser(tiny_hf(seed=2))
    fresh.load_state_dict(saved)
    x1, xt = _pair(2, 4, 16, 4)
    with torch.no_grad():
        torch.testing.assert_close(fresh(xt, None, x1=x1), model(xt, None, x1=x1), atol=0, rtol=0)
    assert fresh.hf.lm_head.weight.data_ptr() == fresh.hf.model.decoder.embed_tokens.weight.data_ptr()


def test_one_line_errors():
    model = DiffusionGemmaDenoiser(tiny_hf())
    x = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="needs the clean sequence"):
        model(x, None)
    with pytest.raises(ValueError, match="not a multiple of the DiffusionGemma canvas_length=2"):
        model(torch.zeros(1, 3, dtype=torch.long), None, x1=torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="set path.block_length=2"):
        check_canvas_fit(4, 2, 4)
    hf = tiny_hf()
    hf.config.text_config.use_bidirectional_attention = "all"
    with pytest.raises(ValueError, match="not causal"):
        DiffusionGemmaDenoiser(hf)


class _PerCanvas:
    """The model's own per-canvas computation as a block denoiser: canvas b from forward(input_ids=x_1^{<b},
    decoder_input_ids=x_t^b) (block 0 from the adapter's empty cache, which the model's forward cannot take)."""

    model_kind = DiffusionGemmaDenoiser.model_kind

    def __init__(self, model):
        self.model = model

    def __call__(self, xt, t, x1=None):
        k, hf = self.model.block_length, self.model.hf
        first = self.model.denoise(xt[:, :k], None, self.model.new_cache(xt.shape[0]))
        rest = [hf(input_ids=x1[:, :b], decoder_input_ids=xt[:, b : b + k]).logits for b in range(k, xt.shape[1], k)]
        return torch.cat([first, *rest], 1)


def test_tcsms_block_bound_on_the_adapter_is_the_bound_of_the_models_own_calls():
    """evaluation.likelihood's per-block estimate (uniform path, block_length = canvas_length) on the adapter equals
    the same estimate, same draws, on the model's own per-canvas forward."""
    from tcsm.evaluation.likelihood import nelbo_terms

    model = DiffusionGemmaDenoiser(tiny_hf(V=16, k=2, window=3))
    x1 = _pair(3, 6, 16, 5)[0]
    path = UniformPath(16, block_length=2)
    with torch.no_grad():
        ours = nelbo_terms(model, x1, path, num_t=4, generator=torch.Generator().manual_seed(0))
        own = nelbo_terms(_PerCanvas(model), x1, path, num_t=4, generator=torch.Generator().manual_seed(0))
    assert ours.shape == (4, 3) and torch.isfinite(ours).all()
    torch.testing.assert_close(ours, own, atol=1e-4, rtol=1e-5)


# --- the bound on the tiniest instance: V = 4, two canvases of two -----------------------------------------------
# The model has no time input, so m(x_t^i | x_t) stays below 1 at a clean-looking x_t: the uniform bound's integrand
# then grows like Σ_i (1 − m(x_1^i | x_1)) / (1 − t) at the clean end and its integral up to t = 1 is infinite
# (MATH.md §9, "A time-blind denoiser"). The finite bound is the one of the sampler that runs the time reversal up to
# t_1 = 1 − e^{−w_1} and then draws each token from m(· | x_{t_1}):
# ∫_0^{t_1} c_t E[G] dt + E_{x_{t_1}}[−Σ_i log m^i(x_1^i | x_{t_1})].

V, K, L = 4, 2, 4


def _canvas_marginals(model):
    """m[c, s] = softmax logits [K, V] of canvas state s (16 of them) in context c: c = 0 the first canvas (no
    prefix), c = 1 + p the second canvas after the clean first canvas p. The model ignores t, so one call serves
    every time."""
    S = torch.tensor(list(itertools.product(range(V), repeat=K)))  # [16, K]
    n = S.shape[0]
    x1 = torch.cat([S.repeat_interleave(n, 0), S.repeat(n, 1)], 1)  # rows (p, s): prefix p, anything after
    xt = torch.cat([S.repeat(n, 1), S.repeat(n, 1)], 1)
    with torch.no_grad():
        m = torch.softmax(model(xt, None, x1=x1).double(), -1)
    first = m[:n, :K]  # block 0 does not read x_1: any p gives it
    second = m[:, K:].reshape(n, n, K, V)
    return S, torch.cat([first[None], second], 0)  # [17, 16, K, V]


def _kernel(t, y, z):
    """k_t(y | z) of the uniform path, linear schedule."""
    return t * (y == z) + (1 - t) / V


def _reversal_by_hand(m, S, xs, t):
    """Σ_i Σ_{y≠x_t^i} [r log(r/ŝ) − r + ŝ] at (x_t = S[s], x_1 = xs) for every s, linear schedule (MATH.md §2.3 B):
    b = Vt/(1−t), r_y = k_t(y|x_1)/k_t(x_t|x_1), ŝ_y = 1 + b m(y) − b/(1+b) m(x_t). Returns [T, 16]."""
    t4 = t[:, None, None, None]
    b = V * t4 / (1 - t4)
    ys, x, z = torch.arange(V), S[None, :, :, None], xs[None, None, :, None]
    r = _kernel(t4, ys, z) / _kernel(t4, x, z)
    s_hat = 1 + b * m[None] - b / (1 + b) * m.gather(-1, S[..., None])[None]
    g = r * torch.log(r / s_hat) - r + s_hat
    return torch.where(ys == x, torch.zeros_like(g), g).sum((-1, -2))


def _quadrature(w1, n_t=40, n_w=80):
    """∫_0^{t_1} f dt: Gauss–Legendre in t on [0, 1/2] and in w = −log(1 − t) on [log 2, w_1]."""
    x, w = np.polynomial.legendre.leggauss(n_t)
    t1, q1 = 0.25 * (x + 1), 0.25 * w
    x, w = np.polynomial.legendre.leggauss(n_w)
    ww = math.log(2) + 0.5 * (w1 - math.log(2)) * (x + 1)
    t2, q2 = -np.expm1(-ww), 0.5 * (w1 - math.log(2)) * w * np.exp(-ww)
    return torch.tensor(np.concatenate([t1, t2])), torch.tensor(np.concatenate([q1, q2]))


def _canvas_bound(m, S, xs, w1, reconstruct=True):
    """∫_0^{t_1} c_t Σ_{x_t} k_t(x_t|x_s) G dt (c_t = 1/(Vt)) + Σ_{x_{t_1}} k_{t_1}(x_{t_1}|x_s) (−log Π_i m(x_s^i|x_{t_1})),
    for one canvas x_s, by enumeration and quadrature."""
    t, q = _quadrature(w1)
    kern = _kernel(t[:, None, None], S[None], xs).prod(-1)  # [T, 16]
    value = (q * (kern * _reversal_by_hand(m, S, xs, t)).sum(-1) / (V * t)).sum()
    if reconstruct:
        t1 = -math.expm1(-w1)
        recon = -m.gather(-1, xs.expand(S.shape[0], K)[..., None]).squeeze(-1).log().sum(-1)  # [16]
        value = value + (_kernel(t1, S, xs).prod(-1) * recon).sum()
    return value


def _canvas_nll(m, S, w1, n_v, n_w, t0=1e-7):
    """−log p^θ(x_s) for every canvas x_s [C, 16] of the sampler: the model's time-reversal CTMC (rates c_t ŝ_y to
    [y, x^{≠i}]) from uniform up to t_1 = 1 − e^{−w_1}, by midpoint matrix exponentials on grids in log t and in
    w = −log(1 − t), then one factorized draw from m(· | x_{t_1})."""
    v = torch.linspace(math.log(t0), math.log(0.5), n_v + 1, dtype=torch.float64)
    w = torch.linspace(math.log(2), w1, n_w + 1, dtype=torch.float64)
    vm, wm = (v[1:] + v[:-1]) / 2, (w[1:] + w[:-1]) / 2
    t = torch.cat([vm.exp(), -torch.expm1(-wm)])
    dt = torch.cat([vm.exp() * v.diff(), torch.exp(-wm) * w.diff()])
    n = S.shape[0]
    radix = V ** torch.arange(K - 1, -1, -1)
    tgt = (S * radix).sum(-1)[:, None, None] + (torch.arange(V)[None, None] - S[..., None]) * radix[None, :, None]
    b = (V * t / (1 - t))[:, None, None, None, None]
    mx = m.gather(-1, S[None, :, :, None].expand(m.shape[0], -1, -1, 1))
    rates = (1 + b * m[None] - b / (1 + b) * mx[None]) / (V * t)[:, None, None, None, None]
    rates = torch.where(torch.arange(V) == S[..., None], torch.zeros_like(rates), rates)  # [T, C, 16, K, V]
    Q = torch.zeros(*rates.shape[:2], n, n, dtype=torch.float64)
    Q.scatter_add_(-1, tgt.reshape(1, 1, n, K * V).expand(*rates.shape[:2], -1, -1), rates.flatten(-2))
    Q = Q - torch.diag_embed(Q.sum(-1))
    E = torch.linalg.matrix_exp(Q * dt[:, None, None, None])
    p = torch.full((m.shape[0], n), 1.0 / n, dtype=torch.float64)
    for k in range(E.shape[0]):
        p = torch.einsum("cn,cnm->cm", p, E[k])
    draw = m[:, :, torch.arange(K)[:, None], S.T].prod(-2)  # [C, 16 (x_{t_1}), 16 (x_s)]: Π_i m^i(x_s^i | x_{t_1})
    return -torch.einsum("cn,cnm->cm", p, draw).log()


def _model():
    return DiffusionGemmaDenoiser(tiny_hf(V=V, k=K, window=2, seed=3, scale=0.3))


def test_canvas_bound_dominates_the_models_exact_nll():
    """For every x of 2 canvases of 2 tokens over V = 4: Σ_canvases (time-reversal bound up to t_1 + reconstruction),
    by hand and exact in x_t and t, ≥ −log p^θ(x), p^θ the model's own implied distribution for that sampler (each
    canvas's exact marginal given the clean canvases before it), with a gap; p^θ sums to 1."""
    S, m = _canvas_marginals(_model())
    w1 = 6.0
    coarse, fine = _canvas_nll(m, S, w1, 60, 60), _canvas_nll(m, S, w1, 120, 120)
    nll = (4 * fine - coarse) / 3  # Richardson on the second-order midpoint scheme
    assert (fine - coarse).abs().max() < 1e-3
    bounds, nlls = [], []
    for i, j in itertools.product(range(S.shape[0]), repeat=2):
        bounds.append(_canvas_bound(m[0], S, S[i], w1) + _canvas_bound(m[1 + i], S, S[j], w1))
        nlls.append(nll[0, i] + nll[1 + i, j])
    bounds, nlls = torch.stack(bounds), torch.stack(nlls)
    assert float(torch.exp(-nlls).sum()) == pytest.approx(1.0, abs=1e-6)
    assert (bounds >= nlls + 1e-3).all(), (bounds - nlls).min()


def test_without_the_reconstruction_end_a_time_blind_bound_grows_without_limit():
    """The clean-end integral alone grows by ≈ Σ_i (1 − m(x^i | x)) per unit of w = −log(1 − t): it has no limit
    as t_1 → 1 (MATH.md §9, "A time-blind denoiser"), while the bound with its reconstruction term stays put."""
    S, m = _canvas_marginals(_model())
    x = S[6]
    slope = (1 - m[0, 6].gather(-1, x[:, None]).squeeze(-1)).sum()
    grow = _canvas_bound(m[0], S, x, 24.0, reconstruct=False) - _canvas_bound(m[0], S, x, 12.0, reconstruct=False)
    assert float(grow) == pytest.approx(12 * float(slope), rel=1e-3)
    assert float(slope) > 0.1
    assert float(_canvas_bound(m[0], S, x, 24.0) - _canvas_bound(m[0], S, x, 12.0)) == pytest.approx(
        float(grow), rel=1e-3
    )  # the reconstruction term is ≈ the same at both t_1 (the denoiser is time-blind): a later t_1 only costs


def test_tcsms_uniform_integrand_on_the_adapter_is_the_hand_written_one():
    """tcsm's closed-form time-reversal integrand (paths/uniform.py) on the adapter's logits equals the hand-written
    G of MATH.md §2.3 B at every canvas state and time."""
    S, m = _canvas_marginals(_model())
    path = UniformPath(V)
    t = torch.tensor([0.05, 0.3, 0.7, 0.99], dtype=torch.float64)
    for c, xs in ((0, S[5]), (1 + 7, S[11])):
        logits = m[c].log().repeat(t.numel(), 1, 1)  # every state at every time
        xt = S.repeat(t.numel(), 1)
        tt = t.repeat_interleave(S.shape[0])
        w, G = path.bound_integrand("reversal", logits, xs.expand_as(xt), xt, tt)
        torch.testing.assert_close(G.reshape(t.numel(), -1), _reversal_by_hand(m[c], S, xs, t), atol=1e-9, rtol=1e-9)
        torch.testing.assert_close(w, 1 / (V * tt), atol=1e-12, rtol=1e-12)


def test_tcsms_clean_end_bound_estimates_the_exact_truncated_bound():
    """`nelbo_terms(..., t_max=t_1)` on the adapter (per canvas: the integral up to t_1 plus the reconstruction
    draw) is an unbiased estimate of the exact bound that dominates the model's own −log p (|Δ| ≤ 4 s.e.)."""
    from tcsm.evaluation.likelihood import nelbo_terms

    model = _model()
    S, m = _canvas_marginals(model)
    w1 = 3.0
    pairs = [(6, 9), (0, 15), (11, 3)]
    x = torch.stack([torch.cat([S[i], S[j]]) for i, j in pairs])
    exact = torch.stack([_canvas_bound(m[0], S, S[i], w1) + _canvas_bound(m[1 + i], S, S[j], w1) for i, j in pairs])
    with torch.no_grad():
        terms = nelbo_terms(model, x, UniformPath(V, block_length=K), num_t=1500, t_max=-math.expm1(-w1),
                            chunk_size=3000, generator=torch.Generator().manual_seed(0))  # fmt: skip
    est, se = terms.mean(0), terms.std(0) / math.sqrt(terms.shape[0])
    assert ((est - exact).abs() <= 4 * se).all(), (est, exact, se)
    assert (se < 0.05 * exact).all()  # a finite-variance estimate, unlike the untruncated one


def test_decode_from_and_encoder_logits_are_slices_of_the_one_pass():
    """`decode_from=b·k` gives the one pass's logits from block b on (self-conditioning of that shape included);
    `encoder_logits=True` adds the causal encoder's soft-capped next-token logits, the model's own encoder output."""
    hf = tiny_hf()
    model = DiffusionGemmaDenoiser(hf)
    x1, xt = _pair(2, 8, 16, 7)
    sc = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0))
    on = torch.tensor([True, False])
    with torch.no_grad():
        full, enc = model(xt, None, x1=x1, self_cond=sc, self_cond_mask=on, encoder_logits=True)
        part = model(xt, None, x1=x1, self_cond=sc[:, 4:], self_cond_mask=on, decode_from=4)
        torch.testing.assert_close(part, full[:, 4:], atol=1e-5, rtol=0)
        cap = hf.config.get_text_config().final_logit_softcapping
        own = torch.tanh(hf.lm_head(hf.model.encoder(input_ids=x1).last_hidden_state) / cap) * cap
        torch.testing.assert_close(enc, own, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="multiple of the block length"):
        model(xt, None, x1=x1, decode_from=3)
