"""Schedules, paths, targets and the enumeration toy (MATH.md §0, §1, §6.2), checked against the formulas of
MATH.md written out independently here, by exact enumeration where possible and by sampling frequencies
(fixed seeds, ~5σ tolerances) where the code is a sampler."""

from __future__ import annotations

import itertools

import pytest
import torch

from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.paths import (
    CosineSchedule,
    LinearSchedule,
    LogLinearSchedule,
    MaskedPath,
    PolynomialSchedule,
    UniformPath,
    make_path,
    make_schedule,
)
from tcsm.targets import ConditionalTarget, DataTarget

F64 = torch.float64

SCHEDULES = {
    "linear": LinearSchedule(),
    "cosine": CosineSchedule(),
    "poly2": PolynomialSchedule(2.0),
    "poly0.5": PolynomialSchedule(0.5),
    "loglinear": LogLinearSchedule(),
}
INTERIOR = torch.linspace(0.02, 0.98, 49, dtype=F64)


# --- schedules --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_schedule_endpoints_and_monotonicity(name, dtype):
    """α_0 = 0, α_1 = 1 exactly, α increasing, 1 − α computed consistently (MATH.md §0)."""
    s = SCHEDULES[name]
    ends = torch.tensor([0.0, 1.0], dtype=dtype)
    assert s.alpha(ends).tolist() == [0.0, 1.0]
    assert s.one_minus_alpha(ends).tolist() == [1.0, 0.0]
    a = s.alpha(INTERIOR.to(dtype))
    assert a.dtype == dtype and (torch.diff(a) > 0).all()
    torch.testing.assert_close(s.one_minus_alpha(INTERIOR), 1.0 - s.alpha(INTERIOR))


@pytest.mark.parametrize("name", SCHEDULES)
def test_one_minus_alpha_accurate_near_clean_end(name):
    """1 − α_t is computed without cancellation: (1 − α_{1−δ})/δ → α̇_1 for δ down to 1e-12 (float64)."""
    s = SCHEDULES[name]
    t = 1.0 - torch.tensor([1e-6, 1e-9, 1e-12], dtype=F64)
    delta = 1.0 - t  # exact in floating point (Sterbenz)
    torch.testing.assert_close(
        s.one_minus_alpha(t) / delta, s.alpha_dot(torch.ones(3, dtype=F64)), rtol=1e-5, atol=0
    )


