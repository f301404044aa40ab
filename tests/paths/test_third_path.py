"""A third noise source, defined only here, runs through the generic likelihood and sampling code.

The source is a mask-plus-uniform mixture path (MATH.md §1.1 with another source law π):

    k_t(x_t | x_1) = α_t 1[x_t = x_1] + (1 − α_t) π(x_t),   π(M) = ρ,  π(y) = (1 − ρ)/V for clean y.

Its admissible bound is the DFM bound (MATH.md §2.3 A), which holds for every mixture path: the conditional
rates κ_t(1[y = x_1] − 1[y = x_t]) generate the path for any π (§1.2), the model CTMC jumps at rate κ_t m(y)
to clean y ≠ x_t, and §2.1 gives G = Σ_i [x_t^i = x_1^i] (1 − m(x_t^i)) + [x_t^i ≠ x_1^i] (−log m(x_1^i) − m(x_t^i)),
with m(M) = 0. Nothing in tcsm.evaluation.likelihood or tcsm.sampling knows this path; the tests check the identities
that hold for any correct path implementation, by exact enumeration (V = 3, L = 2).
"""

from __future__ import annotations

import math

import pytest
import torch

from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.evaluation.likelihood import _sample_xt, nelbo, nelbo_terms
from tcsm.paths import ProbabilityPath
from tcsm.paths.bounds import default_bound
from tcsm.sampling import may_cache, sample


def _col(v, like):
    """[B] → [B, 1, …] broadcasting against `like`."""
    return v.reshape(v.shape + (1,) * (like.dim() - v.dim()))


class MaskUniformPath(ProbabilityPath):
    """k_t(x_t | x_1) = α_t 1[x_t = x_1] + (1 − α_t) π(x_t), π = ρ δ_M + (1 − ρ) Unif(clean)."""

    kind = "mask+uniform"
    bounds = ("dfm",)
    # The defaults of posterior_depends_on_t (True), absorbing (False) and integrand_zero_at_x1 (False) fit.

    def __init__(self, vocab_size, rho=0.5, schedule=None):
        super().__init__(vocab_size, schedule)
        self.rho = float(rho)
        self.mask_id = self.vocab_size
        self.num_states = self.vocab_size + 1

    def _pi(self, x):
        """π(x) for noisy tokens x (any shape), float64."""
        pc = torch.full(x.shape, (1.0 - self.rho) / self.vocab_size, dtype=torch.float64)
        return torch.where(x == self.mask_id, self.rho, pc)

    def prior_sample(self, batch_size, length, device=None, generator=None):
        u = torch.rand((batch_size, length), device=device, generator=generator)
        tok = torch.randint(0, self.vocab_size, (batch_size, length), device=device, generator=generator)
        return torch.where(u < self.rho, self.mask_id, tok)

    def noise(self, xs, s, t, generator=None):
        # Keep x_s with probability α_t/α_s, else redraw from π: the mixture path's noising chain (§1.1).
        keep_p = self.alpha(t) / self.alpha(s).clamp_min(1e-300)
        keep = torch.rand(xs.shape, generator=generator) < _col(keep_p, xs)
        return torch.where(keep, xs, self.prior_sample(*xs.shape, generator=generator))

    def log_kernel(self, xt, t):
        a = _col(self.alpha(t).double(), xt).unsqueeze(-1)
        hit = (xt.unsqueeze(-1) == torch.arange(self.vocab_size)).double()
        return torch.log(a * hit + (1.0 - a) * self._pi(xt).unsqueeze(-1))

    def free(self, xt):
        return torch.ones_like(xt, dtype=torch.bool)  # a clean-looking token may still be noise

    def corrupt_prob(self, t):
        return self.schedule.one_minus_alpha(t) * (1.0 - (1.0 - self.rho) / self.vocab_size)

    def corrupt(self, x1, t, generator=None):
        V, rho = self.vocab_size, self.rho
        u = torch.rand(x1.shape, generator=generator, dtype=torch.float64)
        other = (x1 + torch.randint(1, V, x1.shape, generator=generator)) % V
        return torch.where(u < rho / (1.0 - (1.0 - rho) / V), self.mask_id, other)

    def prior_kl(self, x1, dtype=torch.float64):
        a0 = self._alpha0(dtype, x1.device)
        pc = (1.0 - self.rho) / self.vocab_size
        hit = a0 + (1.0 - a0) * pc
        kl = hit * math.log(hit / pc) + (1.0 - hit) * (math.log1p(-a0) if a0 < 1 else 0.0)
        return torch.full((x1.shape[0],), x1.shape[1] * kl, dtype=dtype)

    def bound_integrand(self, bound, logits, x1, xt, t):
        assert bound == "dfm"
        logm = torch.log_softmax(logits.double(), -1)
        clean = xt < self.vocab_size
        m_x = torch.where(clean, logm.gather(-1, xt.clamp_max(self.vocab_size - 1).unsqueeze(-1)).squeeze(-1).exp(), 0.0)
        nll = -logm.gather(-1, x1.unsqueeze(-1)).squeeze(-1)
        g = torch.where(xt == x1, 1.0 - m_x, nll - m_x)
        return self.kappa(t), g.sum(-1).to(t.dtype)

    def bridge(self, xt, t, s, probs):
        # p(x_s = y | x_t, a) = p(x_t | x_s = y) k_s(y | a) / k_t(x_t | a), averaged over a ~ m (§6.2).
        V = self.vocab_size
        a_t = _col(self.alpha(t).double(), xt).unsqueeze(-1)
        a_s = _col(self.alpha(s).double(), xt).unsqueeze(-1)
        r = a_t / a_s.clamp_min(1e-300)
        pi_x = self._pi(xt).unsqueeze(-1)
        hit = (xt.unsqueeze(-1) == torch.arange(V)).double()
        w = probs.double() / (a_t * hit + (1.0 - a_t) * pi_x)  # m(a) / k_t(x_t | a)
        states = torch.arange(V + 1)
        pi_y = self._pi(states)
        k_s_sum = torch.cat([a_s * w, torch.zeros_like(w[..., :1])], -1) + (1.0 - a_s) * pi_y * w.sum(-1, keepdim=True)
        fwd = r * (xt.unsqueeze(-1) == states).double() + (1.0 - r) * pi_x
        out = fwd * k_s_sum
        return out / out.sum(-1, keepdim=True)


