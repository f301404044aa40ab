"""The block path's likelihood bound (MATH.md §9): the sum over blocks of each block's bound, checked against
exact enumeration on tiny sources."""

from __future__ import annotations

import math

import pytest
import torch

from tcsm.evaluation.exact import EnumerableDistribution, ExactBlockDenoiser
from tcsm.evaluation.likelihood import nelbo, nelbo_terms
from tcsm.models.kinds import DENOISER, ModelKind
from tcsm.paths import MaskedPath, UniformPath

BLOCKS = ModelKind("denoiser", "blocks", None, "an exact block denoiser (test oracle)", blocks=True)


pytestmark = pytest.mark.usefixtures("one_thread")


class FullAsBlock:
    """A full-sequence denoiser declared as a one-block model (B = L): it ignores x1."""

    model_kind = BLOCKS

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, xt, t, x1=None):
        return self.fn(xt, t.reshape(xt.shape[0], -1)[:, 0])


def _path(kind, V, k):
    return MaskedPath(V, block_length=k) if kind == "masked" else UniformPath(V, block_length=k)


@pytest.mark.parametrize("kind", ["masked", "uniform"])
@pytest.mark.parametrize("L,k", [(4, 2), (3, 1)])
def test_block_bound_is_tight_at_the_exact_block_posterior(kind, L, k):
    """[oracle ix.a] With the exact block denoiser every block's bound is −log p_1(x^b | x^{<b}), so their sum
    estimates −log p_1(x) without bias, for every x (|estimate − NLL| ≤ 4 se)."""
    V = 2
    d = EnumerableDistribution.random(V, L, seed=5)
    path = _path(kind, V, k)
    x1 = d.states
    terms = nelbo_terms(ExactBlockDenoiser(d, path, k), x1, path, num_t=600, generator=torch.Generator().manual_seed(0))
    est, se = terms.mean(0), terms.std(0) / math.sqrt(terms.shape[0])
    nll = -d.log_prob(x1)
    assert ((est - nll).abs() <= 4 * se + 1e-9).all(), (est - nll) / se


def test_one_position_blocks_give_the_autoregressive_nll_with_zero_variance():
    """[oracle ix.b] B = 1 on the masked path with the linear schedule: the only x_t that pays is the masked position, with weight
    (1 − α_t) κ_t = α̇_t = 1, so every draw is −Σ_i log m(x^i | x^{<i}): the exact AR NLL at the optimum."""
    V, L = 3, 3
    d = EnumerableDistribution.random(V, L, seed=2)
    path = MaskedPath(V, block_length=1)
    x1 = d.states[[0, 7, 13, 26]]
    terms = nelbo_terms(ExactBlockDenoiser(d, path, 1), x1, path, num_t=7, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(terms, (-d.log_prob(x1)).expand(7, -1).to(terms.dtype), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kind", ["masked", "uniform"])
def test_one_block_reproduces_the_full_sequence_bound_on_the_same_draws(kind):
    """B = L: the block estimator draws the same t and x_t as the full-sequence one and returns the same terms."""
    V, L = 3, 3
    d = EnumerableDistribution.random(V, L, seed=4)
    full = MaskedPath(V) if kind == "masked" else UniformPath(V)
    fn = d.denoiser(full)
    x1 = d.states[[1, 5, 20]]
    a = nelbo_terms(fn, x1, full, num_t=5, generator=torch.Generator().manual_seed(9))
    b = nelbo_terms(FullAsBlock(fn), x1, _path(kind, V, L), num_t=5, generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_block_bound_is_an_upper_bound_for_a_wrong_model():
    """A perturbed block model still gets a valid bound: its estimate is ≥ −log p_1 of the data on average."""
    V, L, k = 2, 4, 2
    d = EnumerableDistribution.random(V, L, seed=8)
    path = _path("masked", V, k)
    exact = ExactBlockDenoiser(d, path, k)

    class Tempered:
        model_kind = BLOCKS

        def __call__(self, xt, t, x1=None):
            return 0.3 * exact(xt, t, x1)

    x1 = d.sample(64, generator=torch.Generator().manual_seed(1))
    est = nelbo(Tempered(), x1, path, num_t=64, generator=torch.Generator().manual_seed(2))
    assert float(est.mean()) > float(-d.log_prob(x1).mean())


def test_block_length_must_divide_the_sequence():
    path = MaskedPath(3, block_length=2)
    with pytest.raises(ValueError, match="not a multiple of path.block_length=2"):
        nelbo_terms(lambda xt, t: torch.zeros(*xt.shape, 3), torch.zeros(2, 3, dtype=torch.long), path)
    with pytest.raises(ValueError, match="block_length must be a positive integer"):
        MaskedPath(3, block_length=0)
    assert DENOISER.blocks is False


def test_evaluate_bound_reports_each_blocks_bits_per_token():
    """The dataset bound is the mean over blocks of `block_bpc` (each block's bits per token), and matches `nelbo`."""
    from tcsm.evaluation.likelihood import evaluate_bound

    V, L, k = 2, 4, 2
    d = EnumerableDistribution.random(V, L, seed=3)
    path = _path("masked", V, k)
    data = d.sample(12, generator=torch.Generator().manual_seed(0))
    model = ExactBlockDenoiser(d, path, k)
    res = evaluate_bound(model, data, path, batch_size=5, num_t=4, generator=torch.Generator().manual_seed(1))
    assert res["block_length"] == 2 and len(res["block_bpc"]) == 2
    assert abs(sum(res["block_bpc"]) / 2 - res.bpc) < 1e-5
    g = torch.Generator().manual_seed(1)
    direct = torch.cat([nelbo(model, data[s : s + 5], path, num_t=4, generator=g) for s in range(0, 12, 5)])
    assert abs(float(direct.mean()) / L / math.log(2) - res.bpc) < 1e-9
