"""Density-ratio post-training (MATH.md §5.1, §8 items 11–14) checked by exact enumeration (V = 3, L = 2).

Every expectation is an exact weighted sum: "data" weights p_t(x_t) p_{1|t}(x_1 | x_t) and "ref" weights
p_t(x_t) p^ref_{1|t}(x_1 | x_t) over all (x_t, x_1) pairs, for a random factorized tabular reference. The losses
are then minimised over tabular parameters (one log-ratio per pair, or a tabular factorized student).
"""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from dre_oracles import energy_log_marginals, estimate_log_partition, strategy_i_loss, strategy_ii_loss

from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.models.transformer import build_denoiser
from tcsm.paths import MaskedPath, UniformPath
from tcsm.posttrain.dre.losses import (
    DRE_LOSSES,
    draw_reference_samples,
    dre_loss,
    energy_log_ratio,
    factorized_log_ratio,
    log_mean_exp,
)
from tcsm.posttrain.dre.ratio_head import RatioHead, RatioHeadConfig

PATHS = {"masked": MaskedPath, "uniform": UniformPath}
LOSSES = sorted(DRE_LOSSES)
V, L = 3, 2


pytestmark = pytest.mark.usefixtures("one_thread")


class Problem:
    """All (x_t, x_1) pairs at one t, with exact data/ref weights and a random factorized tabular reference."""

    def __init__(self, dist, source, t=0.5, seed=0):
        self.dist, self.path = dist, PATHS[source](dist.vocab_size)
        S = self.path.num_states
        self.xt = torch.tensor(list(itertools.product(range(S), repeat=L)), dtype=torch.long)  # [T, L]
        T, N = self.xt.shape[0], dist.states.shape[0]
        self.t = torch.full((T,), t, dtype=torch.float64)
        self.x1 = dist.states.expand(T, N, L)  # every clean sequence for every x_t
        pos = torch.arange(L)
        lk = self.path.log_kernel(self.xt, self.t)  # [T, L, V]
        log_pt = torch.logsumexp(dist.log_probs + lk[:, pos, dist.states].sum(-1), dim=-1)  # [T]
        self.log_post = dist.log_posterior(self.xt, self.t, self.path)  # [T, N]
        g = torch.Generator().manual_seed(seed)
        self.ref_lp = torch.log_softmax(torch.randn(T, L, V, generator=g, dtype=torch.float64), dim=-1)
        self.mask = self.path.loss_mask(self.xt)  # [T, L]
        # p^ref(x_1|x_t) = Π_{i∈M} m^ref_i(x_1^i) · Π_{i∉M} 1[x_1^i = x_t^i] (carry-over), built independently.
        drawn = self.ref_lp[:, pos, dist.states]  # [T, N, L]
        carried = torch.where(self.x1 == self.xt[:, None, :], 0.0, -math.inf).double()
        self.log_pref = torch.where(self.mask[:, None, :], drawn, carried).sum(-1)
        self.w_data = torch.exp(log_pt[:, None] + self.log_post)
        self.w_ref = torch.exp(log_pt[:, None] + self.log_pref)
        self.true_log_r = self.log_post - self.log_pref
        self.support = self.w_ref > 0

    def loss(self, log_r, bregman):
        return dre_loss(
            log_r, log_r, bregman, data_weight=self.w_data, ref_weight=self.w_ref, reduction="sum"
        )


def _minimise(params, closure_loss, iters=400, rounds=5):
    opt = torch.optim.LBFGS(
        params,
        lr=1.0,
        max_iter=iters,
        tolerance_grad=1e-13,
        tolerance_change=1e-16,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        loss = closure_loss()
        loss.backward()
        return loss

    for _ in range(rounds):
        opt.step(closure)
    return float(closure_loss().detach())


def _diag_hessian(loss_fn, f):
    """Diagonal of the Hessian of a loss that is separable in the entries of f (one term per entry)."""
    f = f.detach().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss_fn(f), f, create_graph=True)
    (hess,) = torch.autograd.grad(grad.sum(), f)
    return grad.detach(), hess