V, L = 3, 2


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def path():
    return MaskUniformPath(V, rho=0.4)


@pytest.fixture(scope="module")
def dist():
    return EnumerableDistribution.random(V, L, seed=0, concentration=0.3)


def _noisy_states(path):
    import itertools

    return torch.tensor(list(itertools.product(range(path.num_states), repeat=L)), dtype=torch.long)


def _kernel_table(path, x1, t):
    """p_{t|1}(x_t | x_1) for every noisy x_t [S] at time t (float), by the product of log_kernel."""
    S = _noisy_states(path)
    lk = path.log_kernel(S, torch.full((S.shape[0],), t, dtype=torch.float64))
    return lk.gather(-1, x1.expand(S.shape[0], L).unsqueeze(-1)).squeeze(-1).sum(-1).exp()


def test_kernel_bridge_and_corruption_are_consistent(path):
    """§1.1: Σ_{x_t} k_t(x_t | x_1) = 1; the weighted event-split draw of `nelbo` has law exactly p_{t|1}; §6.2:
    the bridge of a one-hot m = δ_a satisfies B(y | x, a) k_t(x | a) = p(x_t = x | x_s = y) k_s(y | a)."""
    x1 = torch.tensor([[0, 2]])
    S = _noisy_states(path)
    radix = path.num_states ** torch.arange(L - 1, -1, -1)
    g = torch.Generator().manual_seed(0)
    n = 40_000
    for t in (0.1, 0.6, 0.97):
        exact = _kernel_table(path, x1, t)
        assert float(exact.sum()) == pytest.approx(1.0, abs=1e-12)
        xt, w = _sample_xt(x1.expand(n, L), torch.full((n,), t, dtype=torch.float64), path, g)
        est = torch.zeros(S.shape[0], dtype=torch.float64).index_add_(0, (xt * radix).sum(-1), w) / n
        assert ((est - exact).abs() <= 5 * (2 * exact / n).sqrt() + 1e-9).all(), (t, est - exact)
    t, s = torch.tensor([0.3]), torch.tensor([0.7])
    a_t, a_s = float(path.alpha(t)), float(path.alpha(s))
    pi = path._pi(torch.arange(V + 1))
    for x in range(V + 1):
        for a in range(V):
            b = path.bridge(torch.tensor([[x]]), t.double(), s.double(), torch.eye(V)[a].view(1, 1, V))[0, 0]
            k_s = a_s * (torch.arange(V + 1) == a).double() + (1 - a_s) * pi
            fwd = (a_t / a_s) * (torch.arange(V + 1) == x).double() + (1 - a_t / a_s) * pi[x]
            k_t = a_t * (x == a) + (1 - a_t) * float(pi[x])
            torch.testing.assert_close(b * k_t, fwd * k_s)


