"""The capped-importance-weight gradient of the Monte Carlo L_score (MATH.md §3.6), checked by exact enumeration:
its limits (c = ∞: the paper's gradient; c = 0: V × cross-entropy), a zero expected gradient at the posterior
marginal for every cap, the closed-form objective it is the gradient of, and why capping 1/m_z alone is wrong."""

from __future__ import annotations

import math

import pytest
import torch
from test_composed import Enumeration, _grad_at

from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.objectives import Objective, score_loss
from tcsm.objectives.divergences import BREGMAN
from tcsm.paths import UniformPath, make_path
from tcsm.targets import TargetBatch

F64 = torch.float64
CAPS = [0.0, 0.5, 2.0, 5.0, 20.0, math.inf]


def _position(V: int, seed: int):
    """One free position of a uniform-source batch (every token a loss position), with random logits and q."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(1, 1, V, generator=g, dtype=F64) * 2.0).requires_grad_(True)
    q = torch.softmax(torch.randn(V, generator=g, dtype=F64) * 2.0, -1)
    return UniformPath(V), logits, q


def _expected_grad(path, logits, q, **kw):
    """E_{z~q} ∇_logits ℓ̂(z) at one position, enumerated over z."""
    V = logits.shape[-1]
    xt = torch.zeros(1, 1, dtype=torch.long)
    total = torch.zeros(V, dtype=F64)
    for z in range(V):
        batch = TargetBatch(xt, torch.full((1,), 0.5, dtype=F64), torch.full((1, 1), z), path.loss_mask(xt))
        (g,) = torch.autograd.grad(score_loss(logits, batch, path, clamp=None, tilt=False, **kw).sum(), logits)
        total += q[z] * g[0, 0]
    return total


def _closed_form(log_m: torch.Tensor, q: torch.Tensor, cap: float) -> torch.Tensor:
    """F_c(q, m) = V·KL(q‖m) + Σ_y [h(m_y) − h(q_y)] with h(u) = q/u + log u for u ≥ 1/c and c·u − q·c·log u + const
    below (continuous at 1/c): the objective whose gradient the capped estimator follows in expectation (§3.6)."""
    V = log_m.shape[-1]

    def h(log_u, qy):
        u = log_u.exp()
        upper = qy / u + log_u
        if cap == math.inf:
            return upper
        if cap == 0:
            return torch.zeros_like(log_u)  # c = 0: no IS part at all
        lc = -math.log(cap)  # log(1/c)
        join = qy * cap + lc  # upper branch at u = 1/c
        lower = cap * u - qy * cap * log_u + (join - 1.0 + qy * cap * lc)
        return torch.where(log_u >= lc, upper, lower)

    kl = (q * (q.log() - log_m)).sum()
    return V * kl + (h(log_m, q) - h(q.log(), q)).sum()


@pytest.mark.parametrize("gen", ["gkl", "is"])
def test_value_is_the_paper_estimator_for_every_cap(gen):
    """§3.6: the reported loss is the paper's estimator; only its gradient changes."""
    path, logits, _ = _position(6, seed=0)
    xt = torch.zeros(1, 1, dtype=torch.long)
    batch = TargetBatch(xt, torch.full((1,), 0.5, dtype=F64), torch.full((1, 1), 2), path.loss_mask(xt))
    paper = score_loss(logits, batch, path, bregman=gen, tilt=False, weight_cap=math.inf)
    for cap in (0.0, 1.0, None, 100.0):
        assert torch.equal(score_loss(logits, batch, path, bregman=gen, tilt=False, weight_cap=cap), paper)


def test_infinite_cap_is_the_paper_gradient_and_a_huge_finite_cap_matches_it():
    """§3.6: c = ∞ is the paper's estimator; the surrogate with c ≥ max 1/m_y has the very same gradient."""
    path, logits, q = _position(5, seed=1)
    paper = _expected_grad(path, logits, q, weight_cap=math.inf)
    huge = _expected_grad(path, logits, q, weight_cap=1e12)
    torch.testing.assert_close(huge, paper, rtol=1e-12, atol=1e-12)
    default = _expected_grad(path, logits, q)  # c = V: visibly different for these logits
    assert (default - paper).abs().max() > 1e-3


