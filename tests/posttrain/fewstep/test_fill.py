"""The teacher's left-to-right fill of a student step by exact enumeration (MATH.md §10.1, "The teacher's
left-to-right fill"), masked source, V = 2, L = 3, the exact posterior as teacher: (a) `fill_left_to_right` draws
y_R one position a call, left to right, with the enumerated sequential law, and hands over, at each position, the
teacher's conditional at x_t with R's earlier tokens set; (b) `StepTarget(fill="left_to_right")` draws R with one
student step's λ and (x_t, x_{t_{j+1}}) with the sequential step law; (c) the loss on those conditionals is minimal
with zero gradient at the table of the sequential law, and there its gradient is zero on every batch (the drawn
tokens' log-likelihood has the same minimiser but not a zero gradient per batch); (d) a joint student trained on it
through the composed objective reaches the teacher's sequential K_s-step law."""

from __future__ import annotations

import pytest
import torch

from tcsm.core.batch import Batch
from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.objectives.composed import Objective
from tcsm.objectives.losses import distrib_loss
from tcsm.paths import MaskedPath
from tcsm.posttrain.fewstep.joint import StepTarget, fill_left_to_right
from tcsm.targets.base import TargetBatch
from tests.posttrain.fewstep.fewstep_oracles import NoisyStates, fit, tv
from tests.posttrain.fewstep.joint_oracles import (
    TabularJointStudent,
    exact_joint_table,
    joint_law,
    reveal_of,
    sequential_conditionals,
    sequential_step_matrix,
)

V, L = 2, 3


@pytest.fixture(scope="module")
def setup():
    dist = EnumerableDistribution.random(V, L, seed=3, concentration=1.0)
    path = MaskedPath(V)
    states = NoisyStates(path, L)
    return dist, path, states, dist.denoiser(path)


def _floor(p, n):
    return 4 * 0.5 * float((p * (1 - p) / n).sqrt().sum())


def _law(states, x, n):
    return torch.bincount(states.index(x), minlength=len(states.all)).double() / n


