"""Baseline objectives (tcsm.objectives.sedd, MATH.md §2.2, §2.3): the SEDD-style score-entropy loss is an unbiased
estimate of the time-reversal bound, tight and stationary at the exact posterior (checked by exact enumeration
on a toy), and it is selectable from a run config."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from tcsm.core.errors import ConfigError
from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.evaluation.likelihood import nelbo
from tcsm.objectives import Objective
from tcsm.objectives.sedd import ScoreEntropyObjective, score_entropy_loss
from tcsm.paths import LinearSchedule, make_path
from tcsm.targets import DataTarget, TargetBatch

F64 = torch.float64


def _mc_loss(objective, model, x1, repeats, seed):
    """Per-sequence values L · loss of `repeats` independent objective draws on x1 (nats per sequence)."""
    g = torch.Generator().manual_seed(seed)
    vals = []
    for _ in range(repeats):
        t = objective.sample_t(x1.shape[0], generator=g)
        batch = objective.target(x1, t, objective.path, g)
        vals.append(score_entropy_loss(model(batch.xt, batch.t), batch, objective.path, bound=objective.bound))
    return torch.cat(vals)


def test_expectation_equals_reversal_nelbo_for_a_fixed_model():
    """E_{t, x_t}[score entropy] = NELBO_B(x_1) (MATH.md §2.3 B, §2.4) for a model that is not the optimum."""
    V, L = 3, 2
    p = EnumerableDistribution.random(V, L, seed=0)
    path = make_path("uniform", V, "linear")
    model = EnumerableDistribution.random(V, L, seed=7).denoiser(path)  # another distribution's posterior
    x1 = p.sample(64, generator=torch.Generator().manual_seed(1)).repeat(16, 1)
    obj = ScoreEntropyObjective(path, antithetic=False)
    mc = _mc_loss(obj, model, x1, repeats=24, seed=2)
    ref = nelbo(model, x1, path, num_t=8, generator=torch.Generator().manual_seed(3))
    se = math.sqrt(mc.var().item() / mc.numel() + ref.var().item() / ref.numel())
    assert abs(mc.mean().item() - ref.mean().item()) < 4 * se
    assert ref.mean().item() > 0.1  # a non-trivial value, not two zeros agreeing


def test_tight_at_the_exact_posterior():
    """At the exact posterior the reversal bound is tight per sequence: E[loss] = −log p_1(x_1) (MATH.md §2.3 B)."""
    V, L = 3, 2
    p = EnumerableDistribution.random(V, L, seed=4)
    path = make_path("uniform", V, "linear")
    x1 = p.states.repeat(256, 1)  # every sequence, many times
    obj = ScoreEntropyObjective(path, antithetic=False)
    mc = _mc_loss(obj, p.denoiser(path), x1, repeats=2, seed=5)
    mean_per_state = mc.reshape(-1, p.states.shape[0]).mean(0)
    se = mc.reshape(-1, p.states.shape[0]).std(0) / math.sqrt(mc.numel() / p.states.shape[0])
    expected = -p.log_prob(p.states)
    assert torch.all((mean_per_state - expected).abs() < 4.5 * se + 1e-6)


def _all_pairs(p, path, t):
    """Every (x_1, x_t) at time t with its probability p_1(x_1) p_{t|1}(x_t|x_1) (exact enumeration)."""
    L = p.length
    xt_states = torch.tensor(list(itertools.product(range(path.num_states), repeat=L)), dtype=torch.long)
    tt = torch.full((len(xt_states),), t, dtype=F64)
    lk = path.log_kernel(xt_states, tt).double()  # [Nt, L, V]
    log_pt1 = lk[:, torch.arange(L), p.states].sum(-1)  # [Nt, N1]
    it, i1 = torch.nonzero(torch.ones_like(log_pt1, dtype=torch.bool), as_tuple=True)
    prob = (p.log_probs.unsqueeze(0) + log_pt1)[it, i1].exp()
    return xt_states, it, p.states[i1], prob


@pytest.mark.parametrize("bound", ["reversal", "dfm"])
@pytest.mark.parametrize("t", [0.2, 0.55, 0.9])
def test_zero_gradient_at_the_exact_posterior(t, bound):
    """∇_logits E_{x_1, x_t}[w(t) G] = 0 at m_θ = p_{1|t} marginals, for both uniform bounds; not elsewhere."""
    V, L = 3, 2
    p = EnumerableDistribution.random(V, L, seed=3)
    path = make_path("uniform", V, "linear")
    xt_states, it, x1, prob = _all_pairs(p, path, t)
    tt = torch.full((len(xt_states),), t, dtype=F64)

    def expected_loss(logits_per_state):
        logits = logits_per_state[it]
        batch = TargetBatch(xt_states[it], tt[it], x1, torch.ones_like(x1, dtype=torch.bool))
        return (prob * score_entropy_loss(logits, batch, path, bound=bound)).sum()

    exact = torch.log(p.marginals(xt_states, tt, path)).requires_grad_(True)
    loss = expected_loss(exact)
    (grad,) = torch.autograd.grad(loss, exact)
    assert grad.abs().max().item() < 1e-10

    off = (exact.detach() + 0.3 * torch.randn(exact.shape, generator=torch.Generator().manual_seed(0), dtype=F64))
    off.requires_grad_(True)
    loss_off = expected_loss(off)
    (grad_off,) = torch.autograd.grad(loss_off, off)
    assert grad_off.abs().max().item() > 1e-4
    if bound == "reversal":
        assert loss_off.item() > loss.item()  # the exact posterior minimises it


def test_masked_bound_is_the_kappa_weighted_distrib_loss():
    """On the masked source the objective is MDLM's NELBO = TCSM masked L_distrib with κ_t (MATH.md §2.2, §3.4)."""
    V, L, B = 5, 6, 8
    path = make_path("masked", V, "linear")
    g = torch.Generator().manual_seed(0)
    x1 = torch.randint(0, V, (B, L), generator=g)
    t = torch.rand(B, generator=g) * 0.98 + 0.01
    batch = DataTarget()(x1, t, path, g)
    logits = torch.randn(B, L, V, generator=g)
    ours, _ = ScoreEntropyObjective(path).loss_from_batch(logits, batch)
    tcsm, _ = Objective(path, loss="distrib", weighting="kappa").loss_from_batch(logits, batch)
    assert ours.item() == pytest.approx(tcsm.item(), rel=1e-5)


