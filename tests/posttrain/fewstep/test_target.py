"""The multi-step teacher target by exact enumeration (MATH.md §10), tiny V and L, the exact posterior denoiser as
teacher: (a) the rollout's x_1 is drawn from the law of the teacher's K-step sampler from x_t and its conditionals
average to that law's marginals; (b) the student's losses are minimal, with zero gradient, at those marginals;
(c) one round of a tabular student through the composed objective gives the K/2-step sampler the target defines."""

from __future__ import annotations

import pytest
import torch

from tcsm.core.batch import Batch
from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.objectives.composed import Objective
from tcsm.objectives.losses import distrib_loss, score_loss
from tcsm.paths import MaskedPath, UniformPath
from tcsm.posttrain.fewstep.target import MultiStepTarget, grid_start, teacher_rollout
from tcsm.sampling.common import time_grid
from tcsm.targets.base import TargetBatch
from tests.posttrain.fewstep.fewstep_oracles import NoisyStates, check_calls, fit, teacher_law_from, tv

V, L = 2, 3


@pytest.fixture(scope="module")
def dist():
    return EnumerableDistribution.random(V, L, seed=3, concentration=1.0)


def _path(source):
    return MaskedPath(V) if source == "masked" else UniformPath(V)


def _start(source):
    return torch.tensor([V, 1, V]) if source == "masked" else torch.tensor([1, 0, 1])


def _floor(p, n):
    """Four times the expected total variation of an n-sample empirical law of p (the sampling floor)."""
    return 4 * 0.5 * float((p * (1 - p) / n).sqrt().sum())


@pytest.mark.parametrize("source", ["masked", "uniform"])
@pytest.mark.parametrize("window", [None, 1])
def test_the_rollout_draws_from_the_teacher_k_step_law_and_its_conditionals_average_to_its_marginals(dist, source, window):
    path = _path(source)
    states = NoisyStates(path, L)
    teacher = dist.denoiser(path)
    K, k, n = 4, 1, 20000
    x = _start(source)
    law = states.clean_law(teacher_law_from(states, teacher, x, K, k, window))
    g = torch.Generator().manual_seed(0)
    x1, log_cond, calls = teacher_rollout(teacher, path, x.expand(n, L).clone(), torch.full((n,), k), K, window=window,
                                          generator=g)  # fmt: skip
    empirical = torch.bincount(states.index(x1), minlength=len(states.all)).double()[states.clean] / n
    assert tv(empirical, law) < _floor(law, n)
    check_calls(calls, K - k if window is None else min(window + 1, K - k), source == "masked")
    free = path.free(x.reshape(1, -1))[0]
    marg = states.marginals(teacher_law_from(states, teacher, x, K, k, window))
    mean_cond = log_cond.exp().mean(0)
    assert (mean_cond[free] - marg[free]).abs().max() < 5 * (0.25 / n) ** 0.5
    assert (x1[:, ~free] == x[~free]).all()


def _expected_loss(loss_fn, logits, states, law, path, xt, **kw):
    """E_{x_1 ~ law} of the per-position loss against the drawn token (the Monte Carlo form), summed over positions."""
    outcomes = states.all[states.clean]
    weights = states.clean_law(law)
    B = outcomes.shape[0]
    xtb = xt.expand(B, L)
    tb = TargetBatch(xt=xtb, t=torch.full((B,), 0.25), x1=outcomes, loss_mask=path.free(xtb))
    per = loss_fn(logits.expand(B, L, V), tb, path, **kw)
    return (weights.to(per.dtype) * per.sum(-1)).sum()