def test_the_fill_draws_the_sequential_law_and_hands_over_each_position_s_conditional(setup):
    _, _, states, teacher = setup
    n, x = 20000, torch.tensor([V, 0, V])
    R = torch.tensor([True, False, True])
    calls = []

    def counted(xs, t):
        calls.append(xs.shape[0])
        return teacher(xs, t)

    xs, log_q, per_row = fill_left_to_right(counted, x.expand(n, L), torch.full((n,), 0.25), torch.full((n,), 0.5), R.expand(n, L), V,
                                            generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert calls == [n, n] and (per_row == 2).all()  # one call per position of R, every row in it
    exact = torch.zeros(len(states.all), dtype=torch.float64)
    for y0 in range(V):
        for y2 in range(V):
            y = torch.tensor([y0, 0, y2])
            q = sequential_conditionals(states, teacher, x, R, y)
            exact[states.index(y[None])] = q[0, y0] * q[2, y2]
    assert tv(_law(states, xs, n), exact) < _floor(exact, n)
    for row in range(0, n, 997):
        q = sequential_conditionals(states, teacher, x, R, xs[row])
        assert torch.allclose(log_q[row, R].double().exp(), q[R], atol=1e-6)
        assert torch.allclose(log_q[row, ~R].double().exp(), torch.full((1, V), 1.0 / V, dtype=torch.float64))


@pytest.mark.parametrize("Ks", [2, 1])
def test_the_step_target_draws_the_lambda_set_and_the_sequential_step_law(setup, Ks):
    _, path, states, teacher = setup
    n = 40000
    target = StepTarget(teacher, 4, Ks, fill="left_to_right")
    x1 = torch.tensor([1, 0, 1])
    g = torch.Generator().manual_seed(1)
    tb = target(Batch(x1=x1.expand(n, L).clone()), torch.rand(n, generator=g, dtype=torch.float64), path, g)
    assert torch.equal(tb.loss_mask, tb.reveal) and tb.log_q is not None
    assert float(tb.stats["teacher_calls"]) == pytest.approx(float(tb.stats["revealed"]))  # one call per token
    after = torch.where(tb.reveal, tb.x1, tb.xt)
    N = len(states.all)
    for j in range(Ks):
        rows = tb.t == j / Ks
        T = sequential_step_matrix(states, teacher, Ks, j)
        start, end = states.index(tb.xt[rows]), states.index(after[rows])
        pair = torch.bincount(start * N + end, minlength=N * N).double().view(N, N) / int(rows.sum())
        exact = (pair.sum(1, keepdim=True) * T).reshape(-1)
        assert tv(pair.reshape(-1), exact) < _floor(exact, int(rows.sum())), j


def _all_fills(states, teacher, x, Ks, j):
    """Every (R, y_R) one student step can draw from x, with its sequential probability and exact conditionals."""
    T = sequential_step_matrix(states, teacher, Ks, j)
    n = int(states.index(x[None])[0])
    codes = reveal_of(states)
    nxt = ((codes[n] >= 0) & (T[n] > 0)).nonzero().squeeze(1)
    R = (codes[n, nxt, None] & (2 ** torch.arange(L - 1, -1, -1))) > 0
    y = states.all[nxt].clamp_max(V - 1)
    q = torch.stack([sequential_conditionals(states, teacher, x, R[i], y[i]) for i in range(len(nxt))])
    log_q = torch.where(R[..., None], q.clamp_min(1e-300).log(), torch.full_like(q, -float(torch.log(torch.tensor(2.0)))))
    return T[n, nxt], R, y, log_q.float()


def test_the_conditionals_loss_is_minimal_with_zero_gradient_per_batch_at_the_sequential_law(setup):
    _, path, states, teacher = setup
    Ks, j, x = 2, 1, torch.tensor([V, 1, V])
    weights, R, y, log_q = _all_fills(states, teacher, x, Ks, j)
    xt = x.expand(len(y), L)
    t = torch.full((len(y),), 0.5)
    exact = exact_joint_table(states, [sequential_step_matrix(states, teacher, Ks, i) for i in range(Ks)], Ks)

    def value(table, explicit, rows=slice(None)):
        student = TabularJointStudent(states, Ks)
        del student.table
        student.table = table
        tb = TargetBatch(xt=xt[rows], t=t[rows], x1=y[rows], loss_mask=R[rows], reveal=R[rows],
                         log_q=log_q[rows] if explicit else None)  # fmt: skip
        per_row = distrib_loss(student(xt[rows], t[rows], reveal=R[rows], tokens=y[rows]), tb, path).sum(-1)
        return (weights[rows] * per_row).sum()

    at = exact.clone().requires_grad_(True)
    for explicit in (True, False):
        v0 = value(at, explicit)
        (grad,) = torch.autograd.grad(v0, at)
        assert grad.abs().max() < 1e-6
        g = torch.Generator().manual_seed(2)
        for _ in range(5):
            assert value(at.detach() + 0.3 * torch.randn(at.shape, generator=g, dtype=at.dtype), explicit) > v0.detach()
    # one fill alone: its conditionals' loss is still stationary at the law, its drawn tokens' is not
    per_fill = [torch.autograd.grad(value(at, True, slice(i, i + 1)), at)[0].abs().max() for i in range(len(y))]
    drawn = [torch.autograd.grad(value(at, False, slice(i, i + 1)), at)[0].abs().max() for i in range(len(y))]
    assert max(per_fill) < 1e-6 and max(drawn) > 1e-3


def test_a_student_trained_on_the_fill_reaches_the_teacher_s_sequential_law(setup):
    dist, path, states, teacher = setup
    Ks = 2
    law = states.prior()
    for j in range(Ks):
        law = law @ sequential_step_matrix(states, teacher, Ks, j)
    law = states.clean_law(law)
    exact = exact_joint_table(states, [sequential_step_matrix(states, teacher, Ks, j) for j in range(Ks)], Ks)
    assert tv(joint_law(states, TabularJointStudent(states, Ks, exact), Ks), law) < 1e-12
    student = TabularJointStudent(states, Ks)
    objective = Objective(path, StepTarget(teacher, 4, Ks, fill="left_to_right"), loss="distrib", divergence="kl",
                          weighting="uniform")  # fmt: skip
    metrics = fit(objective, student, dist)
    factorised = joint_law(states, TabularJointStudent(states, Ks), Ks)  # the head at zero: the teacher's own Ks steps
    assert tv(joint_law(states, student, Ks), law) < 0.1 * tv(factorised, law)
    assert float(metrics["target/teacher_calls"]) == pytest.approx(float(metrics["target/revealed"]))


def test_the_fill_is_refused_where_it_does_not_apply(setup):
    _, _, states, teacher = setup
    with pytest.raises(ValueError, match="fill"):
        StepTarget(teacher, 4, 2, fill="right_to_left")
    with pytest.raises(ValueError, match="head would be ignored"):  # a chained round's joint teacher
        StepTarget(TabularJointStudent(states, 2), 4, 2, fill="left_to_right")
