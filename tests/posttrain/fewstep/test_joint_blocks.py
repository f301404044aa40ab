"""The joint student on a block path by exact enumeration (MATH.md §9, §10 "The joint student"), masked source,
V = 2, L = 4 in blocks of 2, the exact block posterior as teacher: (a) the block `StepTarget` draws, per block, the
teacher's r-step law from that block's x_t at its own grid point given its clean prefix, and hands the student the
clean data as its prefixes; (b) one round from the exact teacher with an exact joint table per (prefix, block step)
gives a K/r-step-per-block sampler with the teacher's K-step-per-block law (TV 0)."""

from __future__ import annotations

import pytest
import torch

from tcsm.core.batch import Batch
from tcsm.evaluation.exact import EnumerableDistribution, ExactBlockDenoiser
from tcsm.paths import make_path
from tcsm.posttrain.fewstep.joint import StepTarget
from tcsm.sampling.common import time_grid
from tests.posttrain.fewstep.fewstep_oracles import NoisyStates, tv
from tests.posttrain.fewstep.joint_oracles import (
    TabularJointStudent,
    exact_joint_table,
    joint_law,
    teacher_step_matrix,
)

V, L, k, K = 2, 4, 2, 4


@pytest.fixture(scope="module")
def setup():
    d = EnumerableDistribution.random(V, L, seed=5, concentration=1.0)
    path = make_path("masked", V, block_length=k)
    teacher = ExactBlockDenoiser(d, path, k)
    return d, path, teacher, NoisyStates(make_path("masked", V), k)


def block_teacher(teacher, prefix):
    """The exact teacher of one block as a full-sequence denoiser of its k positions, given the clean prefix."""

    def denoiser(xs, t):
        return teacher.block_marginals(xs, t, prefix.expand(xs.shape[0], -1)).log().clamp_min(-700.0)

    return denoiser


def _floor(p, n):
    return 4 * 0.5 * float((p * (1 - p) / n).sqrt().sum())


def test_the_block_step_target_draws_each_block_s_r_step_law_given_its_clean_prefix(setup):
    _, path, teacher, states = setup
    Ks, n = 2, 20000
    x1 = torch.tensor([1, 0, 0, 1])
    # block 0 from t = 0.6 (j = 1: its last step, to t = 1), block 1 from t = 0.3 (j = 0: stopped at t = 1/2)
    t = torch.tensor([0.6, 0.6, 0.3, 0.3]).expand(n, L)
    target = StepTarget(teacher, K, Ks)
    g = torch.Generator().manual_seed(0)
    tb = target(Batch(x1=x1.expand(n, L).clone()), t, path, g)
    assert torch.equal(tb.t, torch.tensor([0.5, 0.5, 0.0, 0.0]).expand(n, L))
    assert torch.equal(tb.clean, x1.expand(n, L)) and torch.equal(tb.reveal, tb.loss_mask)
    assert not (tb.reveal & (tb.xt != V)).any()  # R: masked positions of x_t only
    assert torch.equal(torch.where(tb.reveal, x1, tb.x1), x1.expand(n, L))  # off R the data
    assert float(tb.stats["teacher_calls"]) == K // Ks  # every block's i-th step in one call
    after = torch.where(tb.reveal, tb.x1, tb.xt)  # x at t_{j+1} of each block
    for b, j in ((0, 1), (1, 0)):
        T = teacher_step_matrix(states, block_teacher(teacher, x1[: b * k]), K, Ks, j)
        lo, hi = b * k, (b + 1) * k
        start, end = states.index(tb.xt[:, lo:hi]), states.index(after[:, lo:hi])
        N = len(states.all)
        pair = torch.bincount(start * N + end, minlength=N * N).double().view(N, N) / n
        exact = (pair.sum(1, keepdim=True) * T).reshape(-1)  # the drawn x_t's, then the teacher's r steps
        assert tv(pair.reshape(-1), exact) < _floor(exact, n), b
    assert (after[:, 2:] == V).any() and not (after[:, :2] == V).any()  # block 1 kept masks at t = 1/2


def test_a_block_step_target_refuses_one_time_per_row(setup):
    d, path, teacher, _ = setup
    with pytest.raises(ValueError, match="per position"):
        StepTarget(teacher, K, 2)(Batch(x1=d.sample(4)), torch.full((4,), 0.5), path)


def block_laws(teacher, states, prefix, Ks, joint: bool):
    """The law over one block's clean states given `prefix`: the teacher's K-step sampler, or (`joint`) the K/Ks
    joint student whose table is exact for the teacher's r steps per student step."""
    denoiser = block_teacher(teacher, prefix)
    if not joint:
        return states.clean_law(states.law(denoiser, states.prior(), time_grid(K)))
    table = exact_joint_table(states, [teacher_step_matrix(states, denoiser, K, Ks, j) for j in range(Ks)], Ks)
    return joint_law(states, TabularJointStudent(states, Ks, table), Ks)


@pytest.mark.parametrize("Ks", [2, 1])
def test_one_exact_round_gives_the_teacher_k_step_per_block_law_at_k_over_r(setup, Ks):
    _, _, teacher, states = setup
    clean = states.all[states.clean]  # one block's clean states
    laws = {}
    for joint in (False, True):
        first = block_laws(teacher, states, clean[:0, 0], Ks, joint)
        law = torch.zeros(len(clean), len(clean), dtype=torch.float64)
        for a, prefix in enumerate(clean):
            law[a] = first[a] * block_laws(teacher, states, prefix, Ks, joint)
        laws[joint] = law.reshape(-1)
    assert tv(laws[True], laws[False]) < 1e-12
    own = torch.zeros_like(laws[False])  # the teacher's own K/r steps per block: the factorisation error
    first = states.clean_law(states.law(block_teacher(teacher, clean[:0, 0]), states.prior(), time_grid(Ks)))
    for a, prefix in enumerate(clean):
        own[a * len(clean) : (a + 1) * len(clean)] = first[a] * states.clean_law(
            states.law(block_teacher(teacher, prefix), states.prior(), time_grid(Ks)))  # fmt: skip
    assert tv(own, laws[False]) > 0.01
