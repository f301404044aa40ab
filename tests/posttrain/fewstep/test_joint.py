"""The joint student by exact enumeration (MATH.md §10, "The joint student"), masked source, V = 2, L = 3, the exact
posterior as teacher: (a) r teacher steps reveal a set with the independent-λ law of one student step, whatever
the tokens, and a rollout stopped at t_{j+1} (`until`) draws the teacher's r-step law; (b) the step's negative
log-likelihood is minimal, with zero gradient, at the teacher's law of y_R | (x_t, R); (c) one round gives a
K/r-step joint sampler (r = 2, 4) with the teacher's K-step law (exact table: TV 0; trained on sampled rollouts
through the composed objective: at the floor), where the factorised student of §10 stays at the teacher's K/r-step
error;
(d) two chained rounds give the teacher's K-step law at K/4."""

from __future__ import annotations

import pytest
import torch

from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.objectives.composed import Objective
from tcsm.objectives.losses import distrib_loss
from tcsm.paths import MaskedPath
from tcsm.posttrain.fewstep.joint import StepTarget
from tcsm.posttrain.fewstep.target import teacher_rollout
from tcsm.sampling.common import time_grid
from tcsm.targets.base import TargetBatch
from tests.posttrain.fewstep.fewstep_oracles import (
    NoisyStates,
    TableDenoiser,
    check_calls,
    fit,
    target_table,
    tv,
)
from tests.posttrain.fewstep.joint_oracles import (
    TabularJointStudent,
    exact_joint_table,
    joint_law,
    joint_step_matrix,
    reveal_law,
    reveal_of,
    teacher_step_matrix,
)

V, L, K = 2, 3, 4


@pytest.fixture(scope="module")
def setup():
    dist = EnumerableDistribution.random(V, L, seed=3, concentration=1.0)
    path = MaskedPath(V)
    states = NoisyStates(path, L)
    teacher = dist.denoiser(path)
    law = states.clean_law(states.law(teacher, states.prior(), time_grid(K)))
    return dist, path, states, teacher, law


def _floor(p, n):
    return 4 * 0.5 * float((p * (1 - p) / n).sqrt().sum())


@pytest.mark.parametrize("Ks", [2, 1])
def test_r_teacher_steps_reveal_the_independent_lambda_set_whatever_the_tokens(setup, Ks):
    _, _, states, teacher, _ = setup
    codes = reveal_of(states)
    g = time_grid(Ks)
    for j in range(Ks):
        T = teacher_step_matrix(states, teacher, K, Ks, j)
        lam = 1.0 if j == Ks - 1 else float((g[j + 1] - g[j]) / (1 - g[j]))
        for n in range(len(states.all)):
            got = torch.zeros(2**L, dtype=torch.float64).index_add_(0, codes[n].clamp_min(0), T[n] * (codes[n] >= 0))
            assert torch.allclose(got, reveal_law(states, n, lam), atol=1e-12)
            assert float(T[n][codes[n] < 0].sum()) < 1e-12


def test_a_rollout_until_t_next_draws_the_teacher_r_step_law(setup):
    _, path, states, teacher, _ = setup
    n, x = 20000, torch.tensor([V, 1, V])
    T = teacher_step_matrix(states, teacher, K, 2, 1)
    exact = T[states.index(x.reshape(1, -1))[0]]
    g = torch.Generator().manual_seed(0)
    xs, _, calls = teacher_rollout(teacher, path, x.expand(n, L).clone(), torch.full((n,), 2), K, until=4, generator=g)
    empirical = torch.bincount(states.index(xs), minlength=len(states.all)).double() / n
    assert tv(empirical, exact) < _floor(exact, n)
    check_calls(calls, 2, True, to_end=False)
    x0 = torch.full((n, L), V)
    xs, _, _ = teacher_rollout(teacher, path, x0, torch.zeros(n, dtype=torch.long), K, until=2, generator=g)
    exact = teacher_step_matrix(states, teacher, K, 2, 0)[states.index(x0[:1])[0]]
    empirical = torch.bincount(states.index(xs), minlength=len(states.all)).double() / n
    assert tv(empirical, exact) < _floor(exact, n) and (xs == V).any()  # masks kept: it stopped at t = 1/2
    with pytest.raises(ValueError, match="until"):
        teacher_rollout(teacher, path, x0, torch.zeros(n, dtype=torch.long), K, until=2, window=1)


def test_rows_at_different_grid_points_share_each_call_and_keep_their_own_laws(setup):
    _, path, states, teacher, _ = setup
    n, x0, x2 = 20000, torch.full((L,), V), torch.tensor([V, 1, V])
    xt = torch.cat([x0.expand(n, L), x2.expand(n, L)])
    start = torch.cat([torch.zeros(n, dtype=torch.long), torch.full((n,), 2)])
    calls = []

    def counted(x, t):
        calls.append(x.shape[0])
        return teacher(x, t)

    xs, _, per_row = teacher_rollout(counted, path, xt, start, K, until=start + 2,
                                     generator=torch.Generator().manual_seed(1))  # fmt: skip
    # r calls of the whole batch (less its rows that reveal nothing in a step), not one per grid point
    assert len(calls) == 2 and sum(calls) == int(per_row.sum()) and (per_row <= 2).all()
    for rows, x, j in ((slice(0, n), x0, 0), (slice(n, None), x2, 1)):
        exact = teacher_step_matrix(states, teacher, K, 2, j)[states.index(x.reshape(1, -1))[0]]
        empirical = torch.bincount(states.index(xs[rows]), minlength=len(states.all)).double() / n
        assert tv(empirical, exact) < _floor(exact, n)