@pytest.mark.parametrize("source", ["masked", "uniform"])
@pytest.mark.parametrize("loss", ["distrib_kl_draws", "distrib_kl_conditionals", "score_gkl_draws"])
def test_the_student_loss_is_minimal_with_zero_gradient_at_the_target_marginals(dist, source, loss):
    path = _path(source)
    states = NoisyStates(path, L)
    teacher = dist.denoiser(path)
    x = _start(source)
    law = teacher_law_from(states, teacher, x, 4, 1)
    target = states.marginals(law).clamp_min(1e-300)

    def value(logits):
        if loss == "distrib_kl_conditionals":  # linear in q: the mean of the conditionals is the marginal (test a)
            tb = TargetBatch(xt=x.reshape(1, L), t=torch.full((1,), 0.25), x1=target.argmax(-1).reshape(1, L),
                             loss_mask=path.free(x.reshape(1, L)), log_q=target.log().reshape(1, L, V))  # fmt: skip
            return distrib_loss(logits.reshape(1, L, V), tb, path).sum()
        fn = distrib_loss if loss.startswith("distrib") else score_loss
        return _expected_loss(fn, logits.reshape(1, L, V), states, law, path, x.reshape(1, L))

    at = target.log().double().requires_grad_(True)
    v0 = value(at)
    (grad,) = torch.autograd.grad(v0, at)
    assert grad.abs().max() < 1e-9
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        nudged = at.detach() + 0.3 * torch.randn(at.shape, generator=g, dtype=at.dtype)
        assert value(nudged) > v0.detach() + 1e-6


class TabularStudent(torch.nn.Module):
    """A free logit table per (student grid point, noisy state): the student of check (c)."""

    def __init__(self, states: NoisyStates, student_steps: int, init=None):
        super().__init__()
        self.states, self.Ks = states, int(student_steps)
        shape = (self.Ks, len(states.all), states.L, states.V)
        self.table = torch.nn.Parameter(torch.zeros(shape, dtype=torch.float64) if init is None else init)

    def forward(self, xt, t):
        return self.table[grid_start(t, self.Ks), self.states.index(xt)]