def test_zero_cap_is_V_times_cross_entropy():
    """§3.6: c = 0 keeps only −V log m_z: per sample, the gradient of V × cross-entropy."""
    V = 5
    path, logits, _ = _position(V, seed=2)
    xt = torch.zeros(1, 1, dtype=torch.long)
    for z in range(V):
        batch = TargetBatch(xt, torch.full((1,), 0.5, dtype=F64), torch.full((1, 1), z), path.loss_mask(xt))
        (g,) = torch.autograd.grad(score_loss(logits, batch, path, tilt=False, weight_cap=0.0).sum(), logits)
        (ce,) = torch.autograd.grad(-V * torch.log_softmax(logits, -1)[0, 0, z], logits)
        torch.testing.assert_close(g, ce, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gen", ["gkl", "is"])
@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("seed", [0, 3])
def test_expected_gradient_vanishes_at_the_target_for_every_cap(gen, cap, seed):
    """§3.6: E_{z~q} ∇ℓ̂_c = 0 at m = q for every c (the optimum does not move), and not elsewhere."""
    V = 6
    path, logits, q = _position(V, seed)
    at_q = q.log().reshape(1, 1, V).clone().requires_grad_(True)
    assert _expected_grad(path, at_q, q, bregman=gen, weight_cap=cap).abs().max() < 1e-12
    assert _expected_grad(path, logits, q, bregman=gen, weight_cap=cap).abs().max() > 1e-3


@pytest.mark.parametrize("cap", CAPS)
@pytest.mark.parametrize("seed", [0, 3, 4])
def test_expected_gradient_is_the_gradient_of_the_closed_form_objective(cap, seed):
    """§3.6: E_{z~q} ∇ℓ̂_c = ∇_logits F_c(q, m), F_c = V·KL + Huberised IS ≥ 0 with equality only at m = q; a step
    against the expected gradient therefore decreases F_c (the sign of every term)."""
    V = 6
    path, logits, q = _position(V, seed)
    expected = _expected_grad(path, logits, q, weight_cap=cap)
    F = _closed_form(torch.log_softmax(logits[0, 0], -1), q, cap)
    (grad_f,) = torch.autograd.grad(F, logits)
    torch.testing.assert_close(expected, grad_f[0, 0], rtol=1e-10, atol=1e-10)
    assert F.item() > 0
    with torch.no_grad():
        stepped = logits - 1e-3 * expected.reshape(1, 1, V)
    assert _closed_form(torch.log_softmax(stepped[0, 0], -1), q, cap) < F


def test_closed_form_equals_L_score_where_every_probability_is_at_least_one_over_c():
    """§3.6: where every m_y ≥ 1/c, F_c and the exact expected L_score (V·KL + IS) differ by a constant in m, so
    their gradients coincide."""
    V, cap = 4, 8.0
    q = torch.tensor([0.05, 0.15, 0.3, 0.5], dtype=F64)
    logits = torch.log(torch.tensor([0.2, 0.2, 0.25, 0.35], dtype=F64)).requires_grad_(True)  # all ≥ 1/8
    log_m = torch.log_softmax(logits, -1)
    d = q.log() - log_m
    exact = V * (q * d).sum() + (d.exp() - d - 1).sum()
    (g_exact,) = torch.autograd.grad(exact, logits)
    (g_cap,) = torch.autograd.grad(_closed_form(torch.log_softmax(logits, -1), q, cap), logits)
    torch.testing.assert_close(g_cap, g_exact, rtol=1e-12, atol=1e-12)


def test_capping_only_the_z_weight_pushes_rare_tokens_to_zero_mass():
    """§3.6: with only 1/m_z capped, a token whose target probability is below 1/(V + c) is pushed down however
    small its mass already is (positive expected logit gradient), so it goes to the floor; both caps keep its
    restoring force."""
    V, cap = 5, 5.0
    q = torch.tensor([0.02, 0.18, 0.2, 0.3, 0.3], dtype=F64)  # q_0 = 0.02 < 1/(V + c) = 0.1
    for m0 in (1e-3, 1e-6, 1e-9):
        rest = (1 - m0) * q[1:] / q[1:].sum()
        logits = torch.cat([torch.tensor([m0], dtype=F64), rest]).log().requires_grad_(True)
        g_half = torch.zeros(V, dtype=F64)
        for z in range(V):
            log_m = torch.log_softmax(logits, -1)
            w_z = torch.exp(-log_m[z]).detach().clamp_max(cap)
            loss = -(V + w_z) * log_m[z] + log_m.sum()  # 1/m_z capped, Σ_y log m_y left as it is
            (g,) = torch.autograd.grad(loss, logits)
            g_half += q[z] * g
        assert g_half[0] > 0  # gradient descent lowers logit 0 further
        both = _expected_grad(UniformPath(V), logits.detach().reshape(1, 1, V).requires_grad_(True), q, weight_cap=cap)
        assert both[0] < 0  # the capped estimator raises it back


@pytest.mark.parametrize("kind,tilt", [("masked", None), ("uniform", None), ("uniform", True)])
@pytest.mark.parametrize("cap", [0.0, 1.0, None, math.inf])
def test_zero_gradient_at_true_posterior_marginals_through_the_objective(kind, tilt, cap):
    """§3.6 through `Objective` (κ_t-weighted, enumerated (x_1, x_t); uniform: untilted and tilted): the capped
    estimator's expected gradient w.r.t. a logits table θ(x_t) vanishes at the posterior marginals."""
    V, L = 3, 2
    toy = EnumerableDistribution.random(V, L, seed=3)
    path = make_path(kind, V)
    objective = Objective(path, loss="score", weighting="kappa", weight_cap=cap, tilt=tilt)
    for t in (0.3, 0.75):
        e = Enumeration(toy, path, t)
        batch = e.data_batch()
        assert _grad_at(e, objective, e.true_marginal_table(), batch).abs().max() < 1e-10
        assert _grad_at(e, objective, e.random_table(1), batch).abs().max() > 1e-3


def test_default_cap_bounds_the_masked_gradient():
    """§3.6: a masked position whose observed token the model finds unlikely: the paper's gradient grows like 1/m_z,
    the default (c = V) one stays below 2V + 1 per logit, whatever m_z."""
    V = 8
    path = make_path("masked", V)
    xt = torch.full((1, 1), V, dtype=torch.long)  # masked
    batch = TargetBatch(xt, torch.full((1,), 0.5, dtype=F64), torch.zeros(1, 1, dtype=torch.long), path.loss_mask(xt))
    for m_z in (1e-3, 1e-6):
        logits = torch.zeros(1, 1, V, dtype=F64)
        logits[0, 0, 0] = math.log(m_z * (V - 1) / (1 - m_z))
        norms = {}
        for cap in (math.inf, None):
            x = logits.clone().requires_grad_(True)
            (g,) = torch.autograd.grad(score_loss(x, batch, path, clamp=None, weight_cap=cap).sum(), x)
            norms[cap] = g.abs().max().item()
        assert norms[math.inf] > 0.5 / m_z
        assert norms[None] <= 2 * V + 1


def test_bad_caps_are_refused_when_the_objective_is_built():
    path = make_path("masked", 4)
    for bad in (-1.0, "big", float("nan")):
        with pytest.raises(ValueError, match="weight_cap"):
            Objective(path, loss="score", weight_cap=bad)
    with pytest.raises(ValueError, match="no importance weights"):
        Objective(path, loss="score", divergence="squared", weight_cap=2.0)
    Objective(path, loss="score", divergence="squared", weight_cap="inf")  # the paper's: always allowed
    Objective(path, loss="score", weight_cap="V")
    assert BREGMAN["logistic"].mc_score_surrogate(torch.zeros(1, 2), torch.zeros(1), 1.0) is None


def test_tilted_uniform_estimator_is_capped_only_when_asked():
    """§3.6: the kernel-tilted estimator (tilt=true) keeps its gradient unless a cap is given; the untilted one
    (the default) is capped at V."""
    V = 6
    path = UniformPath(V)
    g = torch.Generator().manual_seed(5)
    xt = torch.randint(0, V, (4, 3), generator=g)
    x1 = torch.randint(0, V, (4, 3), generator=g)
    batch = TargetBatch(xt, torch.full((4,), 0.6, dtype=F64), x1, path.loss_mask(xt))
    logits = (torch.randn(4, 3, V, generator=g, dtype=F64) * 3).requires_grad_(True)

    def grad(**kw):
        (g_,) = torch.autograd.grad(score_loss(logits, batch, path, **kw).sum(), logits)
        return g_

    torch.testing.assert_close(grad(tilt=True), grad(tilt=True, weight_cap=math.inf), rtol=0, atol=0)
    assert (grad(tilt=True, weight_cap="V") - grad(tilt=True)).abs().max() > 1e-6
    torch.testing.assert_close(grad(tilt=False), grad(tilt=False, weight_cap="V"), rtol=0, atol=0)
    assert (grad(tilt=False) - grad(tilt=False, weight_cap=math.inf)).abs().max() > 1e-6
