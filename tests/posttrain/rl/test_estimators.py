"""Sequence log-likelihood estimators against the exact log p(completion | prompt) by enumeration (tiny V, L)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from tcsm.evaluation.exact import EnumerableDistribution, ExactBlockDenoiser
from tcsm.models.causal import CausalLM
from tcsm.models.lm import LMConfig
from tcsm.paths import make_path
from tcsm.posttrain.rl.estimators import ELBOEstimate, ExactEstimate, OneStepEstimate, eubo

V, L, P = 3, 4, 1  # vocabulary, length, prompt positions


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    path = make_path("masked", V, "linear")
    dist = EnumerableDistribution.random(V, L, seed=3, concentration=0.7)
    x = dist.sample(6, torch.Generator().manual_seed(1))
    cond = torch.zeros(6, L, dtype=torch.bool)
    cond[:, :P] = True
    return path, dist, dist.denoiser(path), x, cond


def log_cond(dist, x, given):
    """log p_1(x^{S} | x^{given}) for the positions S = ~given, by enumeration: [B]."""
    match = (dist.states.unsqueeze(0)[..., given] == x.unsqueeze(1)[..., given]).all(-1)  # [B, N]
    lp = torch.where(match, dist.log_probs.unsqueeze(0), torch.full_like(match, -math.inf, dtype=torch.float64))
    return dist.log_prob(x) - torch.logsumexp(lp, -1)


def exact_completion(dist, x):
    given = torch.zeros(L, dtype=torch.bool)
    given[:P] = True
    return log_cond(dist, x, given)


def single_given(dist, x, i, visible):
    """log p_1(x^i | x^{visible}) [B]."""
    keep = torch.zeros(L, dtype=torch.bool)
    keep[list(visible)] = True
    both = keep.clone()
    both[i] = True
    return _marg(dist, x, both) - _marg(dist, x, keep)


def _marg(dist, x, pos):
    """log p_1(x^{pos}) [B]."""
    match = (dist.states.unsqueeze(0)[..., pos] == x.unsqueeze(1)[..., pos]).all(-1)
    lp = torch.where(match, dist.log_probs.unsqueeze(0), torch.full_like(match, -math.inf, dtype=torch.float64))
    return torch.logsumexp(lp, -1)


def mc(est, model, x, cond, n, sign=None):
    """n independent estimates per row (one call on n copies of the batch): (mean, standard error, variance)."""
    vals = est(model, x.repeat(n, 1), cond.repeat(n, 1), torch.Generator().manual_seed(0), sign).double()
    vals = vals.view(n, x.shape[0])
    return vals.mean(0), vals.std(0) / math.sqrt(n), vals.var(0)


def test_elbo_is_unbiased_for_the_exact_denoiser(setup):
    """The masked bound is tight at the exact posterior (MATH.md §2.2): E[−NELBO] = log p(completion | prompt)."""
    path, dist, model, x, cond = setup
    mean, se, var = mc(ELBOEstimate(path, num_t=4), model, x, cond, 400)
    exact = exact_completion(dist, x)
    assert torch.all((mean - exact).abs() < 4 * se + 1e-9), (mean, exact, se)
    assert bool((var > 0).all())  # a Monte Carlo estimate, not the exact value


def test_one_step_without_prompt_masking_is_the_product_of_first_reveal_conditionals(setup):
    """ℓ = Σ_{i completion} log p(x^i | prompt): deterministic (variance 0), biased by the completion's dependence."""
    path, dist, model, x, cond = setup
    mean, _, var = mc(OneStepEstimate(path, prompt_mask_prob=0.0), model, x, cond, 3)
    expect = sum(single_given(dist, x, i, range(P)) for i in range(P, L))
    assert torch.allclose(mean, expect, atol=1e-5)
    assert float(var.max()) < 1e-12
    bias = mean - exact_completion(dist, x)
    assert float(bias.abs().max()) > 1e-3  # it is not the likelihood


def test_one_step_with_prompt_masking_averages_over_masked_prompts(setup):
    """E over the prompt mask (each token hidden w.p. p) of Σ_i log p(x^i | visible prompt), by enumeration."""
    path, dist, model, x, cond = setup
    p = 0.5
    mean, se, _ = mc(OneStepEstimate(path, prompt_mask_prob=p), model, x, cond, 1000)
    expect = torch.zeros(x.shape[0], dtype=torch.float64)
    for hidden in itertools.product([False, True], repeat=P):
        w = math.prod(p if h else 1 - p for h in hidden)
        visible = [j for j, h in zip(range(P), hidden) if not h]
        expect += w * sum(single_given(dist, x, i, visible) for i in range(P, L))
    assert torch.all((mean - expect).abs() < 4 * se + 1e-6), (mean, expect)