@pytest.mark.parametrize("name", SCHEDULES)
def test_schedule_derivatives_match_finite_differences(name):
    """α̇_t and dσ/dt = κ_t = α̇_t/(1 − α_t) against central differences (MATH.md §0)."""
    s = SCHEDULES[name]
    h = 1e-6
    fd_alpha = (s.alpha(INTERIOR + h) - s.alpha(INTERIOR - h)) / (2 * h)
    torch.testing.assert_close(s.alpha_dot(INTERIOR), fd_alpha, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(
        s.kappa(INTERIOR), s.alpha_dot(INTERIOR) / (1 - s.alpha(INTERIOR)), rtol=1e-12, atol=0
    )
    fd_sigma = (s.sigma(INTERIOR + h) - s.sigma(INTERIOR - h)) / (2 * h)
    torch.testing.assert_close(s.kappa(INTERIOR), fd_sigma, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_kappa_finite_at_both_ends(name, dtype):
    """κ_t is returned finite and non-negative at t = 0 and t = 1 (it diverges only in the limit t → 1)."""
    k = SCHEDULES[name].kappa(torch.tensor([0.0, 1.0], dtype=dtype))
    assert k.isfinite().all() and (k >= 0).all()
    assert k[1] > 1e10  # the t = 1 end is the floored divergence, not a silent 0


def test_linear_and_loglinear_closed_forms():
    """Linear: κ_t = 1/(1 − t). Log-linear with ε: α_t = 1 − (1 − ε)(1 − t), α_0 = ε = alpha_min (MATH.md §0)."""
    t = INTERIOR
    torch.testing.assert_close(LinearSchedule().kappa(t), 1 / (1 - t))
    torch.testing.assert_close(LogLinearSchedule().alpha(t), t)
    clipped = LogLinearSchedule(1e-3)
    assert clipped.alpha_min == 1e-3
    assert clipped.alpha(torch.zeros(1, dtype=F64)).item() == pytest.approx(1e-3, abs=1e-15)
    torch.testing.assert_close(clipped.kappa(t), 1 / (1 - t))


def test_cosine_is_md4s_schedule_and_its_docstring_says_how_it_corrupts():
    """α_t = 1 − cos(πt/2) is MD4's cosine (1 − cos(π(1 − u)/2) in MD4's time u = 1 − t), not MDLM's CosineNoise
    (α = cos(πu/2), i.e. sin(πt/2) here). Leaving the clean end it corrupts π/2 × faster than linear; the
    docstring must say so (it once claimed the opposite)."""
    import math

    s, t = CosineSchedule(), INTERIOR
    u = 1 - t  # MD4's and MDLM's time: u = 0 is clean
    torch.testing.assert_close(s.alpha(t), 1 - torch.cos(math.pi * (1 - u) / 2))
    assert not torch.allclose(s.alpha(t), torch.cos(math.pi * u / 2))  # not MDLM's CosineNoise
    ends = torch.tensor([0.0, 1.0], dtype=F64)
    torch.testing.assert_close(s.alpha_dot(ends), torch.tensor([0.0, math.pi / 2], dtype=F64))
    # 1 − α near t = 1 (the fraction a step back from clean corrupts) is π/2 × linear's
    delta = torch.tensor([1e-3, 1e-6], dtype=F64)
    ratio = s.one_minus_alpha(1 - delta) / LinearSchedule().one_minus_alpha(1 - delta)
    torch.testing.assert_close(ratio, torch.full_like(ratio, math.pi / 2), rtol=1e-6, atol=0)
    doc = " ".join(CosineSchedule.__doc__.split())
    assert "MD4" in doc and "faster than linear" in doc and "slower corruption near the clean end" not in doc
    assert "CosineNoise" in doc


def test_schedule_errors():
    """Bad names and parameters raise ValueError."""
    with pytest.raises(ValueError, match="unknown schedule"):
        make_schedule("nope")
    with pytest.raises(ValueError):
        PolynomialSchedule(0.0)
    with pytest.raises(ValueError):
        LogLinearSchedule(1.0)
    assert isinstance(make_schedule("polynomial", exponent=3.0), PolynomialSchedule)


# --- kernels and transition matrices written from MATH.md §1.1 -----------------------------------------


def kernel_matrix(path, t):
    """K[x, y] = k_t(x | y), x over the noisy alphabet, y over clean tokens (MATH.md §1.1)."""
    V, a = path.vocab_size, float(path.alpha(torch.tensor(t, dtype=F64)))
    if path.kind == "masked":
        K = torch.zeros(V + 1, V, dtype=F64)
        K[torch.arange(V), torch.arange(V)] = a
        K[V, :] = 1 - a
        return K
    return a * torch.eye(V, dtype=F64) + (1 - a) / V


def chain_matrix(path, s, t):
    """T[x, y] = p(x_t = x | x_s = y) for s ≥ t, both over the noisy alphabet (MATH.md §1.1)."""
    V = path.vocab_size
    a_s, a_t = (float(path.alpha(torch.tensor(v, dtype=F64))) for v in (s, t))
    r = a_t / a_s if a_s > 0 else 0.0
    if path.kind == "masked":
        T = torch.zeros(V + 1, V + 1, dtype=F64)
        T[torch.arange(V), torch.arange(V)] = r
        T[V, :V] = 1 - r
        T[V, V] = 1.0
        return T
    return r * torch.eye(V, dtype=F64) + (1 - r) / V


PATHS = {
    "masked": lambda V: MaskedPath(V),
    "uniform": lambda V: UniformPath(V),
    "masked-cos": lambda V: MaskedPath(V, CosineSchedule()),
    "uniform-poly": lambda V: UniformPath(V, PolynomialSchedule(2.0)),
}


@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize("t", [0.0, 0.3, 0.8, 1.0])
def test_log_kernel_matches_formula(name, t):
    """path.log_kernel(x_t, t)[.., y] = log k_t(x_t | y) (MATH.md §1.1), and each k_t(· | y) sums to 1."""
    V = 3
    path = PATHS[name](V)
    xs = torch.arange(path.num_states).unsqueeze(1)  # every noisy symbol, L = 1
    lk = path.log_kernel(xs, torch.full((path.num_states,), t, dtype=F64))[:, 0, :]
    K = kernel_matrix(path, t)
    torch.testing.assert_close(lk.exp(), K)
    torch.testing.assert_close(K.sum(0), torch.ones(V, dtype=F64))


@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize("s,t", [(0.9, 0.4), (1.0, 0.5), (0.5, 0.0), (0.7, 0.7)])
def test_noising_chain_composes_exactly(name, s, t):
    """p_{t|1} = Σ_{x_s} p(x_t | x_s) p_{s|1}(x_s | x_1), i.e. K(t) = T_{s→t} K(s) (MATH.md §1.1)."""
    path = PATHS[name](4)
    torch.testing.assert_close(chain_matrix(path, s, t) @ kernel_matrix(path, s), kernel_matrix(path, t))


def _frequencies(x, num_states):
    return torch.nn.functional.one_hot(x.flatten(), num_states).double().mean(0)


def _assert_frequencies(freq, p, n):
    sigma = torch.sqrt(p * (1 - p) / n).clamp_min(1e-12)
    assert ((freq - p).abs() <= 5 * sigma + 1e-12).all(), (freq, p)


@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize("t", [0.2, 0.65])
def test_sample_frequencies_match_kernel(name, t):
    """x_t ~ path.draw_xt(x_1, t) has per-token frequencies k_t(· | x_1) (MATH.md §1.1); fixed seed, 5σ bounds."""
    V, n = 4, 20000
    path = PATHS[name](V)
    g = torch.Generator().manual_seed(0)
    K = kernel_matrix(path, t)
    for y in range(V):
        x1 = torch.full((n // 10, 10), y)
        xt = path.draw_xt(x1, torch.full((n // 10,), t), g)
        _assert_frequencies(_frequencies(xt, path.num_states), K[:, y], n)


@pytest.mark.parametrize("name", PATHS)
def test_noise_samples_the_chain_and_composes_statistically(name):
    """path.noise(x_s, s, t) draws from T_{s→t}(· | x_s) for every noisy x_s, and noising a sample of p_{s|1} gives
    the frequencies of p_{t|1} (MATH.md §1.1)."""
    V, n, s, t = 3, 20000, 0.8, 0.3
    path = PATHS[name](V)
    g = torch.Generator().manual_seed(1)
    T = chain_matrix(path, s, t)
    sv, tv = torch.full((n // 10,), s), torch.full((n // 10,), t)
    for y in range(path.num_states):
        xs = torch.full((n // 10, 10), y)
        _assert_frequencies(_frequencies(path.noise(xs, sv, tv, g), path.num_states), T[:, y], n)
    x1 = torch.full((n // 10, 10), 1)
    xt = path.noise(path.draw_xt(x1, sv, g), sv, tv, g)
    _assert_frequencies(_frequencies(xt, path.num_states), kernel_matrix(path, t)[:, 1], n)


@pytest.mark.parametrize("name", PATHS)
@pytest.mark.parametrize("t,s", [(0.3, 0.6), (0.0, 0.5), (0.5, 1.0), (0.2, 0.2001)])
def test_bridge_is_the_exact_posterior_of_the_chain(name, t, s):
    """MATH.md §6.2: bridge(x_t, t, s, m) = p(x_s = y | x_t) = Σ_a p(a | x_t) p(y | x_t, a) for the chain
    a → x_s ~ k_s(· | a) → x_t ~ T_{s→t}(· | x_s), computed by enumerating (a, x_s, x_t) under a random prior on a,
    with m(a) = p(a | x_t) the exact posterior."""
    V = 3
    path = PATHS[name](V)
    prior = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    joint = prior[:, None, None] * kernel_matrix(path, s).T[:, :, None] * chain_matrix(path, s, t).T[None]
    # joint[a, y, x] = π(a) k_s(y | a) T(x | y)
    p_x = joint.sum((0, 1))
    xs = torch.nonzero(p_x > 0).flatten()
    post_a = joint.sum(1)[:, xs] / p_x[xs]  # [a, x]
    exact = joint.sum(0)[:, xs] / p_x[xs]  # [y, x]
    xt = xs.unsqueeze(1)
    out = path.bridge(
        xt, torch.full((len(xs),), t, dtype=F64), torch.full((len(xs),), s, dtype=F64), post_a.T[:, None]
    )
    torch.testing.assert_close(out[:, 0, :], exact.T, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(out.sum(-1), torch.ones(len(xs), 1, dtype=F64))


def test_masked_helpers_and_loss_mask():
    """Masked: mask id V, all-mask prior, loss positions = masked, λ_{t→s} = (α_s − α_t)/(1 − α_t) (MATH.md §0)."""
    path = MaskedPath(5, CosineSchedule())
    assert path.mask_id == 5 and path.num_states == 6
    assert (path.prior_sample(2, 3) == 5).all()
    xt = torch.tensor([[0, 5, 4, 5]])
    assert path.loss_mask(xt).tolist() == [[False, True, False, True]]
    t, s = torch.tensor([0.3], dtype=F64), torch.tensor([0.7], dtype=F64)
    a_t, a_s = path.alpha(t), path.alpha(s)
    torch.testing.assert_close(path.reveal_prob(t, s), (a_s - a_t) / (1 - a_t))


def test_uniform_helpers_and_loss_mask():
    """Uniform: b_t = Vα/(1 − α), c_t = α̇/(Vα), every position is a loss position, prior in range (MATH.md §0, §1.2)."""
    V = 7
    path = UniformPath(V, PolynomialSchedule(2.0))
    t = torch.tensor([0.25, 0.5], dtype=F64)
    a = t**2
    torch.testing.assert_close(path.boost(t), V * a / (1 - a))
    torch.testing.assert_close(path.reversal_rate(t), 2 * t / (V * a))
    assert path.loss_mask(torch.zeros(2, 3, dtype=torch.long)).all()
    x0 = path.prior_sample(50, 4, generator=torch.Generator().manual_seed(0))
    assert x0.min() >= 0 and x0.max() < V
    assert path.mask_id is None and path.num_states == V


@pytest.mark.parametrize("kind", ["masked", "uniform"])
def test_corruption_law_matches_the_kernel(kind):
    """§1.1: corrupt_prob(t) = 1 − k_t(x_1 | x_1), and corrupt() draws from k_t(· | x_1, x_t ≠ x_1)."""
    V, n = 4, 40_000
    path = make_path(kind, V, "cosine")
    t = torch.tensor([0.2, 0.9], dtype=F64)
    x1 = torch.tensor([[1], [3]])
    keep = path.log_kernel(x1, t).exp().gather(-1, x1.unsqueeze(-1)).reshape(2)
    torch.testing.assert_close(path.corrupt_prob(t), 1 - keep)
    x = x1.expand(2, n)
    draws = path.corrupt(x, t, torch.Generator().manual_seed(0))
    for row in range(2):
        k = path.log_kernel(torch.arange(path.num_states)[None], t[row : row + 1]).exp()[0, :, x1[row, 0]]
        k[x1[row, 0]] = 0.0
        freq = torch.bincount(draws[row], minlength=path.num_states).double() / n
        assert ((freq - k / k.sum()).abs() < 0.015).all(), (kind, freq, k / k.sum())


def test_source_flags():
    """§1.3, §2.2, §6.2: only the masked posterior ignores t; it is absorbing and its bound vanishes at x_t = x_1."""
    m, u = MaskedPath(3), UniformPath(3)
    assert (m.posterior_depends_on_t, m.absorbing, m.integrand_zero_at_x1) == (False, True, True)
    assert (u.posterior_depends_on_t, u.absorbing, u.integrand_zero_at_x1) == (True, False, False)
    assert m.bounds == ("masked",) and u.bounds == ("reversal", "dfm")
    xt = torch.tensor([[0, 3, 2]])
    assert m.free(xt).tolist() == [[False, True, False]] and u.free(xt.clamp_max(2)).all()


def test_make_path():
    """make_path builds by source name and schedule name; unknown sources raise ValueError."""
    p = make_path("uniform", 4, "polynomial", exponent=3.0)
    assert (
        isinstance(p, UniformPath)
        and isinstance(p.schedule, PolynomialSchedule)
        and p.schedule.exponent == 3.0
    )
    assert isinstance(make_path("masked", 4).schedule, LinearSchedule)
    with pytest.raises(ValueError, match="unknown source"):
        make_path("gaussian", 4)
    with pytest.raises(ValueError):
        MaskedPath(1)


# --- posterior, target conditionals and the toy (MATH.md §1.3) ------------------------------------------


def _noisy_states(path, L):
    return torch.tensor(list(itertools.product(range(path.num_states), repeat=L)), dtype=torch.long)


def _exact_joint(toy, path, t):
    """p(x_1, x_t) = p_1(x_1) Π_i k_t(x_t^i | x_1^i) from the formula matrices: [N_t, N_1]."""
    K = kernel_matrix(path, t)
    xts = _noisy_states(path, toy.length)
    per_token = K[xts[:, None, :], toy.states[None, :, :]]  # [Nt, N1, L]
    return xts, toy.probs[None, :] * per_token.prod(-1)


TOYS = [(2, 3, None), (3, 2, None), (4, 2, None), (3, 3, 0.5)]  # (V, L, support fraction)


@pytest.mark.parametrize("kind", ["masked", "uniform"])
@pytest.mark.parametrize("V,L,support", TOYS)
def test_toy_posterior_and_marginals_match_enumeration(kind, V, L, support):
    """toy.log_posterior = p_1(x_1) p_{t|1}(x_t | x_1) / p_t(x_t) and toy.marginals its per-token marginals
    (MATH.md §1.3), for every x_t with p_t(x_t) > 0."""
    toy = EnumerableDistribution.random(V, L, seed=V + L, support=support)
    path = make_path(kind, V)
    for t in (0.25, 0.7):
        xts, joint = _exact_joint(toy, path, t)
        keep = joint.sum(1) > 0
        xts, joint = xts[keep], joint[keep]
        post = joint / joint.sum(1, keepdim=True)
        tt = torch.full((len(xts),), t, dtype=F64)
        torch.testing.assert_close(toy.log_posterior(xts, tt, path).exp(), post)
        onehot = torch.nn.functional.one_hot(toy.states, V).double()
        torch.testing.assert_close(toy.marginals(xts, tt, path), torch.einsum("bn,nlv->blv", post, onehot))


@pytest.mark.parametrize("kind", ["masked", "uniform"])
@pytest.mark.parametrize("V,L,support", TOYS)
def test_target_conditional_is_the_exact_single_site_posterior(kind, V, L, support):
    """MATH.md §1.3 (oracle vii.a, vii.b): exp(path.target_conditional(toy.conditionals(x_1), x_t, t))[i, y] =
    p_{1|t}(x_1^i = y | x_1^{≠i}, x_t), enumerated from the joint, for every (x_1, x_t) with positive probability;
    at unmasked positions of the masked source it is δ_{x_t^i}."""
    toy = EnumerableDistribution.random(V, L, seed=2 * V + L, support=support)
    path = make_path(kind, V)
    radix = V ** torch.arange(L - 1, -1, -1)
    for t in (0.15, 0.6, 0.95):
        xts, joint = _exact_joint(toy, path, t)
        it, i1 = torch.nonzero(joint > 0, as_tuple=True)
        xt, x1 = xts[it], toy.states[i1]
        tt = torch.full((len(it),), t, dtype=F64)
        got = path.target_conditional(toy.conditionals(x1), xt, tt).exp()
        # Exact: swap position i of x_1 for every y and read the joint p(x_1', x_t).
        for i in range(L):
            swapped = x1.unsqueeze(1).repeat(1, V, 1)
            swapped[:, :, i] = torch.arange(V)
            weights = joint[it[:, None], (swapped * radix).sum(-1)]  # [B, V]
            exact = weights / weights.sum(-1, keepdim=True)
            torch.testing.assert_close(got[:, i, :], exact, rtol=1e-9, atol=1e-12)
        if kind == "masked":
            carried = xt != V
            torch.testing.assert_close(got[carried], torch.nn.functional.one_hot(xt[carried], V).double())


@pytest.mark.parametrize("V,L", [(3, 2), (2, 3)])
def test_toy_conditionals_and_sampling(V, L):
    """toy.conditionals(x)[i, y] = p_1([y, x^{≠i}]) / Σ_y' p_1([y', x^{≠i}]); toy.sample has frequencies p_1."""
    toy = EnumerableDistribution.random(V, L, seed=5)
    cond = toy.conditionals(toy.states).exp()
    for i in range(L):
        for n, x in enumerate(toy.states):
            rows = x.repeat(V, 1)
            rows[:, i] = torch.arange(V)
            p = toy.probs[toy.index(rows)]
            torch.testing.assert_close(cond[n, i], p / p.sum())
    n = 40000
    x = toy.sample(n, torch.Generator().manual_seed(0))
    freq = torch.bincount(toy.index(x), minlength=len(toy.probs)).double() / n
    _assert_frequencies(freq, toy.probs, n)
    assert toy.entropy() == pytest.approx(-(toy.probs * toy.probs.log()).sum().item())


# --- targets --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["masked", "uniform"])
def test_data_and_conditional_targets_build_consistent_batches(kind):
    """DataTarget: x_t = path.draw_xt(x_1, t) with the same generator, Monte Carlo target (no log_q);
    ConditionalTarget: the same x_t plus log q = path.target_conditional(log_p1_cond(x_1), x_t, t)."""
    V, B, L = 3, 5, 2
    path = make_path(kind, V)
    toy = EnumerableDistribution.random(V, L, seed=1)
    x1 = toy.sample(B, torch.Generator().manual_seed(0))
    t = torch.rand(B, generator=torch.Generator().manual_seed(1))
    data = DataTarget()(x1, t, path, torch.Generator().manual_seed(2))
    expect_xt = path.draw_xt(x1, t, torch.Generator().manual_seed(2))
    assert torch.equal(data.xt, expect_xt) and torch.equal(data.x1, x1) and data.log_q is None
    assert torch.equal(data.loss_mask, path.loss_mask(expect_xt)) and not data.explicit
    cond = ConditionalTarget(toy.conditionals)(x1, t, path, torch.Generator().manual_seed(2))
    assert torch.equal(cond.xt, expect_xt) and cond.explicit
    torch.testing.assert_close(
        cond.log_q, path.target_conditional(toy.conditionals(x1), expect_xt, t)
    )
    w = torch.arange(B, dtype=torch.float32)
    torch.testing.assert_close(data.with_weight(w).with_weight(w).weight, w * w)
