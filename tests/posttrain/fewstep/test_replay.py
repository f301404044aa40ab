"""Rollouts reused across updates (`posttrain.fewstep.replay.Replayed`, MATH.md §10 "Cost"): a batch rolls out 1/reuse
of its rows and takes the others from the pool of earlier rollouts, every output row is one the target produced
with all its fields, the pool survives a checkpoint exactly, and a joint round trained on pooled rows still reaches
the teacher's K-step law by enumeration (V = 2, L = 3, the exact posterior as teacher)."""

from __future__ import annotations

import pytest
import torch

from tcsm.core.batch import Batch
from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.objectives.composed import Objective
from tcsm.paths import MaskedPath
from tcsm.posttrain.fewstep.joint import StepTarget
from tcsm.posttrain.fewstep.replay import Replayed
from tcsm.sampling.common import time_grid
from tests.posttrain.fewstep.fewstep_oracles import NoisyStates, fit, tv
from tests.posttrain.fewstep.joint_oracles import TabularJointStudent, joint_law

V, L, K = 2, 3, 4


@pytest.fixture(scope="module")
def setup():
    dist = EnumerableDistribution.random(V, L, seed=3, concentration=1.0)
    path = MaskedPath(V)
    return dist, path, NoisyStates(path, L), dist.denoiser(path)


class Counting(StepTarget):
    def __init__(self, *a):
        super().__init__(*a)
        self.rows = []

    def __call__(self, batch, t, path, generator=None, *, model=None):
        self.rows.append(int(batch.x1.shape[0]))
        return super().__call__(batch, t, path, generator, model=model)


def _call(target, dist, path, g, B=12):
    return target(Batch(x1=dist.sample(B, generator=g)), torch.rand(B, generator=g), path, g)


def test_a_batch_rolls_out_a_reuse_share_of_its_rows_and_pools_the_rest(setup):
    dist, path, _, teacher = setup
    inner = Counting(teacher, K, 2)
    target, g = Replayed(inner, 3), torch.Generator().manual_seed(0)
    seen = []
    for _ in range(8):
        tb = _call(target, dist, path, g)
        assert tb.xt.shape == (12, L) and tb.reveal.shape == (12, L) and tb.t.shape == (12,)
        fresh = inner.rows[-1]
        seen.append(torch.cat([tb.xt, tb.x1, tb.reveal.long(), (tb.t * 1e6).long()[:, None]], 1)[:fresh])
        known = torch.cat(seen)
        for row in torch.cat([tb.xt, tb.x1, tb.reveal.long(), (tb.t * 1e6).long()[:, None]], 1):
            assert (known == row).all(-1).any()  # a row some call rolled out, every field from that row
        assert float(tb.stats["reused"]) == pytest.approx((12 - fresh) / 12) and "teacher_calls" in tb.stats
    assert inner.rows == [12] + [4] * 7  # the first batch fills the pool, then ⌈12 / 3⌉ fresh rows a batch
    assert target.pool["xt"].shape[0] == 36  # reuse × B rows kept


def test_the_pool_survives_a_checkpoint_exactly(setup):
    dist, path, _, teacher = setup
    a, g = Replayed(StepTarget(teacher, K, 2), 2), torch.Generator().manual_seed(1)
    for _ in range(3):
        _call(a, dist, path, g)
    b = Replayed(StepTarget(teacher, K, 2), 2)
    b.load_training_state(a.training_state())
    ga, gb = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    ta, tb = _call(a, dist, path, ga), _call(b, dist, path, gb)
    assert all(torch.equal(getattr(ta, f), getattr(tb, f)) for f in ("xt", "t", "x1", "reveal", "loss_mask"))


def test_a_round_on_pooled_rollouts_reaches_the_teacher_k_step_law(setup):
    dist, path, states, teacher = setup
    Ks = 2
    law = states.clean_law(states.law(teacher, states.prior(), time_grid(K)))
    own = states.clean_law(states.law(teacher, states.prior(), time_grid(Ks)))
    student = TabularJointStudent(states, Ks)
    objective = Objective(path, Replayed(StepTarget(teacher, K, Ks), 4), loss="distrib", divergence="kl",
                          weighting="uniform")  # fmt: skip
    metrics = fit(objective, student, dist)
    assert tv(joint_law(states, student, Ks), law) < 0.2 * tv(own, law)
    assert float(metrics["target/reused"]) == 0.75


def test_reuse_below_two_is_refused(setup):
    with pytest.raises(ValueError, match="reuse"):
        Replayed(StepTarget(setup[3], K, 2), 1)
