"""TCSM objectives (MATH.md §3, §7): identities by exact enumeration of (x_1, x_t) on tiny state spaces, and
unit tests of shapes, dtypes, masking, weighting and the `Objective` interface."""

from __future__ import annotations

import copy
import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.objectives import LOSSES, WEIGHTINGS, Objective, distrib_loss, reduce_loss, score_loss
from tcsm.objectives.divergences import BREGMAN, BregmanGenerator
from tcsm.paths import MaskedPath, PolynomialSchedule, UniformPath, make_path
from tcsm.paths.timesteps import sample_times
from tcsm.targets import ConditionalTarget, DataTarget, TargetBatch

F64 = torch.float64


# --- exact enumeration helpers ---------------------------------------------------------------------


def noisy_states(path, L):
    return torch.tensor(list(itertools.product(range(path.num_states), repeat=L)), dtype=torch.long)


class Enumeration:
    """Every pair (x_1, x_t) with p_1(x_1) p_{t|1}(x_t | x_1) > 0 at one time t, as one batch."""

    def __init__(self, toy, path, t):
        L = toy.length
        self.toy, self.path, self.t = toy, path, t
        self.xt_states = noisy_states(path, L)
        tt = torch.full((len(self.xt_states),), t, dtype=F64)
        lk = path.log_kernel(self.xt_states, tt).double()  # [Nt, L, V]
        log_pt1 = lk[:, torch.arange(L), toy.states].sum(-1)  # [Nt, N1]
        joint = toy.log_probs.unsqueeze(0) + log_pt1
        it, i1 = torch.nonzero(joint > -math.inf, as_tuple=True)
        self.xt_index, self.x1, self.xt = it, toy.states[i1], self.xt_states[it]
        self.prob = joint[it, i1].exp()
        assert abs(self.prob.sum().item() - 1.0) < 1e-12
        self.tb = torch.full((len(it),), t, dtype=F64)

    def data_batch(self):
        B = len(self.prob)
        return TargetBatch(self.xt, self.tb, self.x1, self.path.loss_mask(self.xt), weight=self.prob * B)

    def explicit_batch(self):
        """Exact N^1 targets q^i = p_{1|t}(x_1^i | x_1^{≠i}, x_t) in float64 (MATH.md §1.3)."""
        log_q = self.path.target_conditional(self.toy.conditionals(self.x1), self.xt, self.tb)
        return replace(self.data_batch(), log_q=log_q)

    def conditional_target_batch(self):
        """The same targets, produced by `ConditionalTarget` (the explicit-target interface) on these pairs."""
        fixed = copy.copy(self.path)
        fixed.draw_xt = lambda x1, t, generator=None: self.xt  # the enumerated x_t instead of a random draw
        batch = ConditionalTarget(self.toy.conditionals)(self.x1, self.tb, fixed)
        return replace(batch, weight=self.prob * len(self.prob))

    def expect(self, per_pos):
        """E_{x_1, x_t}[Σ_i ℓ^i] for a per-position loss evaluated on the enumerated batch."""
        return (self.prob * per_pos.sum(-1)).sum()

    def random_table(self, seed, scale=1.5):
        g = torch.Generator().manual_seed(seed)
        V = self.toy.vocab_size
        return torch.randn(len(self.xt_states), self.toy.length, V, generator=g, dtype=F64) * scale

    def true_marginal_table(self):
        tt = torch.full((len(self.xt_states),), self.t, dtype=F64)
        return torch.log(self.toy.marginals(self.xt_states, tt, self.path).clamp_min(1e-300))


PATH_KINDS = ["masked", "uniform"]
SIZES = [(2, 3), (3, 2), (4, 2)]  # (V, L)


# --- MC score loss = exact score objective + constant (thm:tcsm_train_objective) ------------------------