def _newton_polish(loss_fn, f, mask, steps=30):
    """Newton steps on a separable loss: LSIF in log space is flat where r ≪ 1 (curvature p²/p^ref at the
    optimum), which first-order methods crawl through; near the optimum it is convex and Newton is exact."""
    for _ in range(steps):
        grad, hess = _diag_hessian(loss_fn, f)
        step = torch.where(mask & (hess > 0), grad / hess.clamp_min(1e-300), torch.zeros_like(grad))
        f = f - step.clamp(-1.0, 1.0)
    return f


@pytest.fixture(scope="module")
def dist():
    return EnumerableDistribution.random(V, L, seed=3, concentration=1.0)


@pytest.fixture(scope="module")
def product_dist():
    # A product p_1 has a factorized posterior p_{1|t} for both sources, so a factorized student can reach it.
    g = torch.Generator().manual_seed(4)
    marg = torch.softmax(torch.randn(L, V, generator=g, dtype=torch.float64), dim=-1)
    states = torch.tensor(list(itertools.product(range(V), repeat=L)))
    return EnumerableDistribution(marg[torch.arange(L), states].prod(-1), V, L)


# --- the loss, written once from the generator ------------------------------------------------------------------


def test_generator_form_reproduces_the_appendix_table():
    """MATH.md §5.1 table, appendix sign: bce = E_data softplus(−log r) + E_ref softplus(log r) exactly;
    lsif = E_ref r²/2 − E_data r and gkl = E_ref r − E_data log r up to θ-independent constants."""
    g = torch.Generator().manual_seed(0)
    ld = torch.randn(7, generator=g, dtype=torch.float64) * 3
    lr = torch.randn(5, 4, generator=g, dtype=torch.float64) * 3
    wd, wr = (
        torch.rand(7, generator=g, dtype=torch.float64),
        torch.rand(5, 4, generator=g, dtype=torch.float64),
    )
    got = {n: dre_loss(ld, lr, n, data_weight=wd, ref_weight=wr) for n in LOSSES}
    m = lambda x: x.mean()
    torch.testing.assert_close(
        got["bce"], m(wd * F.softplus(-ld)) + m(wr * F.softplus(lr)), rtol=1e-12, atol=0
    )
    lsif = m(wr * lr.exp() ** 2 / 2) - m(wd * ld.exp()) + m(wd) - m(wr) / 2
    torch.testing.assert_close(got["lsif"], lsif, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got["gkl"], m(wr * lr.exp()) - m(wd * ld) - m(wd), rtol=1e-12, atol=1e-12)
    # A zero weight masks an entry whose term is infinite (gkl at log r = −inf) instead of giving NaN.
    inf = torch.tensor([-math.inf, 0.0], dtype=torch.float64)
    assert dre_loss(inf, inf, "gkl", data_weight=torch.tensor([0.0, 1.0])).isfinite()
    with pytest.raises(ValueError):
        dre_loss(ld, lr, "bogus")


# --- minimisers are the true ratio ----------------------------------------------------------------------------


@pytest.mark.parametrize("source", ["masked", "uniform"])
@pytest.mark.parametrize("bregman", LOSSES)
def test_strategy_ii_minimiser_is_true_ratio_and_self_normalised(bregman, source, dist):
    """Strategy (ii), tabular f(x_1, x_t): argmin L_DRE = log p_{1|t}/p^ref_{1|t} on supp p^ref, and the optimum is
    self-normalised, E_ref[e^{f*}] = 1 for every x_t (MATH.md §5.1, oracle vi.a–vi.d, §8 item 14)."""
    pb = Problem(dist, source)
    f = torch.zeros_like(pb.w_ref, requires_grad=True)
    _minimise([f], lambda: pb.loss(f, bregman), iters=100, rounds=1)
    f = _newton_polish(lambda x: pb.loss(x, bregman), f.detach(), pb.support)
    err = (f - pb.true_log_r)[pb.support].abs().max()
    assert err < 1e-5, err
    z = (pb.log_pref.exp() * f.exp()).sum(-1)
    torch.testing.assert_close(z, torch.ones_like(z), atol=1e-6, rtol=0)