def test_nelbo_is_the_path_space_integral_and_bounds_the_nll(path, dist):
    """§2.1/§2.3 A: `nelbo` (generic Monte Carlo) is unbiased for ∫_0^1 κ_t Σ_{x_t} p_{t|1}(x_t|x_1) G(t, x_t) dt,
    computed here by enumeration and Gauss–Legendre quadrature; with the exact posterior marginals the DFM model
    CTMC ends at p_1 (§1.2), so that integral is ≥ −log p_1(x_1) (strictly: the DFM bound is not tight)."""
    assert default_bound(path) == "dfm"
    den = dist.denoiser(path)
    x1 = dist.states  # every clean sequence
    terms = nelbo_terms(den, x1, path, num_t=1000, generator=torch.Generator().manual_seed(0))
    est, se = terms.mean(0), terms.std(0) / math.sqrt(terms.shape[0])
    S = _noisy_states(path)
    nodes, weights = (torch.from_numpy(a) for a in __import__("numpy").polynomial.legendre.leggauss(200))
    ts, ws = (nodes.double() + 1) / 2, weights.double() / 2
    exact = torch.zeros(x1.shape[0], dtype=torch.float64)
    for t, wq in zip(ts.tolist(), ws.tolist()):
        tt = torch.full((S.shape[0],), t, dtype=torch.float64)
        logits = den(S, tt)
        for j in range(x1.shape[0]):
            z = x1[j : j + 1].expand(S.shape[0], L)
            w, G = path.bound_integrand("dfm", logits, z, S, tt)
            exact[j] += wq * float((_kernel_table(path, x1[j : j + 1], t) * w * G).sum())
    assert ((est - exact).abs() <= 4 * se).all(), (est - exact) / se
    nll = -dist.log_prob(x1)
    assert (exact > nll + 0.01).all(), exact - nll
    # `nelbo` adds the (zero, α_0 = 0) prior term and refuses bounds the path does not declare.
    full = nelbo(den, x1, path, num_t=4, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(full, nelbo_terms(den, x1, path, num_t=4, generator=torch.Generator().manual_seed(1)).mean(0))
    with pytest.raises(ValueError, match="uniform source"):
        nelbo(den, x1, path, bound="reversal")


def tv(p, q):
    return 0.5 * float((p - q).abs().sum())


def test_joint_bridge_sampler_is_exact(path, dist):
    """§6.2 oracle e.a: x̂_1 drawn jointly from p_{1|t}(·|x_t) and pushed through `path.bridge` gives exactly p_1
    for any step count; the factorized analytic (§6.2) and Euler (§6.1) samplers with the exact marginals
    converge to p_1 as K grows. Checked in TV within Monte Carlo error."""
    n = 20_000
    tol = 0.5 * math.sqrt(dist.states.shape[0] / n) + math.sqrt(math.log(1e6) / (2 * n))
    emp = lambda x: torch.bincount(dist.index(x), minlength=dist.states.shape[0]).double() / x.shape[0]
    for steps in (1, 3):
        x = sample(None, path, batch_size=n, length=L, num_steps=steps, seed=steps, x1_sampler=dist.x1_sampler(path))
        assert tv(emp(x), dist.probs) < tol
    den = dist.denoiser(path)
    for method in ("analytic", "euler"):
        x, st = sample(den, path, batch_size=n, length=L, num_steps=64, seed=7, method=method, return_stats=True)
        assert st.method == method and ((x >= 0) & (x < V)).all()
        assert tv(emp(x), dist.probs) < tol, method
    # Default method: the path is not absorbing, so "ancestral" is the analytic bridge.
    _, st = sample(den, path, batch_size=4, length=L, num_steps=2, seed=0, return_stats=True)
    assert st.method == "analytic"


def test_cache_follows_the_path(path, dist):
    """§1.3: this posterior depends on t, so even a denoiser that declares it ignores t is not cached."""

    class Declared:
        time_independent = True

        def __call__(self, xt, t):
            return dist.denoiser(path)(xt, t)

    assert path.posterior_depends_on_t and not may_cache(Declared(), path)
    _, st = sample(Declared(), path, batch_size=8, length=L, num_steps=4, seed=0, return_stats=True)
    assert not st.cached and st.num_calls == 4