def test_the_step_nll_is_minimal_with_zero_gradient_at_the_teacher_step_law(setup):
    _, path, states, teacher, _ = setup
    Ks, j = 2, 1
    T = teacher_step_matrix(states, teacher, K, Ks, j)
    codes = reveal_of(states)
    x = torch.tensor([V, 1, V])
    n = int(states.index(x.reshape(1, -1))[0])
    nxt = (codes[n] >= 0).nonzero().squeeze(1)
    weights = T[n, nxt]
    reveal = (codes[n, nxt, None] & (2 ** torch.arange(L - 1, -1, -1))) > 0
    tokens = states.all[nxt].clamp_max(V - 1)
    xt = x.expand(len(nxt), L)
    tb = TargetBatch(xt=xt, t=torch.full((len(nxt),), 0.5), x1=tokens, loss_mask=reveal, reveal=reveal)
    exact = exact_joint_table(states, [teacher_step_matrix(states, teacher, K, Ks, i) for i in range(Ks)], Ks)

    def value(table):
        student = TabularJointStudent(states, Ks)
        del student.table
        student.table = table  # a plain tensor: the gradient flows to the test's table
        return (weights * distrib_loss(student(xt, tb.t, reveal=reveal, tokens=tokens), tb, path).sum(-1)).sum()

    at = exact.clone().requires_grad_(True)
    v0 = value(at)
    (grad,) = torch.autograd.grad(v0, at)
    assert grad.abs().max() < 1e-9 and float(v0.detach()) > 0
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        assert value(at.detach() + 0.3 * torch.randn(at.shape, generator=g, dtype=at.dtype)) > v0.detach() + 1e-6


@pytest.mark.parametrize("Ks", [2, 1])  # step-halving, and one round of ratio 4 (MATH.md §10.1, "One round or a chain")
def test_one_exact_round_gives_the_teacher_k_step_law_at_k_over_r_and_the_factorised_one_cannot(setup, Ks):
    _, _, states, teacher, law = setup
    exact = exact_joint_table(states, [teacher_step_matrix(states, teacher, K, Ks, j) for j in range(Ks)], Ks)
    assert tv(joint_law(states, TabularJointStudent(states, Ks, exact), Ks), law) < 1e-12
    factorised = TableDenoiser(states, target_table(states, teacher, K, Ks))
    own = states.clean_law(states.law(teacher, states.prior(), time_grid(Ks)))
    gap = tv(states.clean_law(states.law(factorised, states.prior(), time_grid(Ks))), law)
    assert gap > 0.5 * tv(own, law) > 0.01  # §10: the factorised round stays at the teacher's own K/2-step error


def test_two_chained_rounds_give_the_teacher_k_step_law_at_k_quarter(setup):
    _, _, states, teacher, law = setup
    first = TabularJointStudent(states, 2, exact_joint_table(
        states, [teacher_step_matrix(states, teacher, K, 2, j) for j in range(2)], 2))  # fmt: skip
    # round 2: the round-1 student's two steps are the one step of a 1-step student
    two = joint_step_matrix(states, first, 2, 0) @ joint_step_matrix(states, first, 2, 1)
    second = TabularJointStudent(states, 1, exact_joint_table(states, [two], 1))
    assert tv(joint_law(states, second, 1), law) < 1e-12


def test_a_round_trained_on_sampled_rollouts_reaches_the_teacher_k_step_law(setup):
    """Through the composed objective (distrib KL on the drawn tokens, StepTarget's cached rollouts), the tabular
    joint student's K/2-step law is the teacher's K-step law up to the floor of SGD on sampled targets."""
    dist, path, states, teacher, law = setup
    Ks = 2
    student = TabularJointStudent(states, Ks)
    objective = Objective(path, StepTarget(teacher, K, Ks), loss="distrib", divergence="kl", weighting="uniform")
    metrics = fit(objective, student, dist)
    learned = joint_law(states, student, Ks)
    own = states.clean_law(states.law(teacher, states.prior(), time_grid(Ks)))
    assert tv(learned, law) < 0.2 * tv(own, law)
    assert 0 < float(metrics["target/teacher_calls"]) <= K // Ks and float(metrics["target/revealed"]) > 0


def test_the_joint_sampler_draws_a_joint_teacher_and_a_rollout_of_one_matches_its_law(setup):
    """`sample.method` ancestral on a step-head model runs `sampling.joint_step`; its law (and a round-2 rollout
    of it as a teacher) is the enumerated joint law."""
    from tcsm.sampling.settings import draw, sample_settings

    _, path, states, teacher, law = setup
    Ks, n = 2, 20000
    student = TabularJointStudent(states, Ks, exact_joint_table(
        states, [teacher_step_matrix(states, teacher, K, Ks, j) for j in range(Ks)], Ks))  # fmt: skip
    with torch.no_grad():
        x, stats = draw(student, path, n, L, sample_settings({}, steps=Ks), generator=torch.Generator().manual_seed(0))
        empirical = torch.bincount(states.index(x), minlength=len(states.all)).double()[states.clean] / n
        assert tv(empirical, law) < _floor(law, n)
        assert stats.num_calls == Ks and stats.counts["head_calls"] >= Ks
        xs, _, calls = teacher_rollout(student, path, torch.full((n, L), V), torch.zeros(n, dtype=torch.long), Ks,
                                       generator=torch.Generator().manual_seed(1))  # fmt: skip
    empirical = torch.bincount(states.index(xs), minlength=len(states.all)).double()[states.clean] / n
    assert tv(empirical, law) < _floor(law, n)
    check_calls(calls, Ks, True)