@pytest.mark.parametrize("kind", PATH_KINDS)
@pytest.mark.parametrize("V,L", SIZES)
@pytest.mark.parametrize("gen", ["gkl", "squared", "is", "logistic"])
def test_mc_score_equals_exact_score_up_to_constant(kind, V, L, gen):
    """MATH.md §3.4 (oracle ii.a gkl, ii.b squared): E[ℓ̂_φ(z)] = E Σ_i Σ_y D_φ(w^i(y), m_y/m_z) + C with C
    independent of θ — the difference is the same at several random logits tables θ(x_t)."""
    toy = EnumerableDistribution.random(V, L, seed=10 * V + L)
    path = make_path(kind, V)
    diffs, mc_values = [], []
    for t in (0.35, 0.8):
        e = Enumeration(toy, path, t)
        mc_b, ex_b = e.data_batch(), e.explicit_batch()
        for seed in range(4):
            logits = e.random_table(seed)[e.xt_index]
            mc = e.expect(score_loss(logits, mc_b, path, bregman=gen, clamp=None, tilt=False))
            exact = e.expect(score_loss(logits, ex_b, path, bregman=gen, clamp=None))
            diffs.append((t, (mc - exact).item()))
            mc_values.append(mc.item())
    for t in (0.35, 0.8):
        d = [v for s, v in diffs if s == t]
        assert max(d) - min(d) < 1e-9 * max(1.0, abs(d[0]))
    assert max(mc_values) - min(mc_values) > 1e-2  # θ really changed the loss


@pytest.mark.parametrize("kind", PATH_KINDS)
@pytest.mark.parametrize("gen", ["gkl", "squared"])
def test_tilted_mc_score_equals_tilted_exact_score_up_to_constant(kind, gen):
    """`score_loss` tilt (MATH.md §1.3, §3.4): E[(k_min/k_z) ℓ̂_φ(m̃, z)] = E[(k_min/k_z) Σ_y D_φ(r_y/r_z, m̃_y/m̃_z)] + C
    with r ∝ q^i/k = p_1(· | x_1^{≠i}), m̃ ∝ m/k, k_y = k_t(x_t^i | y); C independent of θ. Masked: the tilt is
    the identity (k is constant at masked positions)."""
    V, L = 3, 2
    toy = EnumerableDistribution.random(V, L, seed=5)
    path = make_path(kind, V)
    diffs = {}
    for t in (0.35, 0.9):
        e = Enumeration(toy, path, t)
        mc_b, ex_b = e.data_batch(), e.explicit_batch()
        log_k = path.log_kernel(e.xt, e.tb).double()
        log_k = log_k - log_k.min(-1, keepdim=True).values
        w_z = torch.exp(-log_k.gather(-1, e.x1.unsqueeze(-1)).squeeze(-1))
        tilted_b = replace(ex_b, log_q=torch.log_softmax(ex_b.log_q - log_k, -1))
        for seed in range(3):
            logits = e.random_table(seed)[e.xt_index]
            mc = e.expect(score_loss(logits, mc_b, path, bregman=gen, clamp=None, tilt=True))
            exact = e.expect(w_z * score_loss(logits - log_k, tilted_b, path, bregman=gen, clamp=None))
            diffs.setdefault(t, []).append((mc - exact).item())
            if kind == "masked":
                untilted = e.expect(score_loss(logits, mc_b, path, bregman=gen, clamp=None, tilt=False))
                torch.testing.assert_close(mc, untilted)
    for d in diffs.values():
        assert max(d) - min(d) < 1e-9 * max(1.0, abs(d[0]))


@pytest.mark.parametrize("kind", PATH_KINDS)
def test_default_score_estimator_is_the_untilted_capped_one(kind):
    """The default L_score estimator (docs/benchmarks.md "At an equal CPU-hour budget"; MATH.md §3.6): untilted for
    both sources, with its importance weights capped at V — the same value and gradient as asking for it by name;
    the tilt is a visibly different estimator on the uniform source and the identity on the masked one."""
    V, L = 3, 2
    path = make_path(kind, V)
    e = Enumeration(EnumerableDistribution.random(V, L, seed=3), path, 0.7)
    table = e.random_table(1).requires_grad_(True)
    batch = e.data_batch()

    def value_and_grad(**kw):
        v = score_loss(table[e.xt_index], batch, path, clamp=None, **kw)
        (g,) = torch.autograd.grad(e.expect(v), table)
        return v.detach(), g

    default, g_default = value_and_grad()
    named, g_named = value_and_grad(tilt=False, weight_cap="V")
    tilted, _ = value_and_grad(tilt=True)
    torch.testing.assert_close(default, named, rtol=0, atol=0)
    torch.testing.assert_close(g_default, g_named, rtol=0, atol=0)
    assert path.kernel_flat_on_free == (kind == "masked")
    if kind != "masked":
        assert (default - tilted).abs().max() > 1e-3  # the choice is visible