def eubo_limit(dist, x, beta):
    """(1/β) Σ_i log E_t E_{x_t}[1[masked]/(1 − t) m_i^β] for the linear schedule: given i masked, each other free
    position is revealed w.p. t, so E = Σ_U |U|!(n−1−|U|)!/n! p(x^i | prompt, x^U)^β over subsets U of the others."""
    n = L - P
    out = torch.zeros(x.shape[0], dtype=torch.float64)
    for i in range(P, L):
        others = [j for j in range(P, L) if j != i]
        e = torch.zeros(x.shape[0], dtype=torch.float64)
        for k in range(len(others) + 1):
            for U in itertools.combinations(others, k):
                c = math.factorial(k) * math.factorial(n - 1 - k) / math.factorial(n)
                e += c * torch.exp(beta * single_given(dist, x, i, list(range(P)) + list(U)))
        out += torch.log(e) / beta
    return out


@pytest.mark.parametrize("beta", [1.0, 2.0])
def test_eubo_tends_to_its_enumerated_value_which_bounds_the_likelihood_from_above(setup, beta):
    path, dist, model, x, cond = setup
    limit = eubo_limit(dist, x, beta)
    exact = exact_completion(dist, x)
    assert bool((limit >= exact - 1e-9).all())  # with the exact conditionals: Jensen over random orders
    assert float((limit - exact).max()) > 1e-3  # and not equal to it
    big = eubo(model, x, path, num_t=20000, beta=beta, generator=torch.Generator().manual_seed(0), cond_mask=cond)
    assert torch.allclose(big.double(), limit, atol=0.06)  # Monte Carlo error ≈ 0.02 at this K
    small, _, var = mc(lambda m, xx, c, g, s: eubo(m, xx, path, num_t=2, beta=beta, generator=g, cond_mask=c),
                       model, x, cond, 200)  # fmt: skip
    assert bool((var > 0).all())
    # With K = 2 draws a token is often masked in neither and left out (a log term ≤ 0 dropped), which moves the
    # estimate up; the log of a small mean moves it down. Here the first effect wins on average over the sequences.
    assert float((small - limit).mean()) > 0


def test_sandwich_uses_the_upper_bound_for_negative_advantages_only(setup):
    path, _dist, model, x, cond = setup
    est = ELBOEstimate(path, num_t=2, upper="eubo", eubo_beta=1.5)
    sign = torch.tensor([1.0, -1.0, 0.0, -1.0, 1.0, -1.0])
    got = est(model, x, cond, torch.Generator().manual_seed(5), sign)
    g = torch.Generator().manual_seed(5)
    lower = ELBOEstimate(path, num_t=2)(model, x, cond, g)
    upper = eubo(model, x, path, num_t=2, beta=1.5, generator=g, cond_mask=cond)
    assert torch.equal(got, torch.where(sign < 0, upper, lower))
    assert torch.equal(ELBOEstimate(path, num_t=2, upper="eubo")(model, x, cond, torch.Generator().manual_seed(5)),
                       ELBOEstimate(path, num_t=2)(model, x, cond, torch.Generator().manual_seed(5)))  # fmt: skip


def test_mixed_upper_side_weights_the_eubo_by_mix_weight(setup):
    """upper="mix": ω·EUBO + (1 − ω)·ELBO on the negative-advantage rollouts (ω = 0.25, where swapping the two weights
    shows), the ELBO elsewhere, on the same noise."""
    path, _dist, model, x, cond = setup
    sign = torch.tensor([1.0, -1.0, 0.0, -1.0, 1.0, -1.0])
    got = ELBOEstimate(path, num_t=2, upper="mix", mix_weight=0.25)(model, x, cond, torch.Generator().manual_seed(5),
                                                                      sign)  # fmt: skip
    g = torch.Generator().manual_seed(5)
    lower = ELBOEstimate(path, num_t=2)(model, x, cond, g)
    upper = eubo(model, x, path, num_t=2, beta=1.0, generator=g, cond_mask=cond)
    assert not torch.allclose(upper.double(), lower.double())
    want = torch.where(sign < 0, 0.25 * upper.double() + 0.75 * lower.double(), lower.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)