@pytest.mark.parametrize("source", ["masked", "uniform"])
@pytest.mark.parametrize("bregman", LOSSES)
def test_strategy_i_sequence_level_minimiser_is_true_ratio(bregman, source, product_dist):
    """Strategy (i), r = Π_{i∈M} m^θ_i/m^ref_i with a tabular factorized student: when p_{1|t} factorizes, the
    minimiser has m^θ = the posterior marginals, so r^θ = p_{1|t}/p^ref_{1|t} (MATH.md §5.1, oracle vi.b)."""
    pb = Problem(product_dist, source, seed=1)
    logits = torch.zeros(pb.xt.shape[0], L, V, dtype=torch.float64, requires_grad=True)

    def log_r():
        return factorized_log_ratio(torch.log_softmax(logits, -1), pb.ref_lp, pb.x1, pb.mask)

    _minimise([logits], lambda: pb.loss(log_r(), bregman))
    err = (log_r().detach() - pb.true_log_r)[pb.support].abs().max()
    assert err < 1e-4, err
    marg = product_dist.marginals(pb.xt, pb.t, pb.path)
    m = torch.softmax(logits.detach(), -1)
    assert (m - marg)[pb.mask].abs().max() < 1e-6


@pytest.mark.parametrize("source", ["masked", "uniform"])
@pytest.mark.parametrize("bregman", LOSSES)
def test_strategy_i_token_level_minimiser_is_posterior_marginal(bregman, source, dist):
    """Strategy (i) at the N^1-conditional level (per position): for a correlated p_1 the factorized minimiser
    is m^θ_i = p_{1|t}(x_1^i = · | x_t), i.e. r_i = marginal / m^ref_i (MATH.md §3.4 factorized minimiser, §5.1)."""
    pb = Problem(dist, source, seed=2)
    logits = torch.zeros(pb.xt.shape[0], L, V, dtype=torch.float64, requires_grad=True)
    wm = pb.mask[:, None, :].double()

    def loss():
        lr = factorized_log_ratio(torch.log_softmax(logits, -1), pb.ref_lp, pb.x1, pb.mask, per_token=True)
        return dre_loss(
            lr,
            lr,
            bregman,
            data_weight=pb.w_data[..., None] * wm,
            ref_weight=pb.w_ref[..., None] * wm,
            reduction="sum",
        )

    _minimise([logits], loss)
    marg = dist.marginals(pb.xt, pb.t, pb.path)
    assert (torch.softmax(logits.detach(), -1) - marg)[pb.mask].abs().max() < 1e-6


def test_main_text_bce_sign_diverges(dist):
    """MATH.md §8 item 11 (oracle vi.e): the main-text BCE row is the log-likelihood E_data log σ(f) +
    E_ref log(1 − σ(f)) = −(implemented loss). Used as a loss, the true ratio is its *maximum* (zero gradient,
    negative curvature), it is unbounded below, and gradient descent from next to the optimum runs to |f| → ∞."""
    pb = Problem(dist, "masked")
    bad = lambda f: -pb.loss(f, "bce")
    f_star = torch.where(pb.support, pb.true_log_r, torch.zeros_like(pb.true_log_r))
    grad, hess = _diag_hessian(bad, f_star)
    # Separable in the entries: gradient 0 and curvature −(w_d + w_r) σ(f*)(1 − σ(f*)) < 0 on the support.
    assert grad.abs().max() < 1e-12 and (hess[pb.support] < 0).all()
    for c in (10.0, 100.0, 1000.0):
        assert float(bad(f_star + c * pb.support)) < float(bad(f_star)) - 0.1 * c  # unbounded below
    g = torch.Generator().manual_seed(0)
    f = (f_star + 1e-3 * torch.randn(f_star.shape, generator=g, dtype=torch.float64)).requires_grad_(True)
    opt = torch.optim.Adam([f], lr=0.5)
    for _ in range(300):
        opt.zero_grad()
        loss = bad(f)
        loss.backward()
        opt.step()
    final, f = float(loss.detach()), f.detach()
    print(f"main-text sign: loss {float(bad(f_star)):.4f} at f* → {final:.2f}, max|f| {f.abs().max():.1f}")
    assert final < float(bad(f_star)) - 10 and f[pb.support].abs().max() > 50
    # The implemented (appendix) sign from the same start stays at the optimum.
    assert float(pb.loss(f_star, "bce")) <= float(pb.loss(f, "bce"))


