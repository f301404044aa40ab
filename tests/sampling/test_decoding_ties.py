"""Decoders that do what they say (issue 34, item 8; tcsm.sampling.decoding).

* Ties between positions are broken at random: on an exchangeable p_1 every position of the all-mask input has the
  same conditional, so the exact denoiser's margin / entropy / confidence scores tie at the first step; a
  leftmost rule reveals position 0 in every sequence, a random one each position with probability 1/L. With one
  position per step the order stays a function of the revealed tokens and independent noise, so the draw is
  still exactly p_1 (the chain rule in a random order; checked by exact enumeration).
* The denoiser's time is the schedule's t for the fraction revealed, t = α^{-1}(r), not r itself (they differ on a
  cosine schedule).
* The threshold order's steps are capped at `num_steps`, and its default reveals several positions per call on a
  model whose conditionals are as flat as a 27-symbol character model's.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from test_samplers import empirical, exact_denoiser, tv, tv_tol

from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.paths import MaskedPath
from tcsm.paths.schedules import (
    CosineSchedule,
    LinearSchedule,
    LogLinearSchedule,
    PolynomialSchedule,
    Schedule,
)
from tcsm.sampling import decode
from tcsm.sampling.settings import SampleSettings

pytestmark = pytest.mark.usefixtures("one_thread")


def exchangeable(V: int = 3, L: int = 3) -> EnumerableDistribution:
    """p_1(x) depends on the multiset of x only (all positions alike), and strongly correlated: it favours
    sequences of one repeated symbol."""
    states = list(itertools.product(range(V), repeat=L))
    w = [math.exp(2.0 * max(s.count(v) for v in range(V)) + 0.3 * s.count(0)) for s in states]
    return EnumerableDistribution(torch.tensor(w), V, L)


def _first_revealed(dist, method, n, seed=0, **kw):
    """The positions each sequence revealed at the first step (one per step), and the samples."""
    path = MaskedPath(dist.vocab_size)
    seen = {}

    def cb(step, t, x):
        if step == 1:
            seen["x"] = x.clone()

    x, _ = decode(exact_denoiser(dist, path), path, batch_size=n, length=dist.length, num_steps=dist.length,
                  method=method, generator=torch.Generator().manual_seed(seed), callback=cb, **kw)  # fmt: skip
    first = (seen["x"] != path.mask_id).long().argmax(-1)
    return first, x


@pytest.mark.parametrize("method", ["margin", "entropy", "confidence"])
def test_ties_at_the_first_step_are_broken_at_random(method):
    dist = exchangeable()
    n = 6000
    first, _ = _first_revealed(dist, method, n)
    freq = torch.bincount(first, minlength=dist.length).double() / n
    # uniform over the L positions (a leftmost rule gives [1, 0, 0]); 5 sd of a binomial proportion
    assert (freq - 1 / dist.length).abs().max() < 5 * math.sqrt(1 / dist.length / n), freq.tolist()


@pytest.mark.parametrize("method", ["margin", "entropy"])
def test_random_tie_breaking_keeps_one_position_per_step_exact(method):
    # identity: the chain rule of p_1 in an order chosen from revealed tokens and independent noise is p_1
    dist = exchangeable()
    n = 20000
    _, x = _first_revealed(dist, method, n, seed=1)
    assert tv(empirical(dist, x), dist.probs) < tv_tol(dist.states.shape[0], n)


def test_several_positions_per_step_are_not_always_the_leftmost_ones():
    # 4 positions, 2 steps: the first step reveals two of them; leftmost ties always give {0, 1}
    dist = exchangeable(2, 4)
    path = MaskedPath(2)
    seen = {}
    decode(exact_denoiser(dist, path), path, batch_size=2000, length=4, num_steps=2, method="margin",
           generator=torch.Generator().manual_seed(2),
           callback=lambda k, t, x: seen.setdefault(k, x.clone()))  # fmt: skip
    pairs = {tuple((row != path.mask_id).nonzero().squeeze(1).tolist()) for row in seen[1]}
    assert len(pairs) == 6  # every one of the C(4, 2) pairs occurs


# --------------------------------------------------------------------------------------------------- time


class _Curved(Schedule):
    """α_t = t³ through the base class's bisection (no closed-form inverse)."""

    def alpha(self, t):
        return t**3

    def alpha_dot(self, t):
        return 3 * t**2


@pytest.mark.parametrize(
    "schedule", [LinearSchedule(), CosineSchedule(), PolynomialSchedule(2.0), LogLinearSchedule(0.1), _Curved()]
)
def test_alpha_inverse_inverts_alpha(schedule):
    a = torch.linspace(schedule.alpha_min, 1.0, 101, dtype=torch.float64)
    t = schedule.alpha_inverse(a)
    assert ((t >= 0) & (t <= 1)).all()
    torch.testing.assert_close(schedule.alpha(t), a, atol=1e-9, rtol=0)


@pytest.mark.parametrize("method", ["confidence", "random", "threshold"])
def test_the_denoiser_sees_the_schedules_time_for_the_fraction_revealed(method):
    V, L = 4, 8
    path = MaskedPath(V, CosineSchedule())
    calls = []

    def den(xt, t):  # a time-conditioned model: record what it is asked
        calls.append((xt.clone(), t.clone()))
        return torch.randn(xt.shape[0], L, V, generator=torch.Generator().manual_seed(len(calls)))

    fixed = torch.zeros(2, L, dtype=torch.bool)
    fixed[:, :2] = True  # a prompt: the fraction counts the free positions only
    decode(den, path, batch_size=2, length=L, num_steps=6, method=method, fixed=fixed,
           values=torch.ones(2, L, dtype=torch.long), threshold=0.5,
           generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert len(calls) >= 2
    for xt, t in calls:
        revealed = 1.0 - (xt == V).sum(-1).double() / (L - 2)
        assert t.dtype == torch.get_default_dtype()
        torch.testing.assert_close(path.schedule.alpha(t.double()), revealed.clamp(max=1 - 1e-6), atol=1e-5, rtol=0)
    assert any(float(t.max()) > 0 for _, t in calls)


# --------------------------------------------------------------------------------------------------- threshold


def _peaked(V, top):
    def den(xt, t):  # every conditional puts `top` on token 0, the rest evenly
        p = torch.full((V,), (1 - top) / (V - 1))
        p[0] = top
        return p.log().expand(xt.shape[0], xt.shape[1], V)

    return den


def test_threshold_steps_are_capped_and_the_cap_reveals_the_rest():
    V, L = 4, 32
    path = MaskedPath(V)
    x, st = decode(_peaked(V, 0.993), path, batch_size=3, length=L, num_steps=4, method="threshold",
                   threshold=0.999, generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert (x < V).all()
    assert st.num_calls == 4 and st.num_steps == 4 and int(st.row_calls.max()) == 4
    _, st = decode(_peaked(V, 0.993), path, batch_size=3, length=L, num_steps=2 * L, method="threshold",
                   threshold=0.999, generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert st.num_calls == L  # a cap above L never binds: one position per call, as before


def test_the_default_threshold_reveals_several_positions_on_a_flat_model():
    # docs/benchmarks.md "Decoding orders": a 27-symbol model's conditionals rarely pass 0.3, so 0.9 reveals one
    # position per call (exactly the confidence order); the default must reveal several at once there.
    V, L = 27, 64
    path = MaskedPath(V)
    default = SampleSettings().threshold
    assert default < 0.3
    x, st = decode(_peaked(V, 0.25), path, batch_size=4, length=L, num_steps=L, method="threshold",
                   generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert (x < V).all() and st.num_calls < L // 2
