"""Likelihood bounds (MATH.md §2) checked by exact enumeration on tiny state spaces.

Two oracles back these tests:
* `exact_bound`: the bound with E_{x_t} done by enumerating every x_t and the t-integral by Gauss–Legendre
  quadrature (in t on [0, 1/2], in w = −log(1 − t) on [log 2, 30], where the t → 1 end is smooth);
* `model_nll`: −log p^θ_1(x_1) of the model CTMC itself, from the Kolmogorov forward equation solved with
  midpoint matrix exponentials over every state (the quantity each bound must dominate, MATH.md §2.1).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from tcsm.core.results import bits_per_token, bpc, perplexity
from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.evaluation.likelihood import evaluate_bound, nelbo, nelbo_terms
from tcsm.paths import (
    CosineSchedule,
    LinearSchedule,
    LogLinearSchedule,
    MaskedPath,
    PolynomialSchedule,
    UniformPath,
)
from tcsm.paths.bounds import BOUNDS, default_bound, nelbo_integrand, prior_term, resolve_bound

W_MAX = 30.0  # t = 1 − e^{-30}: the bound's integrand beyond it is O(30 e^{-30})


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """These tensors are tiny: intra-op threads only add overhead (and contend on a shared 2-core machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- oracles ----------------------------------------------------------------------------------------


def _quadrature(n_t=40, n_w=80):
    """Nodes and weights for ∫_0^1 f(t) dt: Gauss–Legendre on [0, 1/2] in t and on [log 2, W_MAX] in
    w = −log(1 − t), dt = e^{-w} dw (the integrands grow like log(1/(1 − t)) at the clean end)."""
    x, w = np.polynomial.legendre.leggauss(n_t)
    t1, q1 = 0.25 * (x + 1.0), 0.25 * w
    x, w = np.polynomial.legendre.leggauss(n_w)
    lo, hi = math.log(2.0), W_MAX
    ww = lo + 0.5 * (hi - lo) * (x + 1.0)
    t2, q2 = -np.expm1(-ww), 0.5 * (hi - lo) * w * np.exp(-ww)
    return torch.tensor(np.concatenate([t1, t2])), torch.tensor(np.concatenate([q1, q2]))


def _noisy_states(path, L):
    return torch.tensor(list(itertools.product(range(path.num_states), repeat=L)), dtype=torch.long)


def exact_bound(denoiser, x1, path, bound=None, n_t=40, n_w=80):
    """∫_0^1 Σ_{x_t} p_{t|1}(x_t|x_1) w(t) G(t, x_t) dt per sequence [B], by enumeration and quadrature."""
    L = x1.shape[1]
    tq, wq = _quadrature(n_t, n_w)
    S = _noisy_states(path, L)
    T, N = tq.numel(), S.shape[0]
    xt = S.repeat(T, 1)
    tt = tq.repeat_interleave(N)
    logits = denoiser(xt, tt)
    lk = path.log_kernel(xt, tt).double()  # [T N, L, V]
    out = []
    for z in x1:
        zz = z.expand(T * N, L)
        logw = lk.gather(-1, zz.unsqueeze(-1)).squeeze(-1).sum(-1)
        integrand = nelbo_integrand(logits, zz, xt, tt, path, bound)
        contrib = torch.where(logw > -torch.inf, logw.exp() * integrand, torch.zeros_like(integrand))
        out.append((contrib.reshape(T, N).sum(1) * wq).sum())
    return torch.stack(out)


def _rate_tensor(m, S, path, bound, t):
    """Off-diagonal model rates [K, N, L, V] for the jump x → [y, x^{≠i}] (MATH.md §1.2)."""
    V = path.vocab_size
    sched = path.schedule
    a, oma, adot = sched.alpha(t), sched.one_minus_alpha(t), sched.alpha_dot(t)
    a, oma, adot = (v.reshape(-1, 1, 1, 1) for v in (a, oma, adot))
    cur = S.unsqueeze(0).unsqueeze(-1)  # [1, N, L, 1]
    ys = torch.arange(V)
    if bound == "masked":
        return torch.where(cur == path.mask_id, adot / oma * m, torch.zeros_like(m))
    if bound == "dfm":
        return torch.where(ys == cur, torch.zeros_like(m), adot / oma * m)
    b = V * a / oma
    m_x = m.gather(-1, cur.expand(m.shape[0], -1, -1, -1))
    s_hat = 1.0 + b * m - b / (1.0 + b) * m_x
    return torch.where(ys == cur, torch.zeros_like(m), adot / (V * a) * s_hat)


def model_nll(denoiser, x1, path, bound=None, n_v=100, n_w=200, t0=1e-7):
    """`_model_nll_grid` at two resolutions, Richardson-extrapolated (the midpoint scheme is second order)."""
    coarse = _model_nll_grid(denoiser, x1, path, bound, n_v, n_w, t0)
    fine = _model_nll_grid(denoiser, x1, path, bound, 2 * n_v, 2 * n_w, t0)
    return (4.0 * fine - coarse) / 3.0


def _model_nll_grid(denoiser, x1, path, bound, n_v, n_w, t0):
    """Exact −log p^θ_1(x_1) of the model CTMC that `bound` belongs to (masked / DFM Euler rates /
    time-reversal rates), started from p_0, by P ← P exp(∫Q dt) with midpoint generators on a grid in
    log t (near the source end, where c_t ~ 1/t) and in w = −log(1 − t) (near the clean end, where κ_t ~ e^w)."""
    bound = resolve_bound(path, bound)
    V, L = path.vocab_size, x1.shape[1]
    S = _noisy_states(path, L)
    N, ns = S.shape[0], path.num_states
    radix = ns ** torch.arange(L - 1, -1, -1)
    # Grid: midpoints and the ∫ dt each one stands for.
    v = torch.linspace(math.log(t0), math.log(0.5), n_v + 1, dtype=torch.float64)
    vm = 0.5 * (v[1:] + v[:-1])
    w = torch.linspace(math.log(2.0), W_MAX, n_w + 1, dtype=torch.float64)
    wm = 0.5 * (w[1:] + w[:-1])
    t_mid = torch.cat([vm.exp(), -torch.expm1(-wm)])
    dt = torch.cat([vm.exp() * (v[1:] - v[:-1]), torch.exp(-wm) * (w[1:] - w[:-1])])
    K = t_mid.numel()
    m = torch.softmax(denoiser(S.repeat(K, 1), t_mid.repeat_interleave(N)).double(), -1).reshape(K, N, L, V)
    rates = _rate_tensor(m, S, path, bound, t_mid)
    # Target state index of each (n, i, y) jump.
    base = (S * radix).sum(-1)  # [N]
    tgt = base.reshape(N, 1, 1) + (torch.arange(V).reshape(1, 1, V) - S.unsqueeze(-1)) * radix.reshape(
        1, L, 1
    )
    Q = torch.zeros(K, N, N, dtype=torch.float64)
    Q.scatter_add_(2, tgt.reshape(1, N, L * V).expand(K, -1, -1), rates.reshape(K, N, L * V))
    Q = Q - torch.diag_embed(Q.sum(-1))
    E = torch.linalg.matrix_exp(Q * dt.reshape(K, 1, 1))
    if path.kind == "masked":
        p = torch.zeros(N, dtype=torch.float64)
        p[-1] = 1.0  # all-mask is the last state in radix order
    else:
        p = torch.full((N,), 1.0 / N, dtype=torch.float64)
    for k in range(K):
        p = p @ E[k]
    return -torch.log(p[(x1 * radix).sum(-1)])


def _mixed_denoiser(d, path, weight=0.4, seed=3, t_slope=0.0):
    """Perturbation for the masked source: marginals mixed with a fixed random distribution, with mixing weight
    weight·(1 + t_slope·t) (t_slope = 0: t-independent)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(d.length, d.vocab_size, generator=g, dtype=torch.float64) + 0.1
    u = u / u.sum(-1, keepdim=True)

    def fn(xt, t):
        w = (weight * (1.0 + t_slope * t.double())).reshape(-1, 1, 1)
        return torch.log((1 - w) * d.marginals(xt, t, path) + w * u)

    return fn


def _tilted_denoiser(d, path, scale=0.8, temperature=1.3, seed=4):
    """Perturbation for the uniform source that keeps the t → 1 sharpening (so the bounds stay finite):
    tempered log-marginals plus a fixed bounded per-(position, token) tilt."""
    g = torch.Generator().manual_seed(seed)
    tilt = scale * torch.randn(d.length, d.vocab_size, generator=g, dtype=torch.float64)
    exact = d.denoiser(path)

    def fn(xt, t):
        return temperature * exact(xt, t) + tilt

    return fn


CASES = [(2, 3, 0), (3, 2, 1), (4, 2, 2)]


# --- tightness and validity, exact ------------------------------------------------------------------


@pytest.mark.parametrize("V,L,seed", CASES)
@pytest.mark.parametrize("kind,bound", [("masked", "masked"), ("uniform", "reversal")])
def test_bound_is_tight_at_exact_posterior_by_quadrature(V, L, seed, kind, bound):
    """[oracle iv.a, iv.f] masked bound (§2.2) and time-reversal bound (§2.3 B) equal −log p_1(x_1) per sequence
    when the denoiser returns the exact posterior marginals (enumerated x_t, quadrature in t and w)."""
    d = EnumerableDistribution.random(V, L, seed=seed)
    path = MaskedPath(V) if kind == "masked" else UniformPath(V)
    x1 = d.states
    value = exact_bound(d.denoiser(path), x1, path, bound)
    torch.testing.assert_close(value, -d.log_prob(x1), atol=2e-6, rtol=1e-6)


@pytest.mark.parametrize("V,L,seed", CASES[:2])
def test_dfm_bound_is_valid_but_loose_at_exact_posterior(V, L, seed):
    """[oracle iv.e] §2.3 A ≥ −log p_1(x_1) per sequence at the exact posterior (whose DFM chain generates p_1),
    and strictly looser than §2.3 B: the mean gap is a few tenths of a bit per token at V = 2..3 (§8 item 10)."""
    d = EnumerableDistribution.random(V, L, seed=seed)
    path = UniformPath(V)
    x1 = d.states
    nll = -d.log_prob(x1)
    dfm = exact_bound(d.denoiser(path), x1, path, "dfm")
    rev = exact_bound(d.denoiser(path), x1, path, "reversal")
    assert (dfm >= nll + 1e-3).all()
    assert (dfm > rev + 1e-3).all()
    gap_bits = float((d.probs * (dfm - rev)).sum()) / (L * math.log(2))
    assert 0.15 < gap_bits < 0.5, gap_bits  # 0.21 (V=2, L=3) and 0.40 (V=3, L=2) here


@pytest.mark.parametrize(
    "kind,bound,V,L",
    [
        ("masked", "masked", 3, 2),
        ("uniform", "reversal", 3, 2),
        ("uniform", "dfm", 3, 2),
        ("masked", "masked", 2, 3),
    ],
)
def test_bound_dominates_model_nll_by_ctmc(kind, bound, V, L):
    """[oracle iv.b, iv.c, iv.g, iv.h] KL(P^{x_1} ‖ P^θ) ≥ −log p^θ_1(x_1) (§2.1) per sequence, with p^θ_1 from
    solving the model CTMC exactly; at the exact posterior that CTMC ends at p_1 [oracle iv.d, iv.i]."""
    d = EnumerableDistribution.random(V, L, seed=7)
    path = MaskedPath(V) if kind == "masked" else UniformPath(V)
    x1 = d.states
    exact = d.denoiser(path)
    # The CTMC oracle is accurate to ~1e-5 (Richardson-extrapolated midpoint exponentials).
    torch.testing.assert_close(model_nll(exact, x1, path, bound), -d.log_prob(x1), atol=1e-4, rtol=0)
    # A t-dependent perturbation for the masked source (a t-independent one leaves gaps of only ~1e-5).
    pert = _mixed_denoiser(d, path, t_slope=-0.9) if kind == "masked" else _tilted_denoiser(d, path)
    nll = model_nll(pert, x1, path, bound)
    value = exact_bound(pert, x1, path, bound)
    assert (value >= nll + 1e-4).all(), value - nll
    # On average over p_1 the bound also dominates the data entropy (Gibbs).
    assert float((d.probs * value).sum()) > d.entropy()


def test_masked_bound_does_not_depend_on_schedule():
    """[oracle iv.j] the masked bound is ∫ E[...] dσ (§2.2): linear, cosine and polynomial schedules give the
    same value for a t-independent (perturbed) denoiser, exactly and within Monte Carlo error."""
    d = EnumerableDistribution.random(3, 2, seed=5)
    x1 = d.states[[0, 4, 7]]
    values, mc = [], []
    for sched in (LinearSchedule(), CosineSchedule(), PolynomialSchedule(2.0), PolynomialSchedule(0.5)):
        path = MaskedPath(3, sched)
        den = _mixed_denoiser(d, path)
        # κ ~ t^{-1/2} at t → 0 for exponent 1/2 defeats the quadrature; Monte Carlo only there.
        if not isinstance(sched, PolynomialSchedule) or sched.exponent >= 1:
            values.append(exact_bound(den, x1, path))
        terms = nelbo_terms(
            den, x1, path, num_t=4000, generator=torch.Generator().manual_seed(0), chunk_size=4096
        )
        mc.append((terms.mean(0), terms.std(0) / math.sqrt(terms.shape[0])))
    for v in values[1:]:
        torch.testing.assert_close(v, values[0], atol=1e-6, rtol=1e-6)
    for est, se in mc:
        assert ((est - values[0]).abs() <= 4 * se + 1e-3).all(), (est - values[0], se)


# --- Monte Carlo estimator ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kind,bound,sched",
    [
        ("masked", None, LinearSchedule()),
        ("masked", None, CosineSchedule()),
        ("uniform", None, LinearSchedule()),
        ("uniform", "reversal", PolynomialSchedule(2.0)),
    ],
)
def test_nelbo_is_tight_within_monte_carlo_error(kind, bound, sched):
    """[oracle iv.a, iv.f] with the exact posterior, `nelbo` (stratified t, x_t ~ p_{t|1}) estimates −log p_1(x_1)
    without bias: |estimate − NLL| ≤ 4 standard errors (row-to-row spread of the strata, a conservative se)."""
    V, L = 3, 2
    d = EnumerableDistribution.random(V, L, seed=11)
    path = MaskedPath(V, sched) if kind == "masked" else UniformPath(V, sched)
    x1 = d.states[[0, 3, 5, 8]]
    terms = nelbo_terms(
        d.denoiser(path),
        x1,
        path,
        num_t=3000,
        generator=torch.Generator().manual_seed(1),
        bound=bound,
        chunk_size=8192,
    )
    est, se = terms.mean(0), terms.std(0) / math.sqrt(terms.shape[0])
    nll = -d.log_prob(x1)
    assert (se < 0.15).all(), se
    assert ((est - nll).abs() <= 4 * se).all(), (est - nll) / se


@pytest.mark.parametrize("kind", ["masked", "uniform"])
def test_weighted_xt_sampler_reproduces_the_kernel(kind):
    """§1.1: the event-split x_t draw of `nelbo_terms` (weights P(E)/q, P(not E)/(1 − q)) has weighted law
    exactly p_{t|1}(·|x_1) = Π_i k_t(x_t^i | x_1^i), also near t = 1 where corruption is rare."""
    from tcsm.evaluation.likelihood import _sample_xt

    V, L, n = 3, 3, 100_000
    path = MaskedPath(V) if kind == "masked" else UniformPath(V)
    x1 = torch.tensor([[0, 2, 1]])
    S = _noisy_states(path, L)
    radix = path.num_states ** torch.arange(L - 1, -1, -1)
    g = torch.Generator().manual_seed(0)
    for t in (0.05, 0.5, 0.97, 1 - 1e-6):
        tt = torch.full((n,), t, dtype=torch.float64)
        xt, w = _sample_xt(x1.expand(n, L), tt, path, g)
        est = torch.zeros(S.shape[0], dtype=torch.float64).index_add_(0, (xt * radix).sum(-1), w) / n
        exact = path.log_kernel(S, tt[: S.shape[0]].expand(S.shape[0])).double()
        exact = exact.gather(-1, x1.expand(S.shape[0], L).unsqueeze(-1)).squeeze(-1).sum(-1).exp()
        if kind == "masked":
            # q = 1: the unmasked x_t = x_1 (where G = 0) is never drawn, so it carries no mass.
            exact[(x1 * radix).sum(-1)] = 0.0
        assert float(est.sum()) == pytest.approx(float(exact.sum()), abs=0.01)
        # Binomial-scale tolerance per state (weights are ≤ 2).
        assert ((est - exact).abs() <= 5 * (2 * exact / n).sqrt() + 1e-9).all(), (t, est - exact)


def test_nelbo_dfm_exceeds_nll_in_monte_carlo():
    """[oracle iv.e] the Monte Carlo DFM bound sits above −log p_1 by far more than its standard error."""
    d = EnumerableDistribution.random(2, 3, seed=0)
    path = UniformPath(2)
    x1 = d.states[[1, 6]]
    terms = nelbo_terms(
        d.denoiser(path),
        x1,
        path,
        num_t=4000,
        generator=torch.Generator().manual_seed(2),
        bound="dfm",
        chunk_size=8192,
    )
    est, se = terms.mean(0), terms.std(0) / math.sqrt(terms.shape[0])
    assert ((est + d.log_prob(x1)) > 3 * se).all()


# --- unit tests --------------------------------------------------------------------------------------


def _random_logits_denoiser(V, scale=1.0, seed=0):
    def fn(xt, t):
        g = torch.Generator().manual_seed(seed)
        return scale * torch.randn(*xt.shape, V, generator=g)

    return fn


@pytest.mark.parametrize("kind,bound", [("masked", None), ("uniform", "reversal"), ("uniform", "dfm")])
def test_shape_dtype_and_finite_for_extreme_logits(kind, bound):
    V, L, B = 5, 7, 4
    path = MaskedPath(V) if kind == "masked" else UniformPath(V)
    x1 = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(0))
    for scale in (1.0, 1e4, 1e30):
        out = nelbo(
            _random_logits_denoiser(V, scale),
            x1,
            path,
            num_t=16,
            generator=torch.Generator().manual_seed(0),
            bound=bound,
        )
        assert out.shape == (B,) and out.dtype == torch.float64
        assert torch.isfinite(out).all() and (out >= 0).all()
    # The integrand itself at the ends of the sampled range, with saturated float32 logits.
    logits = torch.randn(B, L, V) * 1e30
    for t in (torch.finfo(torch.float32).tiny, 1.0 - 2.0**-24, 0.5):
        tt = torch.full((B,), t)
        xt = path.draw_xt(x1, tt.double(), torch.Generator().manual_seed(1))
        if kind == "masked":
            xt[:, 0] = path.mask_id  # make the masked sum non-empty
        val = nelbo_integrand(logits, x1, xt, tt, path, bound)
        assert torch.isfinite(val).all() and (val >= 0).all()


def test_times_never_reach_the_ends():
    """Sampled t stay in (0, 1) in float32, where the denoiser sees them."""
    seen = []

    def den(xt, t):
        seen.append(t.clone())
        return torch.zeros(*xt.shape, 2)

    nelbo(
        den,
        torch.zeros(3, 2, dtype=torch.long),
        UniformPath(2),
        num_t=2000,
        generator=torch.Generator(),
        chunk_size=1500,
    )
    t = torch.cat(seen)
    assert t.dtype == torch.float32 and (t > 0).all() and (t < 1).all() and t.numel() == 6000
    assert len(seen) == 4  # rows batched across strata, chunk_size at a time


def test_generator_reproducibility_and_chunking():
    d = EnumerableDistribution.random(3, 3, seed=2)
    path = UniformPath(3)
    x1 = d.sample(5, torch.Generator().manual_seed(0))

    def run(seed, chunk=None):
        gen = torch.Generator().manual_seed(seed)
        return nelbo(d.denoiser(path), x1, path, num_t=7, generator=gen, chunk_size=chunk)

    a = run(0)
    torch.testing.assert_close(run(0), a, rtol=0, atol=0)
    # The random draws do not depend on how rows are batched into denoiser calls.
    torch.testing.assert_close(run(0, chunk=3), a, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(run(0, chunk=1000), a, rtol=1e-12, atol=1e-12)
    assert not torch.equal(run(1), a)


def test_reversal_bound_is_sliced_without_changing_values(monkeypatch):
    """The [rows, L, V] float64 temporaries of §2.3 B are built in row slices (memory); values are unchanged."""
    import tcsm.paths.uniform as pt

    V, L = 5, 4
    path = UniformPath(V)
    x1 = torch.randint(0, V, (6, L), generator=torch.Generator().manual_seed(0))
    den = _random_logits_denoiser(V, 3.0)
    full = nelbo(den, x1, path, num_t=3, generator=torch.Generator().manual_seed(0))
    monkeypatch.setattr(pt, "_VDIM_BLOCK", 2 * L * V)
    torch.testing.assert_close(
        nelbo(den, x1, path, num_t=3, generator=torch.Generator().manual_seed(0)), full
    )


def test_bound_names_and_errors():
    assert BOUNDS == {"masked": ("masked",), "uniform": ("reversal", "dfm")}
    assert default_bound(MaskedPath(3)) == "masked" and default_bound(UniformPath(3)) == "reversal"
    den = _random_logits_denoiser(3)
    x1 = torch.zeros(2, 2, dtype=torch.long)
    with pytest.raises(ValueError, match="unknown likelihood bound"):
        nelbo(den, x1, UniformPath(3), bound="elbo")
    with pytest.raises(ValueError, match="uniform source"):
        nelbo(den, x1, MaskedPath(3), bound="reversal")
    with pytest.raises(ValueError, match="uniform source"):
        nelbo(den, x1, MaskedPath(3), bound="dfm")
    with pytest.raises(ValueError, match="masked source"):
        nelbo(den, x1, UniformPath(3), bound="masked")
    with pytest.raises(ValueError, match="clean tokens"):
        nelbo(den, torch.full((2, 2), 3), MaskedPath(3))
    with pytest.raises(ValueError, match="num_t"):
        nelbo(den, x1, UniformPath(3), num_t=0)
    with pytest.raises(ValueError, match="logits"):
        nelbo(lambda xt, t: torch.zeros(*xt.shape, 4), x1, UniformPath(3))


def test_prior_term_for_clipped_start():
    """§2.1: with α_0 = ε > 0 the uniform bound adds L·KL(k_0(·|x) ‖ U); the masked one has no finite bound."""
    eps, V, L = 0.05, 3, 4
    path = UniformPath(V, LogLinearSchedule(eps))
    x1 = torch.randint(0, V, (3, L), generator=torch.Generator().manual_seed(0))
    # log_kernel(x, 0) lists k_0(x|y) over y, which equals k_0(y|x) by symmetry.
    k0 = path.log_kernel(x1, torch.zeros(3, dtype=torch.float64)).exp()
    kl = (k0 * torch.log(V * k0)).sum((-1, -2))
    torch.testing.assert_close(prior_term(x1, path), kl)
    assert (kl > 0).all()
    den = _random_logits_denoiser(V)
    full = nelbo(den, x1, path, num_t=4, generator=torch.Generator().manual_seed(0))
    terms = nelbo_terms(den, x1, path, num_t=4, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(full - terms.mean(0), kl)
    torch.testing.assert_close(
        prior_term(x1, UniformPath(V, LogLinearSchedule(0.0))), torch.zeros(3, dtype=torch.float64)
    )
    with pytest.raises(ValueError, match="infinite"):
        nelbo(den, x1, MaskedPath(V, LogLinearSchedule(1e-3)))


def test_bpc_and_perplexity_helpers():
    assert bits_per_token(10 * math.log(2), 5) == pytest.approx(2.0)
    assert bpc is bits_per_token
    assert perplexity(3.0, 3) == pytest.approx(math.e)
    torch.testing.assert_close(perplexity(torch.tensor([6.0]), 3), torch.tensor([math.e**2]))


def test_evaluate_bound_fields_and_consistency():
    d = EnumerableDistribution.random(3, 3, seed=4)
    path = MaskedPath(3)
    data = d.sample(12, torch.Generator().manual_seed(0))
    res = evaluate_bound(
        d.denoiser(path),
        data,
        path,
        batch_size=12,
        num_t=5,
        generator=torch.Generator().manual_seed(3),
        progress=False,
    )
    direct = nelbo(d.denoiser(path), data, path, num_t=5, generator=torch.Generator().manual_seed(3))
    assert (
        res["bound"] == "masked"
        and res["num_sequences"] == 12
        and res["num_tokens"] == 36
        and res["num_t"] == 5
    )
    assert res["nats_per_token"] == pytest.approx(float(direct.mean()) / 3)
    assert res["bpc"] == pytest.approx(res["nats_per_token"] / math.log(2))
    assert res["perplexity"] == pytest.approx(math.exp(res["nats_per_token"]))
    assert res["nats_per_token_stderr"] == pytest.approx(float((direct / 3).std()) / math.sqrt(12))
    assert res["bpc_stderr"] == pytest.approx(res["nats_per_token_stderr"] / math.log(2))
    # Batching changes nothing but the random stream; gradients are off.
    res2 = evaluate_bound(
        d.denoiser(path),
        data,
        path,
        batch_size=5,
        num_t=5,
        progress=True,
        generator=torch.Generator().manual_seed(3),
        bound="masked",
    )
    assert res2["num_sequences"] == 12 and math.isfinite(res2["bpc"])

    def grad_probe(xt, t):
        assert not torch.is_grad_enabled()
        return torch.zeros(*xt.shape, 3)

    evaluate_bound(grad_probe, data, path, batch_size=4, num_t=2)
    with pytest.raises(ValueError):
        evaluate_bound(grad_probe, data, UniformPath(3), bound="masked")


class _TinyDenoiser(torch.nn.Module):
    """Embedding + time feature + linear head: a model-shaped denoiser for gradient and autocast checks."""

    def __init__(self, V, num_states, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(num_states, 16)
        self.time = torch.nn.Linear(1, 16)
        self.head = torch.nn.Linear(16, V)

    def forward(self, xt, t):
        h = self.emb(xt) + self.time(t.reshape(-1, 1, 1).to(self.time.weight.dtype))
        return self.head(torch.tanh(h))


@pytest.mark.parametrize("kind,bound", [("masked", None), ("uniform", "reversal"), ("uniform", "dfm")])
def test_nelbo_is_differentiable_and_autocast_safe(kind, bound):
    V = 4
    path = MaskedPath(V) if kind == "masked" else UniformPath(V)
    model = _TinyDenoiser(V, path.num_states)
    x1 = torch.randint(0, V, (3, 5), generator=torch.Generator().manual_seed(0))
    val = nelbo(model, x1, path, num_t=4, generator=torch.Generator().manual_seed(0), bound=bound)
    val.sum().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    # Under bf16 autocast the model's logits are bf16; the bound arithmetic stays in float64.
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        lo = nelbo(model, x1, path, num_t=4, generator=torch.Generator().manual_seed(0), bound=bound)
    assert lo.dtype == torch.float64 and torch.isfinite(lo).all()
    torch.testing.assert_close(lo, val.detach(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_masked_integrand_gradient_is_kappa_times_softmax_minus_onehot(dtype):
    """§2.2: ∂(κ_t G)/∂logits^i = κ_t (softmax(logits^i) − onehot(x_1^i)) at masked positions, 0 at carried ones.
    The value tests cannot see a wrong gradient with the right value (e.g. a detached log-partition, which gives
    −κ_t onehot), yet training follows the gradient."""
    V, L = 5, 4
    path = MaskedPath(V)
    g = torch.Generator().manual_seed(0)
    x1 = torch.randint(0, V, (3, L), generator=g)
    t = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)
    masked = torch.tensor([[1, 0, 1, 1], [0, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    xt = torch.where(masked, path.mask_id, x1)
    logits = (2.0 * torch.randn(3, L, V, generator=g, dtype=torch.float64)).to(dtype).requires_grad_(True)
    (grad,) = torch.autograd.grad(nelbo_integrand(logits, x1, xt, t, path).sum(), logits)
    kappa = path.kappa(t).reshape(-1, 1, 1)
    want = kappa * (torch.softmax(logits.detach().double(), -1) - torch.nn.functional.one_hot(x1, V))
    want = torch.where(masked.unsqueeze(-1), want, torch.zeros(()))
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(grad.double(), want, atol=tol, rtol=tol)


def test_every_evaluation_is_a_typed_result_the_trainer_formats():
    """`EvalResult`: the bound's entries are attributes, the label names a bound as "<name> bound" and a clean
    model's metric by its own word; an evaluator that forgets a required entry fails by name where it is called."""
    from types import SimpleNamespace

    from tcsm.core.results import EvalResult, summarise_nats
    from tcsm.evaluation.run import evaluate_model

    r = summarise_nats(torch.tensor([1.0, 2.0]), 4, "masked")
    assert isinstance(r, EvalResult) and r.bpc == pytest.approx(1.5 / math.log(2)) and r.num_sequences == 2
    assert r.label == "masked bound" and summarise_nats(torch.ones(2), 4, "ar-nll").label == "exact NLL"

    class Forgetful:
        def evaluate(self, model, data, *, batch_size, generator=None, device=None):
            return {"bound": "x", "bpc": 1.0}

    e = SimpleNamespace(batch_size=2)
    with pytest.raises(TypeError, match=r"Forgetful.evaluate returned no \['bpc_stderr', 'perplexity'"):
        evaluate_model(Forgetful(), None, torch.zeros(2, 3, dtype=torch.long), None, e)


# --- the completion | prompt bound (cond_mask) --------------------------------------------------------


def exact_bound_given_prompt(denoiser, z, cond, path, bound=None, n_t=40, n_w=80):
    """`exact_bound` for one sequence z [L] whose `cond` positions [L] stay clean: x_t enumerated over the free
    positions only, weighted by their kernels."""
    tq, wq = _quadrature(n_t, n_w)
    S = _noisy_states(path, z.numel())
    S = S[(S[:, cond] == z[cond]).all(-1)]
    T, N = tq.numel(), S.shape[0]
    xt, tt, zz = S.repeat(T, 1), tq.repeat_interleave(N), z.expand(T * N, -1)
    lk = path.log_kernel(xt, tt).double().gather(-1, zz.unsqueeze(-1)).squeeze(-1)
    logw = lk[:, ~cond].sum(-1)
    integrand = nelbo_integrand(denoiser(xt, tt), zz, xt, tt, path, bound)
    contrib = torch.where(logw > -torch.inf, logw.exp() * integrand, torch.zeros_like(integrand))
    return (contrib.reshape(T, N).sum(1) * wq).sum()


def _given_prompt(d, z, cond):
    """p_1(· | z's prompt) as a distribution over whole sequences: its exact-posterior denoiser is the denoiser of
    the prompt-pinned process (the prompt's kernel factor is the same for every x_1 and cancels)."""
    match = (d.states[:, cond] == z[cond]).all(-1)
    return EnumerableDistribution(d.probs * match, d.vocab_size, d.length)


@pytest.mark.parametrize("kind,bound", [("masked", "masked"), ("uniform", "reversal")])
@pytest.mark.parametrize("cond", [[True, False, False], [True, True, False], [False, True, False]])
def test_prompt_pinned_bound_at_exact_posterior(kind, bound, cond):
    """[oracle iv.a] the cond_mask bound with the exact posterior given the prompt equals −log p_1(completion |
    prompt) for the masked source (pinned positions score nothing) and is ≥ it for the uniform source (its clean
    pinned positions keep their rate terms)."""
    V, L = 2, 3
    d = EnumerableDistribution.random(V, L, seed=5)
    path = MaskedPath(V) if kind == "masked" else UniformPath(V)
    cond = torch.tensor(cond)
    for z in d.states:
        dc = _given_prompt(d, z, cond)
        value = exact_bound_given_prompt(dc.denoiser(path), z, cond, path, bound)
        nll = -dc.log_prob(z[None])[0]
        if kind == "masked":
            torch.testing.assert_close(value, nll, atol=2e-6, rtol=1e-6)
        else:
            assert value >= nll - 1e-6, (z, value, nll)


@pytest.mark.parametrize("kind", ["masked", "uniform"])
def test_nelbo_terms_with_cond_mask_estimate_the_pinned_bound(kind):
    """`nelbo_terms(cond_mask=...)` (x_t drawn with the prompt clean) is an unbiased estimate of the enumerated
    prompt-pinned bound; with every position pinned the masked bound is 0."""
    V, L = 2, 3
    d = EnumerableDistribution.random(V, L, seed=6)
    path = MaskedPath(V) if kind == "masked" else UniformPath(V)
    z, cond = d.states[5], torch.tensor([True, False, False])
    # masked: a perturbed posterior; uniform: the exact one given the prompt (perturbed uniform integrands are
    # heavy-tailed near t = 1)
    den = _mixed_denoiser(d, path) if kind == "masked" else _given_prompt(d, z, cond).denoiser(path)
    x1, cm = z.expand(4, L), cond.expand(4, L)
    terms = nelbo_terms(den, x1, path, num_t=3000, generator=torch.Generator().manual_seed(2), cond_mask=cm)
    est, se = terms.mean(0), terms.std(0) / math.sqrt(terms.shape[0])
    exact = exact_bound_given_prompt(den, z, cond, path)
    assert ((est - exact).abs() <= 4 * se).all(), (est, exact, se)
    with pytest.raises(ValueError, match="cond_mask must have x1's shape"):
        nelbo_terms(den, x1, path, num_t=2, cond_mask=cond)
    if kind == "masked":  # nothing left to score
        pinned = torch.ones(1, L, dtype=torch.bool)
        assert float(nelbo(den, z[None], path, num_t=4, cond_mask=pinned)[0]) == 0.0


@pytest.mark.parametrize("t_max", [0.3, 0.6])
def test_truncated_bound_of_a_time_blind_factorized_model_is_its_nll_at_any_t_max(t_max):
    """A denoiser whose marginals m_i ignore x_t and t, on the masked path: the integral over [0, t_max] is
    ∫ κ_t (1 − α_t) C dt = α_{t_max} C with C = Σ_i −log m_i(x_1^i), the reconstruction at t_max scores the
    (1 − α_{t_max}) L masked positions on average, so `nelbo_terms(t_max=...)` estimates C (the model's exact NLL)
    at every t_max; without the factor t_max on the integral it would estimate (2 − t_max) C on the linear schedule."""
    V, L = 3, 4
    table = torch.log_softmax(torch.randn(L, V, generator=torch.Generator().manual_seed(0)), -1)
    den = lambda xt, t: table.expand(xt.shape[0], L, V)
    x1 = torch.tensor([[0, 1, 2, 1], [2, 2, 0, 0]])
    exact = -table[torch.arange(L), x1].sum(-1).double()
    terms = nelbo_terms(den, x1, MaskedPath(V), num_t=2000, t_max=t_max, generator=torch.Generator().manual_seed(1))
    est, se = terms.mean(0), terms.std(0) / math.sqrt(terms.shape[0])
    assert ((est - exact).abs() <= 4 * se).all(), (est, exact, se)
    assert (se < 0.03 * exact).all()