def test_tilted_uniform_score_gradient_bounded_near_t1():
    """`score_loss` tilt (MATH.md §3.4): uniform source, t → 1, x_t^i ≠ x_1^i, model = posterior of a uniform clean
    conditional (m ∝ k): the paper's untilted κ_t-weighted gradient grows like V/(1 − t)² (1/m_z with m_z ~ (1 − t)/V),
    the tilted one and the capped untilted one (§3.6) like κ_t · O(V) — and all vanish in expectation at the
    optimum (see the zero-gradient tests)."""
    V = 8
    path = UniformPath(V)
    objective = {tilt: Objective(path, loss="score", tilt=tilt, weight_cap="inf") for tilt in (False, True)}
    objective["capped"] = Objective(path, loss="score", tilt=False)  # the default cap c = V (MATH.md §3.6)
    xt = torch.zeros(1, 1, dtype=torch.long)
    x1 = torch.ones(1, 1, dtype=torch.long)
    for one_minus_t in (1e-2, 1e-4):
        t = torch.tensor([1.0 - one_minus_t], dtype=F64)
        batch = TargetBatch(xt, t, x1, path.loss_mask(xt))
        kappa = float(path.kappa(t))
        norms = {}
        for tilt, obj in objective.items():
            logits = path.log_kernel(xt, t).double().requires_grad_(True)
            loss, _ = obj.loss_from_batch(logits, batch)
            (grad,) = torch.autograd.grad(loss, logits)
            assert loss.isfinite() and grad.isfinite().all()
            norms[tilt] = float(grad.norm())
        assert norms[True] <= 2.0 * V * kappa
        assert norms[False] >= 0.5 * V * kappa / one_minus_t
        assert norms["capped"] <= 2.0 * (2 * V + 1) * kappa


@pytest.mark.parametrize("V", [2, 3, 5])
def test_gkl_box_is_the_generic_bregman_mc_form_plus_V(V):
    """MATH.md §3.4: for φ = u log u the general ℓ_φ(z) equals the box −V log m_z + 1/m_z + Σ_y log m_y minus V."""
    log_m = torch.log_softmax(torch.randn(20, V, dtype=F64), -1)
    log_m_z = log_m[:, 0]
    box = BREGMAN["gkl"].mc_score(log_m, log_m_z)
    torch.testing.assert_close(box, -V * log_m_z + torch.exp(-log_m_z) + log_m.sum(-1))
    torch.testing.assert_close(box, BregmanGenerator.mc_score(BREGMAN["gkl"], log_m, log_m_z) + V)


def test_exact_score_loss_is_expected_prop_3_4():
    """prop:tcsmscoregkl through the loss (MATH.md §3.3): averaging the explicit GKL score loss over z = x_1^i ~ q^i
    gives V·KL(q‖m) + IS(q‖m) at each position (uniform source, full-support q)."""
    V, L = 3, 2
    path = UniformPath(V)
    g = torch.Generator().manual_seed(0)
    log_q = torch.log_softmax(torch.randn(1, L, V, generator=g, dtype=F64), -1)
    logits = torch.randn(1, L, V, generator=g, dtype=F64)
    log_m = torch.log_softmax(logits, -1)
    xt = torch.zeros(1, L, dtype=torch.long)
    expected = torch.zeros(L, dtype=F64)
    for z in range(V):
        batch = TargetBatch(xt, torch.full((1,), 0.5), torch.full((1, L), z), path.loss_mask(xt), log_q=log_q)
        expected += log_q[0, :, z].exp() * score_loss(logits, batch, path, clamp=None)[0]
    kl = (log_q.exp() * (log_q - log_m)).sum(-1)[0]
    d = log_q - log_m
    is_ = (d.exp() - d - 1).sum(-1)[0]
    torch.testing.assert_close(expected, V * kl + is_)


