"""The joint student on a block path by exact enumeration (MATH.md §9, §10 "The joint student"), masked source,
V = 2, L = 4 in blocks of 2, the exact block posterior as teacher: (a) the block `StepTarget` draws, per block, the
teacher's r-step law from that block's x_t at its own grid point given its clean prefix, and hands the student the
clean data as its prefixes; (b) one round from the exact teacher with an exact joint table per (prefix, block step)
gives a K/r-step-per-block sampler with the teacher's K-step-per-block law (TV 0), and the block decoder's joint
in-block step (`sampling.blocks`, through the cache) draws that law (TV at the sampling floor); (c) that joint
student as the teacher of a chained round: its rollout draws, per block given the clean prefix, its own law, the
teacher's K-step-per-block law (TV at the sampling floor)."""

from __future__ import annotations

import pytest
import torch

from tcsm.core.batch import Batch
from tcsm.evaluation.exact import EnumerableDistribution, ExactBlockDenoiser, PrefixCache
from tcsm.models.kinds import JOINT_STEP_BLOCK_DENOISER
from tcsm.models.step_head import reveal_order
from tcsm.paths import make_path
from tcsm.posttrain.fewstep.joint import StepTarget
from tcsm.sampling.common import time_grid
from tests.posttrain.fewstep.fewstep_oracles import NoisyStates, tv
from tests.posttrain.fewstep.joint_oracles import (
    TabularJointStudent,
    exact_joint_table,
    joint_law,
    sequential_step_matrix,
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
    assert 0 < float(tb.stats["teacher_calls"]) <= K // Ks  # every block's i-th step in one call
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


def test_the_left_to_right_fill_draws_each_block_s_sequential_law_all_blocks_in_lock_step(setup):
    """`fill="left_to_right"` on a block path (MATH.md §10.1, "The teacher's left-to-right fill"): each block's R with
    its own step's λ, filled left to right within the block given its clean prefix; the k-th position of every
    block in the k-th call."""
    _, path, teacher, states = setup
    Ks, n = 2, 20000
    x1 = torch.tensor([1, 0, 0, 1])
    t = torch.tensor([0.6, 0.6, 0.3, 0.3]).expand(n, L)
    g = torch.Generator().manual_seed(2)
    tb = StepTarget(teacher, K, Ks, fill="left_to_right")(Batch(x1=x1.expand(n, L).clone()), t, path, g)
    assert tb.log_q is not None and torch.equal(tb.reveal, tb.loss_mask) and torch.equal(tb.clean, x1.expand(n, L))
    assert float(tb.stats["teacher_calls"]) <= k  # a block's k-th position with every other block's, in one call
    after = torch.where(tb.reveal, tb.x1, tb.xt)
    for b, j in ((0, 1), (1, 0)):
        T = sequential_step_matrix(states, block_teacher(teacher, x1[: b * k]), Ks, j)
        lo, hi = b * k, (b + 1) * k
        start, end = states.index(tb.xt[:, lo:hi]), states.index(after[:, lo:hi])
        N = len(states.all)
        pair = torch.bincount(start * N + end, minlength=N * N).double().view(N, N) / n
        exact = (pair.sum(1, keepdim=True) * T).reshape(-1)
        assert tv(pair.reshape(-1), exact) < _floor(exact, n), b


def test_a_block_step_target_refuses_one_time_per_row(setup):
    d, path, teacher, _ = setup
    with pytest.raises(ValueError, match="per position"):
        StepTarget(teacher, K, 2)(Batch(x1=d.sample(4)), torch.full((4,), 0.5), path)


def block_laws(teacher, states, prefix, Ks=None, joint: bool = False):
    """The law over one block's clean states given `prefix`: the teacher's K-step sampler, or (`joint`) the K/Ks
    joint student whose table is exact for the teacher's r steps per student step."""
    denoiser = block_teacher(teacher, prefix)
    if not joint:
        return states.clean_law(states.law(denoiser, states.prior(), time_grid(K if Ks is None else Ks)))
    table = exact_joint_table(states, [teacher_step_matrix(states, denoiser, K, Ks, j) for j in range(Ks)], Ks)
    return joint_law(states, TabularJointStudent(states, Ks, table), Ks)


def teacher_law(teacher, states, Ks=None, joint=False):
    """The law over the L = 4 clean sequences (index 4·block 0 + block 1) of the teacher's K steps per block (`Ks`:
    its Ks steps, or with `joint` the exact joint student's Ks)."""
    clean = states.all[states.clean]  # one block's clean states
    first = block_laws(teacher, states, clean[:0, 0], Ks, joint)
    law = torch.zeros(len(clean), len(clean), dtype=torch.float64)
    for a, prefix in enumerate(clean):
        law[a] = first[a] * block_laws(teacher, states, prefix, Ks, joint)
    return law.reshape(-1)


@pytest.mark.parametrize("Ks", [2, 1])
def test_one_exact_round_gives_the_teacher_k_step_per_block_law_at_k_over_r(setup, Ks):
    _, _, teacher, states = setup
    law = teacher_law(teacher, states)
    assert tv(teacher_law(teacher, states, Ks, joint=True), law) < 1e-12
    assert tv(teacher_law(teacher, states, Ks), law) > 0.01  # the teacher's own K/r steps: the factorisation error


class TabularJointBlockStudent:
    """A block model with a step head whose in-block steps are exact joint tables, one per clean prefix: declared as
    a network would declare it (`JOINT_STEP_BLOCK_DENOISER`), with the block model's cache API (the cache is the
    prefix) and `open_block_step`."""

    model_kind = JOINT_STEP_BLOCK_DENOISER
    time_independent = False

    def __init__(self, students: dict, block_length: int):
        self.students, self.block_length = students, int(block_length)
        self.cfg = students[()].cfg

    def new_cache(self, batch_size):
        return PrefixCache(torch.zeros(int(batch_size), 0, dtype=torch.long))

    def extend_cache(self, cache, x_clean):
        cache.tokens = torch.cat([cache.tokens, x_clean.long()], 1)

    def open_block_step(self, xt, t, cache, reveal):
        return _PrefixSteps(self, xt, t, [tuple(p.tolist()) for p in cache.tokens], reveal)

    def open_blocks_step(self, xt, t, x1, reveal):
        k = self.block_length
        keys = [tuple(row[: b * k].tolist()) for row in x1 for b in range(x1.shape[1] // k)]
        return _PrefixSteps(self, xt.reshape(-1, k), t[:, ::k].reshape(-1), keys, reveal)


class _PrefixSteps:
    def __init__(self, model, xt, t, keys, reveal):
        self.positions, self.valid = reveal_order(reveal)
        self.size, self.calls = self.positions.shape[1], 0
        self.groups = []
        for key in set(keys):
            rows = torch.tensor([i for i, other in enumerate(keys) if other == key])
            self.groups.append((rows, model.students[key].open_step(xt[rows], t[rows], reveal[rows])))
        self.V = model.cfg.vocab_size

    def logits(self, k, prev):
        out = torch.zeros(prev.shape[0], self.V, dtype=torch.float64)
        for rows, step in self.groups:
            if k < step.size:
                out[rows] = step.logits(k, prev[rows])
        self.calls += 1
        return out


def exact_block_student(teacher, states, Ks):
    """The block joint student with Ks steps per block whose table is exact for the teacher's K/Ks steps per
    student step, for every clean prefix."""
    clean = states.all[states.clean]
    students = {}
    for prefix in [clean[:0, 0], *clean]:
        denoiser = block_teacher(teacher, prefix)
        T = [teacher_step_matrix(states, denoiser, K, Ks, j) for j in range(Ks)]
        students[tuple(prefix.tolist())] = TabularJointStudent(states, Ks, exact_joint_table(states, T, Ks))
    return TabularJointBlockStudent(students, k)


def test_the_block_decoders_joint_step_draws_the_teacher_k_step_law_at_k_over_r(setup):
    from tcsm.sampling.settings import draw, sample_settings

    _, path, teacher, states = setup
    Ks, n = 1, 20000  # one joint step per block for K = 4 teacher steps
    student = exact_block_student(teacher, states, Ks)
    with torch.no_grad():
        x, stats = draw(student, path, n, L, sample_settings({}, steps=Ks), generator=torch.Generator().manual_seed(0))
    assert stats.counts["blocks"] == L // k and stats.counts["head_calls"] >= Ks * L // k
    radix = V ** torch.arange(L - 1, -1, -1)
    empirical = torch.bincount((x * radix).sum(-1), minlength=V**L).double() / n
    law = teacher_law(teacher, states)
    own = teacher_law(teacher, states, Ks)  # the teacher's own Ks steps per block
    assert tv(empirical, law) < _floor(law, n) < tv(own, law)


def test_a_chained_round_rolls_a_block_joint_student_out_at_its_own_law_per_block():
    # each block's two tokens nearly always equal, block 1's following block 0's: the teacher's own 2 steps per
    # block, which reveal both tokens of a block together at times, are far from its 4
    x = torch.cartesian_prod(*[torch.arange(V)] * L)
    probs = torch.where(x[:, 0] == x[:, 1], 1.0, 0.05) * torch.where(x[:, 2] == x[:, 3], 1.0, 0.05)
    probs = probs * torch.where(x[:, 2] == x[:, 0], 2.0, 1.0) * (1 + 0.5 * x[:, 0])
    path = make_path("masked", V, block_length=k)
    teacher = ExactBlockDenoiser(EnumerableDistribution(probs, V, L), path, k)
    states = NoisyStates(make_path("masked", V), k)
    Ks, n = 2, 20000
    student = exact_block_student(teacher, states, Ks)
    x1 = torch.tensor([1, 1, 0, 0])
    # round 2: the Ks-step student's Ks steps are one step of its student; t = 0: every block from all masks
    tb = StepTarget(student, Ks, 1)(Batch(x1=x1.expand(n, L).clone()), torch.zeros(n, L), path,
                                     torch.Generator().manual_seed(2))  # fmt: skip
    assert 1 <= float(tb.stats["teacher_calls"]) <= Ks and bool(tb.reveal.all())  # both blocks' steps in each call
    for b in range(L // k):
        got = torch.bincount(states.index(tb.x1[:, b * k : (b + 1) * k]), minlength=len(states.all)).double() / n
        law = block_laws(teacher, states, x1[: b * k])  # the teacher's K steps of this block given its prefix
        assert tv(got[states.clean], law) < _floor(law, n) < 0.5 * tv(law, block_laws(teacher, states, x1[: b * k], Ks))
