"""Bregman generators and divergences between distributions (MATH.md §3.3, §3.5)."""

from __future__ import annotations

import math

import pytest
import torch

from tcsm.objectives.divergences import BREGMAN, F_DIVERGENCES, get_bregman, get_f_divergence

GENERATORS = ["gkl", "squared", "is", "logistic"]
DIVERGENCES = ["kl", "reverse_kl", "is", "squared", "logistic"]


def _random_dists(n, V, seed, zeros=False):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(n, V, generator=g, dtype=torch.float64) + 0.05
    if zeros:
        drop = torch.rand(n, V, generator=g) < 0.4
        drop[:, 0] = False  # keep at least one entry
        p = torch.where(drop, torch.zeros_like(p), p)
    return p / p.sum(-1, keepdim=True)


def _naive_phi(name, u):
    """The generators exactly as MATH.md §3.5 writes them (0·log 0 = 0)."""
    xlogx = torch.special.xlogy(u, u)
    return {
        "gkl": xlogx,
        "squared": 0.5 * (u - 1) ** 2,
        "is": -torch.log(u),
        "logistic": xlogx - torch.special.xlogy(1 + u, 1 + u),
    }[name]


# --- generators -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GENERATORS)
def test_generator_pieces_match_definitions(name):
    """φ matches MATH.md §3.5, φ' = dφ/du (autograd), conj = u φ'(u) − φ(u), and the log-space forms agree."""
    gen = BREGMAN[name]
    u = torch.logspace(-6, 6, 61, dtype=torch.float64).requires_grad_(True)
    phi = gen.phi(u)
    torch.testing.assert_close(phi, _naive_phi(name, u))
    (grad,) = torch.autograd.grad(phi.sum(), u)
    u = u.detach()
    torch.testing.assert_close(gen.dphi(u), grad, rtol=1e-10, atol=1e-12)
    lu = u.log()
    torch.testing.assert_close(gen.phi_log(lu), gen.phi(u), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(gen.dphi_log(lu), gen.dphi(u), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(gen.conj_log(lu), u * gen.dphi(u) - gen.phi(u), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", GENERATORS)
def test_bregman_divergence_definition_and_properties(name):
    """D_φ(u, v) = φ(u) − φ(v) − φ'(v)(u − v) ≥ 0, = 0 iff u = v; the log-space form agrees (MATH.md §3.5)."""
    gen = BREGMAN[name]
    g = torch.Generator().manual_seed(1)
    u = torch.exp(torch.randn(500, generator=g, dtype=torch.float64) * 3)
    v = torch.exp(torch.randn(500, generator=g, dtype=torch.float64) * 3)
    direct = _naive_phi(name, u) - _naive_phi(name, v) - gen.dphi(v) * (u - v)
    torch.testing.assert_close(gen.divergence(u, v), direct, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(gen.divergence_log(u.log(), v.log()), direct, rtol=1e-8, atol=1e-8)
    assert (gen.divergence(u, v) >= -1e-12).all()
    assert gen.divergence(u, u).abs().max() < 1e-12
    assert gen.divergence_log(u.log(), u.log()).abs().max() < 1e-12


@pytest.mark.parametrize("name", GENERATORS)
def test_bregman_zero_and_extreme_arguments_never_nan(name):
    """u = 0 is handled by limits (0·log 0 = 0); IS gives +inf at u = 0, the others a finite value."""
    gen = BREGMAN[name]
    lu = torch.tensor([-math.inf, -math.inf, -200.0, 0.0, 200.0, 50.0], dtype=torch.float64)
    lv = torch.tensor([0.0, -5.0, 200.0, -200.0, -200.0, 50.0], dtype=torch.float64)
    d = gen.divergence_log(lu, lv)
    assert not d.isnan().any()
    assert (d >= 0).all()
    if name == "is":
        assert d[0] == math.inf
    else:
        torch.testing.assert_close(d[:2], gen.divergence(torch.zeros(2, dtype=torch.float64), lv[:2].exp()))
        assert d[:2].isfinite().all()


def test_registry_lookup_and_unknown_names():
    """Aliases resolve to the same generator; unknown names raise a ValueError naming the choices."""
    assert get_bregman("kl") is BREGMAN["gkl"] and get_bregman("lsif") is BREGMAN["squared"]
    assert get_bregman(BREGMAN["is"]) is BREGMAN["is"]
    assert get_f_divergence("rkl") is F_DIVERGENCES["reverse_kl"]
    with pytest.raises(ValueError, match="unknown Bregman generator 'nope'"):
        get_bregman("nope")
    with pytest.raises(ValueError, match="unknown divergence 'nope'"):
        get_f_divergence("nope")


# --- divergences between distributions --------------------------------------------------------------


def _f_reference(name, q, m):
    """Σ_y m_y f(q_y/m_y) with the textbook f (MATH.md §3.5); IS is Σ_y [q/m − log(q/m) − 1] (MATH.md §0)."""
    u = q / m
    f = {
        "kl": lambda u: u * torch.log(u),
        "reverse_kl": lambda u: -torch.log(u),
        "squared": lambda u: 0.5 * (u - 1) ** 2,
        "logistic": lambda u: u * torch.log(u) - (1 + u) * torch.log((1 + u) / 2),
    }
    if name == "is":
        return (u - torch.log(u) - 1).sum(-1)
    return (m * f[name](u)).sum(-1)


@pytest.mark.parametrize("name", DIVERGENCES)
@pytest.mark.parametrize("V", [2, 3, 4, 7])
def test_f_divergence_values_full_support(name, V):
    """D(q ‖ m) from log-probabilities equals Σ_y m_y f(q_y/m_y); it is ≥ 0 and 0 at q = m (MATH.md §3.5)."""
    q, m = _random_dists(64, V, seed=V), _random_dists(64, V, seed=100 + V)
    fn = F_DIVERGENCES[name]
    d = fn(q.log(), m.log())
    assert d.shape == (64,)
    torch.testing.assert_close(d, _f_reference(name, q, m), rtol=1e-9, atol=1e-12)
    assert (d > 0).all()
    assert fn(q.log(), q.log()).abs().max() < 1e-12


def test_logistic_is_twice_jensen_shannon():
    """The logistic/BCE divergence is 2·JS(q, m) = KL(q ‖ a) + KL(m ‖ a), a = (q + m)/2 (MATH.md §3.5)."""
    q, m = _random_dists(32, 5, seed=3), _random_dists(32, 5, seed=4)
    a = (q + m) / 2
    js2 = (q * (q / a).log()).sum(-1) + (m * (m / a).log()).sum(-1)
    torch.testing.assert_close(F_DIVERGENCES["logistic"](q.log(), m.log()), js2)


def test_is_divergence_is_the_separable_is_bregman_on_probabilities():
    """D_IS(q ‖ m) = Σ_y D_φ(q_y, m_y) with φ = −log u (MATH.md §0, §3.5)."""
    q, m = _random_dists(16, 4, seed=5), _random_dists(16, 4, seed=6)
    torch.testing.assert_close(F_DIVERGENCES["is"](q.log(), m.log()), BREGMAN["is"].divergence(q, m).sum(-1))


@pytest.mark.parametrize("name", DIVERGENCES)
def test_f_divergences_with_zero_probabilities(name):
    """Zeros of q (−inf log-probs): KL, squared and logistic stay finite (0·log 0 = 0); reverse KL and IS are
    +inf exactly where q_y = 0 < m_y; never NaN, also when both q_y and m_y vanish."""
    q = _random_dists(64, 4, seed=7, zeros=True)
    m = _random_dists(64, 4, seed=8, zeros=True)
    fn = F_DIVERGENCES[name]
    d = fn(q.log(), m.log())
    assert not d.isnan().any()
    q_hole = ((q == 0) & (m > 0)).any(-1)
    m_hole = ((m == 0) & (q > 0)).any(-1)
    if name in ("reverse_kl", "is"):
        assert (d[q_hole] == math.inf).all()
    if name in ("kl", "squared", "is"):
        assert (d[m_hole] == math.inf).all()
    if name == "logistic":
        # The limit m·f(q/m) → q log 2 as m → 0 makes it finite everywhere: 2·JS with 0·log 0 = 0.
        a = ((q + m) / 2).clamp_min(1e-300)  # a = 0 only where q = m = 0, whose terms are 0
        ref = (torch.special.xlogy(q, q / a) + torch.special.xlogy(m, m / a)).sum(-1)
        torch.testing.assert_close(d, ref, rtol=1e-9, atol=1e-12)
        assert d.isfinite().all()
        return
    ok = ~(q_hole | m_hole)
    assert ok.sum() > 5
    # Where both vanish together the term is 0: compare with the reference on the joint support.
    keep = (q > 0) | (m > 0)
    qs, ms = torch.where(keep, q, torch.ones_like(q)), torch.where(keep, m, torch.ones_like(m))
    torch.testing.assert_close(d[ok], _f_reference(name, qs, ms)[ok], rtol=1e-9, atol=1e-12)
    assert (d[ok] >= -1e-12).all()


@pytest.mark.parametrize("name", DIVERGENCES)
def test_f_divergence_gradients_finite_at_extreme_logits(name):
    """Gradient w.r.t. model logits is finite at logits ±1e4 (target with full support, floored logs)."""
    logits = torch.tensor([[1e4, -1e4, 0.0, 3.0]], requires_grad=True)
    log_m = torch.log_softmax(logits, -1).clamp_min(-30.0)
    log_q = _random_dists(1, 4, seed=9).float().log()
    F_DIVERGENCES[name](log_q, log_m).sum().backward()
    assert logits.grad.isfinite().all()


# --- Prop 3.4 (prop:tcsmscoregkl) ---------------------------------------------------------------------


def _score_gkl_expectation(q, m):
    """E_{z~q} Σ_y GKL(q_y/q_z ‖ m_y/m_z), z over supp q, via the elementwise GKL generator."""
    gkl = BREGMAN["gkl"]
    w = q.unsqueeze(-2) / q.unsqueeze(-1)  # [.., z, y] = q_y / q_z
    rho = m.unsqueeze(-2) / m.unsqueeze(-1)
    per_z = gkl.divergence(w, rho).sum(-1)  # [.., z]
    per_z = torch.where(q > 0, per_z, torch.zeros_like(per_z))
    return (q * per_z).sum(-1)


@pytest.mark.parametrize("V", [2, 3, 4, 9])
def test_prop_score_gkl_equals_V_kl_plus_is_full_support(V):
    """prop:tcsmscoregkl (MATH.md §3.3, oracle i.a): E_{x~q} Σ_y GKL(q_y/q_x ‖ m_y/m_x) = V·KL(q‖m) + IS(q‖m)."""
    q, m = _random_dists(200, V, seed=11 * V), _random_dists(200, V, seed=13 * V)
    lhs = _score_gkl_expectation(q, m)
    rhs = V * F_DIVERGENCES["kl"](q.log(), m.log()) + F_DIVERGENCES["is"](q.log(), m.log())
    torch.testing.assert_close(lhs, rhs, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("V", [3, 4, 6])
def test_prop_score_gkl_support_restricted(V):
    """MATH.md §3.3 / §8 item 7 (oracle i.b): if q has zeros, E_{x~q} Σ_y GKL(q_y/q_x ‖ m_y/m_x)
    = |supp q|·KL(q‖m) + Σ_{x∈supp q}[q_x/m_x − log(q_x/m_x) − 1]; the unrestricted IS term is +inf."""
    q, m = _random_dists(200, V, seed=V, zeros=True), _random_dists(200, V, seed=50 + V)
    assert (q == 0).any(-1).sum() > 50  # the case under test actually occurs
    lhs = _score_gkl_expectation(q, m)
    supp = q > 0
    u = torch.where(supp, q / m, torch.ones_like(q))
    restricted_is = (u - u.log() - 1).sum(-1)
    rhs = supp.sum(-1) * F_DIVERGENCES["kl"](q.log(), m.log()) + restricted_is
    assert lhs.isfinite().all()
    torch.testing.assert_close(lhs, rhs, rtol=1e-10, atol=1e-10)
    full_is = F_DIVERGENCES["is"](q.log(), m.log())
    assert (full_is[(q == 0).any(-1)] == math.inf).all()