# --- zero gradient at the true posterior marginals (MATH.md §3.4, oracle iii.c) ------------------------


def _grad_at(e, objective, table, batch):
    table = table.clone().requires_grad_(True)
    loss, _ = objective.loss_from_batch(table[e.xt_index], batch)
    (grad,) = torch.autograd.grad(loss, table)
    return grad


@pytest.mark.parametrize("kind", PATH_KINDS)
@pytest.mark.parametrize("loss", ["distrib", "score"])
@pytest.mark.parametrize("target", ["data", "explicit", "conditional_target"])
def test_zero_gradient_at_true_posterior_marginals(kind, loss, target):
    """MATH.md §3.4 "factorized minimiser" (oracle iii.c): E_{x_1,x_t} of L_distrib (KL) and L_score (GKL), MC
    or with explicit N^1 targets (also via `ConditionalTarget`), has zero gradient w.r.t. a logits table θ(x_t)
    at θ = log p_{1|t}(x_1^i = · | x_t), and a clearly non-zero one elsewhere."""
    V, L = 3, 2
    toy = EnumerableDistribution.random(V, L, seed=3)
    path = make_path(kind, V)
    objective = Objective(path, loss=loss, weighting="kappa")
    for t in (0.3, 0.75):
        e = Enumeration(toy, path, t)
        batch = {
            "data": e.data_batch,
            "explicit": e.explicit_batch,
            "conditional_target": e.conditional_target_batch,
        }[target]()
        # ConditionalTarget hands the target over in float32; everything else here is float64.
        tol = 1e-5 if target == "conditional_target" else 1e-10
        grad = _grad_at(e, objective, e.true_marginal_table(), batch)
        assert grad.abs().max() < tol
        assert _grad_at(e, objective, e.random_table(1), batch).abs().max() > 1e-3


# --- κ weighting = MDLM NELBO (MATH.md §2.2, §3.4, §8 item 9) ------------------------------------------


@pytest.mark.parametrize("V,L", [(2, 3), (3, 2)])
@pytest.mark.parametrize("schedule", ["linear", "poly2"])
def test_kappa_weighted_masked_distrib_integrates_to_entropy_with_exact_denoiser(V, L, schedule):
    """MATH.md §2.2 (oracle iv.a, iv.j): with ω = κ_t and the masked-positions-only sum, masked L_distrib is the
    MDLM NELBO; with the exact posterior denoiser it is tight: ∫_0^1 E[loss_t] dt = H(p_1)/L for any schedule.
    (The integrand is a polynomial in t here, so Gauss–Legendre quadrature is exact.)"""
    toy = EnumerableDistribution.random(V, L, seed=7)
    sched = PolynomialSchedule(2.0) if schedule == "poly2" else None
    path = MaskedPath(V, sched)
    objective = Objective(path, loss="distrib", weighting="kappa")
    nodes, weights = np.polynomial.legendre.leggauss(2 * L + 2)
    total = 0.0
    for x, w in zip(nodes, weights):
        e = Enumeration(toy, path, float((x + 1) / 2))
        batch = e.data_batch()
        logits = e.true_marginal_table()[e.xt_index]
        loss, _ = objective.loss_from_batch(logits, batch)
        total += float(w / 2) * loss.item()
    assert abs(total - toy.entropy() / L) < 1e-10