def test_exact_estimator_is_the_ar_likelihood_and_normalised_over_completions():
    torch.manual_seed(0)
    model = CausalLM(LMConfig(vocab_size=V, max_len=L, d_model=16, n_layers=1, n_heads=2)).eval()
    comps = torch.tensor(list(itertools.product(range(V), repeat=L - P)))
    x = torch.cat([torch.full((comps.shape[0], P), 2), comps], 1)
    cond = torch.zeros_like(x, dtype=torch.bool)
    cond[:, :P] = True
    with torch.no_grad():
        ell = ExactEstimate()(model, x, cond)
        again = ExactEstimate()(model, x, cond, torch.Generator().manual_seed(9))
        full = torch.log_softmax(model(x), -1).gather(-1, x.unsqueeze(-1)).squeeze(-1)
    assert torch.equal(ell, again)  # no noise
    assert torch.allclose(torch.logsumexp(ell.double(), 0), torch.zeros((), dtype=torch.float64), atol=1e-5)
    assert torch.allclose(ell, full[:, P:].sum(-1))


def test_estimators_say_which_models_they_read(setup):
    path, _dist, model, _x, _cond = setup
    ar = CausalLM(LMConfig(vocab_size=V, max_len=L, d_model=16, n_layers=1, n_heads=2))
    assert ExactEstimate().supports(model, path) is not None
    assert ExactEstimate().supports(ar, path) is None
    assert OneStepEstimate(path).supports(ar, path) is not None
    uniform = make_path("uniform", V, "linear")
    assert "mask" in OneStepEstimate(uniform).supports(model, uniform)
    assert ELBOEstimate(uniform, upper="eubo").supports(model, uniform) is not None
    blocks = make_path("masked", V, "linear", block_length=2)
    assert "block_length=2" in ELBOEstimate(blocks, upper="eubo").supports(model, blocks)
    assert ELBOEstimate(blocks).supports(model, blocks) is None


def test_exact_estimator_of_a_one_token_block_denoiser_is_the_likelihood(setup):
    """Block length 1 (MATH.md §9): Σ_j log p(x^j | x^{<j}) over the completion = log p(completion | prompt)."""
    _, dist, _, x, cond = setup
    path = make_path("masked", V, "linear", block_length=1)
    model = ExactBlockDenoiser(dist, path, 1)
    est = ExactEstimate(path)
    assert est.supports(model, path) is None
    assert est.supports(model, make_path("masked", V, "linear", block_length=2)) is not None
    got = est(model, x, cond)
    assert torch.allclose(got.double(), exact_completion(dist, x), atol=1e-5)


def test_exact_estimate_of_a_time_conditioned_one_token_block_model_is_its_samplers_law():
    """A time-conditioned block network with block length 1: exp(ℓ) over every sequence sums to 1 and is the law of
    block decoding's draws (one ancestral step per block, which reads the model at the source end t = 0), by a
    chi-square test on 3000 draws; read at the clean end instead, the network's conditionals differ."""
    from scipy.stats import chi2

    from tcsm.models.blocks import build_block_denoiser
    from tcsm.sampling.blocks import decode_blocks
    from tcsm.sampling.registry import sampler_class

    torch.manual_seed(0)
    n_len = 3
    path = make_path("masked", V, "linear", block_length=1)
    model = build_block_denoiser("tiny", 1, vocab_size=V, num_states=V + 1, d_model=16, n_layers=1, n_heads=2,
                                 cond_dim=8, max_len=n_len, time_conditioning=True).eval()  # fmt: skip
    with torch.no_grad():  # the zero-initialised head and adaLN gates would make every conditional uniform
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    states = torch.tensor(list(itertools.product(range(V), repeat=n_len)))
    with torch.no_grad():
        ell = ExactEstimate(path)(model, states, None).double()
    assert float(torch.logsumexp(ell, 0)) == pytest.approx(0.0, abs=1e-5)
    cls = sampler_class("ancestral")
    x, _ = decode_blocks(model, path, cls(cls.settings_type(steps=1)), 3000, n_len,
                         generator=torch.Generator().manual_seed(1))  # fmt: skip
    radix = V ** torch.arange(n_len - 1, -1, -1)
    counts = torch.bincount((x * radix).sum(-1), minlength=V**n_len).double()
    expected = 3000 * ell.exp()
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert chi2.sf(stat, V**n_len - 1) > 1e-3