def test_factorized_log_ratio_counts_only_the_loss_mask():
    """Strategy (i): log r = Σ_{i∈M(x_t)} [log m^θ_i − log m^ref_i](x_1^i), and per token exactly 0 off M(x_t)
    (carry-over positions; MATH.md §5.1, §5.3), for one x_1 per row and for n per row, checked term by term.
    The minimiser tests cannot see extra carried terms: self-normalisation absorbs a constant per x_t."""
    B, n, Lx = 3, 4, 5
    g = torch.Generator().manual_seed(0)
    stu = torch.log_softmax(torch.randn(B, Lx, V, generator=g, dtype=torch.float64), -1)
    ref = torch.log_softmax(torch.randn(B, Lx, V, generator=g, dtype=torch.float64), -1)
    mask = torch.tensor([[1, 0, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 0, 1, 1]], dtype=torch.bool)
    for x1 in (torch.randint(0, V, (B, Lx), generator=g), torch.randint(0, V, (B, n, Lx), generator=g)):
        per = factorized_log_ratio(stu, ref, x1, mask, per_token=True)
        seq = factorized_log_ratio(stu, ref, x1, mask)
        assert per.shape == x1.shape and seq.shape == x1.shape[:-1]
        flat, per_flat = x1.reshape(B, -1, Lx), per.reshape(B, -1, Lx)
        for b, j, i in itertools.product(range(B), range(flat.shape[1]), range(Lx)):
            y = flat[b, j, i]
            want = float(stu[b, i, y] - ref[b, i, y]) if mask[b, i] else 0.0
            assert float(per_flat[b, j, i]) == pytest.approx(want, abs=1e-12)
        torch.testing.assert_close(seq, per.sum(-1))


# --- negatives, reference gradients, models ---------------------------------------------------------------------


@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_reference_samples_follow_factorized_reference_with_carry_over(source, dist):
    """x̂ ~ Π_{i∈M} m^ref_i with x̂^i = x_t^i off M (MATH.md §5.1 negatives): empirical law = exact p^ref."""
    pb = Problem(dist, source, seed=5)
    n = 20000
    g = torch.Generator().manual_seed(0)
    row = 7  # masked: x_t = (2, M)-style state with one carry-over; uniform: an arbitrary state
    x_hat = draw_reference_samples(pb.ref_lp[row : row + 1], pb.xt[row : row + 1], pb.path, n, g)
    assert x_hat.shape == (1, n, L)
    emp = torch.bincount(dist.index(x_hat[0]), minlength=dist.states.shape[0]).double() / n
    assert 0.5 * (emp - pb.log_pref[row].exp()).abs().sum() < 0.02
    fixed = torch.tensor([[True, False]])
    pinned = draw_reference_samples(
        pb.ref_lp[:1], pb.xt[:1], pb.path, 50, g, fixed=fixed, values=torch.tensor([[1, 0]])
    )
    assert (pinned[..., 0] == 1).all()


def _tiny_models(path, seed=0):
    torch.manual_seed(seed)
    ref = build_denoiser("tiny", vocab_size=V, num_states=path.num_states, max_len=8)
    with torch.no_grad():  # a non-uniform reference (the head is zero-initialised)
        ref.head.weight.normal_(0, 0.5)
    return ref