def _exact_student(states, teacher, K, Ks):
    """The minimiser of the factorised objective: per (t_j, x_t) the marginals of p_{1|t_j}^{T,K}(· | x_t)."""
    table = torch.zeros(Ks, len(states.all), states.L, states.V, dtype=torch.float64)
    for j in range(Ks):
        for n, x in enumerate(states.all):
            marg = states.marginals(teacher_law_from(states, teacher, x, K, j * (K // Ks)))
            table[j, n] = marg.nan_to_num(1.0 / states.V).clamp_min(1e-300).log()
    return TabularStudent(states, Ks, table)


@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_one_round_from_the_exact_teacher_gives_the_k_half_step_sampler_of_the_target(dist, source):
    """Trained through `Objective` on cached teacher rollouts, the tabular student's K/2-step law is the one the
    exact minimiser defines (TV at the floor of SGD on Monte Carlo targets)."""
    path = _path(source)
    states = NoisyStates(path, L)
    teacher = dist.denoiser(path)
    K, Ks = 4, 2
    student = TabularStudent(states, Ks)
    objective = Objective(path, MultiStepTarget(teacher, K, Ks), loss="distrib", divergence="kl", weighting="uniform")
    metrics = fit(objective, student, dist)
    with torch.no_grad():
        learned = states.clean_law(states.law(student, states.prior(), time_grid(Ks)))
    with torch.no_grad():
        exact = states.clean_law(states.law(_exact_student(states, teacher, K, Ks), states.prior(), time_grid(Ks)))
    assert tv(learned, exact) < 0.01
    assert float(metrics["target/teacher_calls"]) > 0


@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_a_one_step_student_draws_the_product_of_the_teacher_k_step_marginals(dist, source):
    """At K/2 = 1 the round's law is exactly Π_i (marginal i of the teacher's K-step law): the K-step law up to its
    own factorisation floor, TV(p^{T,K}, Π_i p^{T,K}_i) — what a factorised one-step sampler can reach."""
    path = _path(source)
    states = NoisyStates(path, L)
    teacher = dist.denoiser(path)
    K = 2
    student = _exact_student(states, teacher, K, 1)
    law = states.clean_law(states.law(student, states.prior(), time_grid(1)))
    teacher_law = states.law(teacher, states.prior(), time_grid(K))
    marg = states.marginals(teacher_law)
    outcomes = states.all[states.clean]
    product = marg[torch.arange(L), outcomes].prod(-1)
    assert torch.allclose(law, product, atol=1e-12)
    assert abs(tv(law, states.clean_law(teacher_law)) - tv(product, states.clean_law(teacher_law))) < 1e-12


def test_bad_settings_are_refused(dist):
    teacher = dist.denoiser(MaskedPath(V))
    with pytest.raises(ValueError, match="multiple"):
        MultiStepTarget(teacher, 6, 4)
    with pytest.raises(ValueError, match="form"):
        MultiStepTarget(teacher, 4, 2, form="joint")
    with pytest.raises(ValueError, match="window"):
        MultiStepTarget(teacher, 4, 2, window=0)



def test_on_a_masked_path_a_row_is_called_only_in_the_steps_that_reveal_in_it(dist):
    """A step's reveal set is drawn before its call and a row revealing nothing is left out: a clean row makes no
    call, a row with one mask exactly one (whichever of the K steps reveals it), and the rows the teacher sees
    are the calls reported."""
    path = MaskedPath(V)
    teacher, seen = dist.denoiser(path), []

    def counted(x, t):
        seen.append(x.shape[0])
        return teacher(x, t)

    n, K = 500, 8
    xt = torch.cat([torch.tensor([[V, 1, 0]]).expand(n, L), torch.tensor([[0, 1, 1]]).expand(n, L)])
    x1, _, calls = teacher_rollout(counted, path, xt, torch.zeros(2 * n, dtype=torch.long), K,
                                   generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert (calls[:n] == 1).all() and (calls[n:] == 0).all() and sum(seen) == n and len(seen) <= K
    assert (x1[:n, 0] < V).all() and (x1[n:] == torch.tensor([0, 1, 1])).all()

@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_on_a_block_model_every_block_reaches_the_law_of_its_own_rollout_given_its_clean_prefix(source):
    """Blocks of 2 of a length-4 sequence, each from its own grid point, in one batched rollout of the exact block
    posterior: block b reaches the law of the block sampler from its x_t^b given the clean prefix x_1^{<b}."""
    from tcsm.evaluation.exact import ExactBlockDenoiser
    from tcsm.paths import make_path

    d = EnumerableDistribution.random(V, 4, seed=5, concentration=1.0)
    path = make_path(source, V, block_length=2)
    teacher = ExactBlockDenoiser(d, path, 2)
    K, n = 4, 20000
    x1 = torch.tensor([1, 0, 0, 1])
    xt = torch.tensor([V, 1, V, V]) if source == "masked" else torch.tensor([1, 1, 0, 1])
    start = torch.tensor([2, 2, 1, 1])
    g = torch.Generator().manual_seed(0)
    out, _, calls = teacher_rollout(teacher, path, xt.expand(n, 4).clone(), start.expand(n, 4), K,
                                    x1=x1.expand(n, 4), generator=g)  # fmt: skip
    states = NoisyStates(path, 2)
    check_calls(calls, K - 1, source == "masked")
    for b, prefix in ((0, x1[:0]), (1, x1[:2])):
        def block(xs, t, prefix=prefix):
            return teacher.block_marginals(xs, t, prefix.expand(xs.shape[0], -1)).log().clamp_min(-700.0)

        law = states.clean_law(teacher_law_from(states, block, xt[2 * b : 2 * b + 2], K, int(start[2 * b])))
        got = out[:, 2 * b : 2 * b + 2]
        empirical = torch.bincount(states.index(got), minlength=len(states.all)).double()[states.clean] / n
        assert tv(empirical, law) < _floor(law, n), b
    objective = Objective(path, MultiStepTarget(teacher, K, 2), loss="distrib", divergence="kl", weighting="uniform")
    loss, metrics = objective(teacher, Batch(x1=d.sample(64, generator=g)), g)  # per-block times through the target
    assert torch.isfinite(loss) and float(metrics["target/teacher_calls"]) >= 1