def test_objective_reproduces_mdlm_nelbo_integrand():
    """MATH.md §2.2: one Objective step equals (1/B) Σ_b κ_{t_b} (1/L) Σ_{i: x_t^i = M} −log m_θ(x_1^i | x_t) with the
    same antithetic t and mask draws (the MDLM/MD4 continuous-time loss)."""
    V, L, B = 5, 7, 16
    path = MaskedPath(V)
    emb = torch.nn.Embedding(path.num_states, V)
    model = lambda xt, t: emb(xt) * (1 + t[:, None, None])
    x1 = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(0))
    loss, metrics = Objective(path)(model, x1, torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    t = sample_times(B, antithetic=True, generator=g)
    xt = path.draw_xt(x1, t, g)
    logp = torch.log_softmax(model(xt, t), -1).gather(-1, x1[..., None])[..., 0]
    manual = (1.0 / (1.0 - t) * (-(logp * (xt == V)).sum(-1))).mean() / L
    torch.testing.assert_close(loss, manual)
    assert metrics["loss"] == pytest.approx(manual.item(), rel=1e-6)
    assert metrics["loss_positions"] == pytest.approx((xt == V).float().mean().item())


# --- unit tests ---------------------------------------------------------------------------------------


def _random_batch(path, B=4, L=6, seed=0, explicit=False, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    V = path.vocab_size
    x1 = torch.randint(0, V, (B, L), generator=g)
    t = torch.rand(B, generator=g)
    batch = DataTarget()(x1, t, path, g)
    if explicit:
        log_p1 = torch.log_softmax(torch.randn(B, L, V, generator=g), -1)
        batch = replace(batch, log_q=path.target_conditional(log_p1, batch.xt, t))
    logits = torch.randn(B, L, V, generator=g).to(dtype)
    return batch, logits


LOSS_CASES = [
    ("distrib", {}, False),
    ("distrib", {"divergence": "kl"}, True),
    ("distrib", {"divergence": "reverse_kl"}, True),
    ("distrib", {"divergence": "is"}, True),
    ("distrib", {"divergence": "squared"}, True),
    ("distrib", {"divergence": "logistic"}, True),
    ("score", {"bregman": "gkl"}, False),
    ("score", {"bregman": "squared"}, False),
    ("score", {"bregman": "is"}, False),
    ("score", {"bregman": "logistic"}, False),
    ("score", {"bregman": "gkl"}, True),
    ("score", {"bregman": "squared"}, True),
    ("score", {"bregman": "is"}, True),
    ("score", {"bregman": "logistic"}, True),
]


@pytest.mark.parametrize("name,kw,explicit", LOSS_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_shapes_and_dtypes(name, kw, explicit, dtype):
    """Per-position losses are [B, L], float32 for float32/bf16 logits (bf16 is upcast, not computed in bf16) and
    float64 for float64 logits; exactly 0 off the loss mask."""
    path = MaskedPath(5)
    batch, logits = _random_batch(path, explicit=explicit, dtype=dtype)
    out = LOSSES[name](logits, batch, path, **kw)
    assert out.shape == batch.xt.shape
    assert out.dtype == (F64 if dtype == F64 else torch.float32)
    assert out.isfinite().all()
    assert (out[~batch.loss_mask] == 0).all()
    if dtype == torch.bfloat16:
        torch.testing.assert_close(out, LOSSES[name](logits.float(), batch, path, **kw))


@pytest.mark.parametrize("name,kw,explicit", LOSS_CASES)
def test_carry_over_positions_never_contribute(name, kw, explicit):
    """MATH.md §2.2, §3.4: positions outside loss_mask (unmasked, carry-over) neither change the loss nor receive
    gradient, whatever the model emits there (huge, infinite or NaN logits)."""
    path = MaskedPath(4)
    batch, logits = _random_batch(path, B=6, L=8, seed=1, explicit=explicit)
    keep = batch.loss_mask
    assert keep.any() and (~keep).any()
    junk = torch.tensor([1e30, -math.inf, math.nan, 7.0])
    wild = torch.where(keep.unsqueeze(-1), logits, junk.expand_as(logits)).requires_grad_(True)
    out = LOSSES[name](wild, batch, path, **kw)
    torch.testing.assert_close(out, LOSSES[name](logits, batch, path, **kw))
    out.sum().backward()
    assert wild.grad.isfinite().all()
    assert (wild.grad[~keep] == 0).all()
    assert (wild.grad[keep] != 0).any()


@pytest.mark.parametrize("name,kw,explicit", LOSS_CASES)
@pytest.mark.parametrize("kind", PATH_KINDS)
def test_finite_gradients_at_extreme_logits(name, kw, explicit, kind):
    """Logits of ±1e4 (a saturated model) give a finite loss and finite gradients with the default clamps."""
    path = make_path(kind, 4)
    batch, logits = _random_batch(path, seed=2, explicit=explicit)
    signs = torch.where(torch.rand(logits.shape, generator=torch.Generator().manual_seed(3)) < 0.5, -1.0, 1.0)
    extreme = (1e4 * signs).requires_grad_(True)
    objective = Objective(path, loss=name, **kw)
    loss, _ = objective.loss_from_batch(extreme, batch)
    loss.backward()
    assert loss.isfinite() and extreme.grad.isfinite().all()


def test_score_clamp_keeps_mc_loss_bounded_below():
    """MATH.md §3.4, §8 item 6 (oracle ii.d): without a floor the MC score loss −V log m_z + 1/m_z + Σ_y log m_y is
    unbounded below as unobserved logits → −∞; the default clamp at −30 bounds it by −30·(V − 1)."""
    V = 6
    path = UniformPath(V)
    xt = torch.zeros(1, 1, dtype=torch.long)
    batch = TargetBatch(xt, torch.full((1,), 0.5), xt.clone(), path.loss_mask(xt))
    logits = torch.full((1, 1, V), -1e4)
    logits[..., 0] = 0.0
    assert score_loss(logits, batch, path, clamp=None).item() < -1e3
    assert score_loss(logits, batch, path).item() >= -30.0 * (V - 1)


def test_paper_scale_divides_by_V():
    """MATH.md §8 item 5: the paper's ℓ_pseudo + ℓ_entropy is the box divided by V."""
    path = MaskedPath(7)
    batch, logits = _random_batch(path)
    torch.testing.assert_close(
        score_loss(logits, batch, path, paper_scale=True), score_loss(logits, batch, path) / 7
    )


def test_distrib_non_kl_with_mc_target_is_an_error():
    """MATH.md §3.5: with data samples only, KL (a cross-entropy) is estimable; other divergences need q."""
    path = MaskedPath(4)
    batch, logits = _random_batch(path)
    with pytest.raises(ValueError, match="needs an explicit target"):
        distrib_loss(logits, batch, path, divergence="reverse_kl")


def test_explicit_kl_is_soft_cross_entropy_and_mc_is_its_sample():
    """MATH.md §4: explicit "kl" is −Σ_y q(y) log m(y); the MC value −log m(x_1^i) averaged over x_1^i ~ q equals it."""
    path = UniformPath(3)
    batch, logits = _random_batch(path, B=1, L=2, explicit=True, dtype=F64)
    log_m = torch.log_softmax(logits, -1)
    soft = distrib_loss(logits, batch, path)
    torch.testing.assert_close(soft, -(batch.log_q.exp() * log_m).sum(-1))
    avg = sum(
        batch.log_q[..., z].exp()
        * distrib_loss(logits, replace(batch, x1=torch.full_like(batch.x1, z), log_q=None), path)
        for z in range(3)
    )
    torch.testing.assert_close(avg, soft)


def test_clamped_mc_cross_entropy_is_the_floored_token_log_loss():
    """MATH.md §3.4, §8 item 6: with a clamp the Monte Carlo L_distrib is −max(log m^i(x_1^i), clamp) per loss
    position — the plain cross-entropy where the model gives x_1^i more than e^clamp, the floor elsewhere."""
    path = UniformPath(5)
    batch, logits = _random_batch(path, B=3, L=4, dtype=F64)
    logits = logits.clone()
    logits[0, 0] = 0.0
    logits[0, 0, batch.x1[0, 0]] = -100.0  # far below the floor
    log_m = torch.log_softmax(logits, -1).gather(-1, batch.x1.unsqueeze(-1)).squeeze(-1)
    got = distrib_loss(logits, batch, path, clamp=-30.0)
    torch.testing.assert_close(got, torch.where(batch.loss_mask, -log_m.clamp_min(-30.0), 0.0))
    assert got[0, 0] == 30.0
    torch.testing.assert_close(distrib_loss(logits, batch, path, clamp=-1e9), distrib_loss(logits, batch, path))


def test_reduce_loss_per_token_and_sequence_weights():
    """Reduction (MATH.md §3.4): (1/B) Σ_b ω_b w_b (1/L) Σ_{i ∈ mask} ℓ_b^i; [B]-shaped losses are taken as summed."""
    B, L = 3, 4
    per_pos = torch.arange(B * L, dtype=F64).reshape(B, L)
    mask = torch.tensor([[1, 0, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    batch = TargetBatch(
        torch.zeros(B, L, dtype=torch.long), torch.zeros(B), torch.zeros(B, L, dtype=torch.long), mask
    )
    omega = torch.tensor([1.0, 2.0, 3.0], dtype=F64)
    w = torch.tensor([0.5, 1.0, 4.0], dtype=F64)
    per_seq = torch.tensor([0 + 2, 4 + 5 + 6 + 7, 0], dtype=F64)
    torch.testing.assert_close(reduce_loss(per_pos, batch, omega), (omega * per_seq).mean() / L)
    torch.testing.assert_close(
        reduce_loss(per_pos, batch.with_weight(w), omega), (omega * w * per_seq).mean() / L
    )
    torch.testing.assert_close(reduce_loss(per_seq, batch, None), per_seq.mean() / L)


@pytest.mark.parametrize("antithetic", [True, False])
def test_times_in_unit_interval_and_antithetic_spacing(antithetic):
    """t ∈ [0, 1); antithetic draws are one uniform shift of the grid k/B (MATH.md §3.4)."""
    objective = Objective(MaskedPath(3), antithetic=antithetic)
    B = 32
    for seed in range(20):
        t = objective.sample_t(B, generator=torch.Generator().manual_seed(seed))
        assert t.shape == (B,) and ((t >= 0) & (t < 1)).all()
        if antithetic:
            gaps = torch.diff(torch.sort(t.double()).values)
            torch.testing.assert_close(gaps, torch.full_like(gaps, 1.0 / B), atol=1e-6, rtol=0)


def test_weightings():
    """ω registry: κ_t (= path.kappa), 1, α̇_t = κ_t (1 − α_t); callables pass through."""
    path = MaskedPath(3, PolynomialSchedule(2.0))
    t = torch.tensor([0.1, 0.5, 0.9], dtype=F64)
    torch.testing.assert_close(WEIGHTINGS["kappa"](path, t), path.kappa(t))
    torch.testing.assert_close(WEIGHTINGS["none"](path, t), torch.ones_like(t))
    torch.testing.assert_close(WEIGHTINGS["alpha_dot"](path, t), path.kappa(t) * (1 - t**2))


def test_objective_interface_and_metrics():
    """Objective(model, batch, generator) → (scalar loss with grad, dict of detached 0-d tensors); the same seed
    gives the same loss."""
    V = 6
    path = UniformPath(V)
    emb = torch.nn.Embedding(V, V)
    x1 = torch.randint(0, V, (8, 5), generator=torch.Generator().manual_seed(0))
    objective = Objective(path, loss="score", divergence="squared", weighting="uniform")
    loss, metrics = objective(lambda xt, t: emb(xt), x1, torch.Generator().manual_seed(1))
    assert loss.dim() == 0 and loss.requires_grad
    assert set(metrics) == {"loss", "loss_unweighted", "loss_positions", "t_mean"}
    assert all(torch.is_tensor(v) and v.dim() == 0 and not v.requires_grad for v in metrics.values())
    assert float(metrics["loss"]) == pytest.approx(float(metrics["loss_unweighted"]), rel=1e-6)  # ω = 1
    again, _ = objective(lambda xt, t: emb(xt), x1, torch.Generator().manual_seed(1))
    assert again.item() == loss.item()
    loss.backward()
    assert emb.weight.grad.isfinite().all()


def test_objective_accepts_custom_losses_weightings_and_targets():
    """New losses, weightings and targets plug in without changes to objectives (DESIGN.md)."""
    V = 4
    path = MaskedPath(V)

    def sequence_loss(logits, batch, path):  # a per-sequence [B] loss
        return logits.float().logsumexp(-1).sum(-1)

    class HalfWeight(DataTarget):
        def __call__(self, batch, t, path, generator=None, **models):
            return super().__call__(batch, t, path, generator, **models).with_weight(torch.full_like(t, 0.5))

    x1 = torch.randint(0, V, (4, 3), generator=torch.Generator().manual_seed(0))
    model = lambda xt, t: torch.zeros(*xt.shape, V)
    obj = Objective(path, HalfWeight(), loss=sequence_loss, weighting=lambda p, t: 2 * torch.ones_like(t))
    loss, _ = obj(model, x1, torch.Generator().manual_seed(0))
    torch.testing.assert_close(loss, torch.tensor(math.log(V)))  # 0.5 · 2 · L log V / L


def test_objective_rejects_bad_configuration():
    """Unknown loss / weighting / divergence names, unknown options and wrong logits shapes give a ValueError."""
    path = MaskedPath(4)
    for kwargs, msg in [
        ({"loss": "nope"}, "unknown loss"),
        ({"weighting": "nope"}, "unknown time weighting"),
        ({"loss": "distrib", "divergence": "nope"}, "unknown divergence"),
        ({"loss": "score", "divergence": "nope"}, "unknown Bregman generator"),
        ({"loss": "score", "clmap": -10.0}, "invalid options"),
    ]:
        with pytest.raises(ValueError, match=msg):
            Objective(path, **kwargs)
    x1 = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="expected \\[B, L, V\\]"):
        Objective(path)(lambda xt, t: torch.zeros(2, 3, 5), x1)


def _devices():
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("loss", ["distrib", "score"])
def test_device_follows_inputs(device, loss):
    """Nothing is pinned to a device: everything follows x1, the model and the generator."""
    V = 5
    path = MaskedPath(V)
    emb = torch.nn.Embedding(path.num_states, V).to(device)
    x1 = torch.randint(0, V, (4, 6), device=device)
    g = torch.Generator(device=device).manual_seed(0)
    loss_value, _ = Objective(path, loss=loss)(lambda xt, t: emb(xt), x1, g)
    assert loss_value.device.type == device
    loss_value.backward()


@pytest.mark.parametrize("loss", ["distrib", "score"])
def test_batch_without_loss_positions(loss):
    """At t = 1 nothing is masked: the loss is exactly 0, and backward still runs (zero gradient)."""
    V = 4
    path = MaskedPath(V)
    emb = torch.nn.Embedding(path.num_states, V)
    x1 = torch.randint(0, V, (3, 5), generator=torch.Generator().manual_seed(0))
    batch = DataTarget()(x1, torch.ones(3), path)
    assert not batch.loss_mask.any()
    value, metrics = Objective(path, loss=loss).loss_from_batch(emb(batch.xt), batch)
    assert value.item() == 0.0 and metrics["loss_positions"] == 0.0
    value.backward()
    assert (emb.weight.grad == 0).all()


@pytest.mark.parametrize("antithetic", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, F64])
def test_times_never_round_up_to_one(monkeypatch, antithetic, dtype):
    """A float64 draw just below 1 must not become t = 1 after the cast (κ_1 is the floored 1/tiny ≈ 1e38)."""
    import tcsm.paths.timesteps as ts

    def rand(size, **kwargs):  # every uniform draw is 1 − 1e-12
        return torch.full(size if isinstance(size, tuple) else (size,), 1 - 1e-12, dtype=F64)

    monkeypatch.setattr(ts.torch, "rand", rand)
    t = ts.sample_times(4 if not antithetic else 1, antithetic=antithetic, dtype=dtype)
    assert (t < 1).all() and (t > 0.99).all()
    assert MaskedPath(3).kappa(t).max() < 1e13