@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_reference_parameters_never_change(source, dist):
    """Gradients of both strategies reach only the student / the ratio head; an optimiser step over everything
    that has a gradient leaves the frozen reference bit-for-bit unchanged (MATH.md §5.1 reference choices)."""
    path = PATHS[source](V)
    ref = _tiny_models(path)
    before = copy.deepcopy(ref.state_dict())
    student = copy.deepcopy(ref)
    head = RatioHead.from_denoiser(ref)
    with torch.no_grad():
        head.out.weight.normal_(0, 0.1)  # so the trunk gets a gradient too
    g = torch.Generator().manual_seed(0)
    x1 = dist.sample(16, g)
    t = torch.rand(16, generator=g)
    xt = path.draw_xt(x1, t, g)
    loss = strategy_i_loss(student, ref, path, x1, xt, t, bregman="lsif", num_negatives=3, generator=g)
    loss = loss + strategy_i_loss(student, ref, path, x1, xt, t, per_token=True, generator=g)
    loss = loss + strategy_ii_loss(head, ref, path, x1, xt, t, bregman="gkl", num_negatives=4, generator=g)
    loss.backward()
    assert all(p.grad is None for p in ref.parameters())
    assert student.head.weight.grad.abs().sum() > 0 and student.embed.weight.grad.abs().sum() > 0
    assert head.out.weight.grad.abs().sum() > 0 and head.embed_clean.weight.grad.abs().sum() > 0
    params = [p for p in [*ref.parameters(), *student.parameters(), *head.parameters()] if p.grad is not None]
    torch.optim.SGD(params, lr=1.0).step()
    assert all(torch.equal(before[k], v) for k, v in ref.state_dict().items())


def test_ratio_head_starts_at_zero_and_copies_the_reference_trunk():
    """f ≡ 0 at init (p^θ = p^ref); from_denoiser copies every matching trunk tensor without sharing storage;
    f depends on both x_1 and x_t once the readout is non-zero."""
    path = MaskedPath(V)
    ref = _tiny_models(path, seed=1)
    head = RatioHead.from_denoiser(ref)
    g = torch.Generator().manual_seed(0)
    x1 = torch.randint(0, V, (5, 6), generator=g)
    xt = torch.where(torch.rand(5, 6, generator=g) < 0.5, x1, path.mask_id)
    assert torch.equal(head(x1, xt, torch.rand(5)), torch.zeros(5))
    hs, rs = head.state_dict(), ref.state_dict()
    shared = [k for k in hs if k in rs]
    assert "blocks.0.attn.qkv.weight" in shared and "embed.weight" in shared
    for k in shared:
        assert torch.equal(hs[k], rs[k]) and hs[k].data_ptr() != rs[k].data_ptr()
    assert torch.equal(hs["embed_clean.weight"], rs["embed.weight"][:V])
    with torch.no_grad():
        head.out.weight.normal_(0, 1.0)
    t = torch.full((5,), 0.3)
    f = head(x1, xt, t)
    assert f.shape == (5,) and f.dtype == torch.float32
    x1b = x1.clone()
    x1b[:, -1] = (x1b[:, -1] + 1) % V
    assert not torch.allclose(head(x1b, xt, t), f)  # the last clean token reaches the pooled scalar
    assert not torch.allclose(head(x1, torch.full_like(xt, path.mask_id), t), f)
    with pytest.raises(ValueError):
        head(x1[:, :3], xt, t)
    cfg = RatioHeadConfig(
        vocab_size=V,
        num_states=V,
        max_len=8,
        d_model=32,
        n_layers=1,
        n_heads=2,
        time_conditioning=False,
        cond_dim=16,
    )
    assert RatioHead(cfg)(x1, x1).shape == (5,)


def test_energy_log_ratio_batches_candidates():
    """f for [B, n, L] candidates equals row-by-row evaluation with x_t and t repeated."""
    energy = lambda x1, xt, t: (x1 * 3 + xt).sum(-1).double() * t
    x1 = torch.randint(0, V, (4, 5, L))
    xt = torch.randint(0, V, (4, L))
    t = torch.rand(4, dtype=torch.float64)
    got = energy_log_ratio(energy, x1, xt, t)
    want = torch.stack([energy(x1[:, j], xt, t) for j in range(5)], dim=1)
    torch.testing.assert_close(got, want)


# --- the normaliser ---------------------------------------------------------------------------------------------