def test_gradient_flows_under_bf16_autocast():
    path = make_path("uniform", 7, LinearSchedule())
    logits = torch.randn(4, 5, 7, requires_grad=True)
    x1 = torch.randint(0, 7, (4, 5), generator=torch.Generator().manual_seed(0))
    obj = ScoreEntropyObjective(path)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        t = obj.sample_t(4)
        batch = obj.target(x1, t, path)
        loss, metrics = obj.loss_from_batch(logits, batch)
    loss.backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
    assert math.isfinite(metrics["loss"])


def test_selected_from_a_run_config():
    from tcsm.builders.assemble import build_components
    from tcsm.builders.config import load_config

    cfg = load_config("synthetic", ["objective.name=sedd", "path.source=uniform", "model.preset=tiny"])
    parts = build_components(cfg, torch.device("cpu"))
    assert isinstance(parts.objective, ScoreEntropyObjective) and parts.objective.bound == "reversal"
    x1 = parts.data.get_batch("train", list(range(4)), torch.device("cpu"))
    loss, _ = parts.objective(parts.model, x1, generator=torch.Generator().manual_seed(0))
    loss.backward()
    assert math.isfinite(loss.item())

    cfg = load_config("synthetic", ["objective.name=sedd", "objective.bound=dfm", "path.source=uniform"])
    assert build_components(cfg, torch.device("cpu")).objective.bound == "dfm"
    with pytest.raises(ConfigError, match="masked source"):
        build_components(load_config("synthetic", ["objective.name=sedd", "objective.bound=reversal"]), "cpu")