def _energy_table(pb, seed=0, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(pb.xt.shape[0], pb.dist.states.shape[0], generator=g, dtype=torch.float64) * scale
    S = pb.path.num_states
    radix = S ** torch.arange(L - 1, -1, -1)

    def energy(x1, xt, t):
        return table[(xt * radix).sum(-1), pb.dist.index(x1)]

    return table, energy


def test_log_partition_estimate_is_biased_low_and_converges(dist):
    """log Ẑ_n = log mean_j e^{f(x̂_j)}: E[log Ẑ_1] = E_ref[f] < log Z (Jensen); the bias is negative, shrinks with n,
    and for large n ≈ −Var_ref[e^f]/(2 n Z²) (MATH.md §5.1, §8 item 14)."""
    pb = Problem(dist, "masked", seed=6)
    table, energy = _energy_table(pb)
    row = pb.xt.shape[0] - 1  # x_t = (M, M): every position drawn
    p_ref = pb.log_pref[row].exp()
    log_z = float(torch.logsumexp(pb.log_pref[row] + table[row], 0))
    e_f = float((p_ref * table[row]).sum())
    z = math.exp(log_z)
    var = float((p_ref * (table[row].exp() - z) ** 2).sum())
    R = 4000
    g = torch.Generator().manual_seed(1)
    lp = pb.ref_lp[row : row + 1].expand(R, L, V)
    xt = pb.xt[row : row + 1].expand(R, L)
    t = torch.full((R,), 0.5, dtype=torch.float64)
    bias = {}
    for n in (1, 4, 16, 256):
        est = estimate_log_partition(energy, lp, xt, t, pb.path, n, g)
        mean, se = float(est.mean()), float(est.std()) / math.sqrt(R)
        bias[n] = (mean - log_z, se)
    print("log Z =", round(log_z, 4), "bias(n) =", {n: round(b, 4) for n, (b, _) in bias.items()})
    assert abs(bias[1][0] - (e_f - log_z)) < 4 * bias[1][1]  # n = 1: exactly E_ref f − log Z
    assert bias[1][0] < -0.3 and bias[1][0] < bias[4][0] < bias[16][0] < 0
    assert abs(bias[256][0] + var / (2 * 256 * z * z)) < 4 * bias[256][1] + 1e-3
    assert abs(bias[256][0]) < 0.01
    torch.testing.assert_close(log_mean_exp(torch.tensor([0.0, math.log(3.0)])), torch.tensor(math.log(2.0)))


@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_energy_log_marginals_converge_to_exact_marginals(source, dist):
    """log m̂^θ_i(y|x_t) → log p^θ_{1|t}(x_1^i = y | x_t) for p^θ ∝ p^ref e^f (MATH.md §5.1 likelihood): exact
    marginals by enumeration vs the estimate with n = 20000; carry-over positions are δ_{x_t^i}."""
    pb = Problem(dist, source, seed=7)
    table, energy = _energy_table(pb, seed=3, scale=1.0)
    rows = torch.tensor([0, 5, 8])
    log_pt = pb.log_pref[rows] + table[rows]
    p_theta = torch.softmax(log_pt, -1)  # [3, N]
    exact = torch.einsum("bn,nlv->blv", p_theta, F.one_hot(dist.states, V).double())
    g = torch.Generator().manual_seed(0)
    t = torch.full((3,), 0.5, dtype=torch.float64)
    est = energy_log_marginals(energy, pb.ref_lp[rows], pb.xt[rows], t, pb.path, 20000, g)
    assert est.shape == (3, L, V)
    assert (est.exp() - exact).abs().max() < 0.02
    one = energy_log_marginals(
        energy,
        pb.ref_lp[rows],
        pb.xt[rows],
        t,
        pb.path,
        20000,
        g,
        tokens=dist.states[[4, 4, 4]].unsqueeze(-1),
    )
    assert one.shape == (3, L, 1)
    torch.testing.assert_close(
        one[..., 0].exp(), exact.gather(-1, dist.states[[4, 4, 4]].unsqueeze(-1))[..., 0], atol=0.02, rtol=0
    )
