"""The GRPO objective on the trainer's contract: rollout groups, metrics, the inner-update buffer and its state."""

from __future__ import annotations

import copy

import pytest
import torch

from tcsm.core.batch import Batch
from tcsm.core.errors import TrainingError
from tcsm.core.protocols import KeepsState, StepInfo, TrainerCallback
from tcsm.models import Denoiser, DenoiserConfig
from tcsm.paths import make_path
from tcsm.posttrain.rl.estimators import ELBOEstimate, OneStepEstimate
from tcsm.posttrain.rl.loss import k3_kl
from tcsm.posttrain.rl.objective import GRPOObjective
from tcsm.sampling.settings import sample_settings

V, L, P = 4, 5, 2


def parity_reward(x):
    """1 when the completion's token sum is even."""
    return (x[:, P:].sum(-1) % 2 == 0).float()


@pytest.fixture
def parts(one_thread):
    torch.manual_seed(0)
    path = make_path("masked", V, "linear")
    model = Denoiser(DenoiserConfig(vocab_size=V, num_states=V + 1, max_len=L, d_model=16, n_layers=1, n_heads=2))
    ref = Denoiser(DenoiserConfig(vocab_size=V, num_states=V + 1, max_len=L, d_model=16, n_layers=1, n_heads=2)).eval()
    x1 = torch.randint(0, V, (3, L))
    cond = torch.zeros(3, L, dtype=torch.bool)
    cond[:, :P] = True
    return path, model, ref, Batch(x1=x1, cond_mask=cond)


def make(path, ref, estimator=None, **kw):
    return GRPOObjective(path, estimator or OneStepEstimate(path), parity_reward,
                         settings=sample_settings({"steps": 3}), group_size=4, reference=ref, kl_coef=0.1, **kw)  # fmt: skip


def test_a_call_draws_groups_with_the_prompt_pinned_and_reports_the_metrics(parts):
    path, model, ref, batch = parts
    obj = make(path, ref)
    assert isinstance(obj, TrainerCallback) and isinstance(obj, KeepsState)
    loss, m = obj(model, batch, torch.Generator().manual_seed(0))
    loss.backward()
    g = obj.buffer[0]
    assert g.tokens.shape == (12, L)
    assert torch.equal(g.tokens[:, :P], batch.x1.repeat_interleave(4, 0)[:, :P])
    assert bool((g.tokens < V).all())  # every completion token drawn, no mask left
    assert set(m) >= {"loss", "reward", "accuracy", "kl", "clip_fraction", "adv_std", "ratio"}
    assert float(m["reward"]) == float(parity_reward(g.tokens).mean()) == float(m["accuracy"])
    assert float(m["ratio"]) == 1.0 and float(m["clip_fraction"]) == 0.0  # on-policy at the first iteration
    assert float(m["kl"]) >= 0
    assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in model.parameters())


def test_inner_iterations_reuse_the_buffered_group_then_draw_afresh(parts):
    path, model, ref, batch = parts
    obj = make(path, ref, estimator=ELBOEstimate(path, num_t=2, upper="eubo"), num_iterations=2)
    obj.on_fit_start(StepInfo(0, model, None))
    obj(model, batch, torch.Generator().manual_seed(0))
    first = obj.buffer[0].tokens.clone()
    obj.on_step_end(StepInfo(1, model, None))
    with torch.no_grad():  # move the policy so the ratio of iteration 1 is not 1
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    _, m = obj(model, batch, torch.Generator().manual_seed(1))
    assert torch.equal(obj.buffer[0].tokens, first)
    assert float(m["ratio"]) != 1.0
    obj.on_step_end(StepInfo(2, model, None))
    assert obj.buffer == []
    obj(model, batch, torch.Generator().manual_seed(2))
    assert not torch.equal(obj.buffer[0].tokens, first)


def test_an_unchanged_policy_has_ratio_one_at_every_inner_iteration(parts):
    """With μ = 3 and no update between the inner iterations, the old policy's ℓ of iteration k was drawn with
    iteration k's noise, as the current one is: ρ = 1 exactly at k = 1, 2 for a noisy (ELBO, one time) estimate,
    although the two iterations' estimates differ. The reference's ℓ of iteration k has that noise too: a reference
    with the policy's weights gives KL = 0 exactly at every iteration."""
    path, model, _ref, batch = parts
    model.eval()
    obj = make(path, copy.deepcopy(model), estimator=ELBOEstimate(path, num_t=1), num_iterations=3)
    obj.on_fit_start(StepInfo(0, model, None))
    _, m = obj(model, batch, torch.Generator().manual_seed(0))
    assert float(m["kl"]) == 0.0
    for step in (1, 2):
        obj.on_step_end(StepInfo(step, model, None))
        _, m = obj(model, batch, torch.Generator().manual_seed(step))
        assert float(m["ratio"]) == 1.0 and float(m["clip_fraction"]) == 0.0
        assert float(m["kl"]) == 0.0
    old = obj.buffer[0].old_logp
    assert not torch.equal(old[1], old[2])  # other noise, other estimate


def test_advantages_follow_scale_advantages_and_the_kl_is_per_completion_token(parts):
    """`scale_advantages=False` keeps the centred rewards (Dr. GRPO); with `per_token` the KL term is k3 of ℓ / n with
    n the completion's length L − P (a deterministic one-step estimate: no prompt masking, so ℓ is a function of the
    model alone)."""
    path, model, ref, batch = parts
    with torch.no_grad():  # away from the reference (both start with a zero head: equal outputs)
        for p in model.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
    est = OneStepEstimate(path, prompt_mask_prob=0.0)
    obj = make(path, ref, estimator=est, scale_advantages=False)
    _, m = obj(model, batch, torch.Generator().manual_seed(0))
    g = obj.buffer[0]
    r = g.rewards.view(3, 4)
    torch.testing.assert_close(g.advantages, (r - r.mean(1, keepdim=True)).reshape(-1))
    with torch.no_grad():
        lp, lr = est(model, g.tokens, g.cond, None), est(ref, g.tokens, g.cond, None)
    n = L - P
    torch.testing.assert_close(m["kl"], k3_kl(lp / n, lr / n).mean(), rtol=1e-5, atol=1e-7)
    assert float(m["kl"]) > 0


def test_training_state_restores_the_buffer_for_an_identical_next_loss(parts):
    path, model, ref, batch = parts
    obj = make(path, ref, num_iterations=3)
    obj.on_fit_start(StepInfo(0, model, None))
    obj(model, batch, torch.Generator().manual_seed(0))
    obj.on_step_end(StepInfo(1, model, None))
    state = obj.training_state()
    again = make(path, ref, num_iterations=3)
    again.load_training_state(state)
    again.on_fit_start(StepInfo(1, model, None))
    a, _ = obj(model, batch, torch.Generator().manual_seed(7))
    b, _ = again(model, batch, torch.Generator().manual_seed(8))  # a reused group ignores the call's noise
    assert torch.equal(a, b)
    lost = make(path, ref, num_iterations=3)
    lost.on_fit_start(StepInfo(1, model, None))
    with pytest.raises(TrainingError, match="rollout buffer"):
        lost(model, batch, torch.Generator().manual_seed(8))


def test_bad_settings_and_rewards_are_one_line_errors(parts):
    path, model, _ref, batch = parts
    with pytest.raises(ValueError, match="group_size must be >= 2"):
        GRPOObjective(path, OneStepEstimate(path), parity_reward, settings=sample_settings({}), group_size=1)
    obj = GRPOObjective(path, OneStepEstimate(path), lambda x: torch.full((x.shape[0],), float("nan")),
                        settings=sample_settings({"steps": 2}), group_size=2)  # fmt: skip
    with pytest.raises(TrainingError, match="finite number"):
        obj(model, batch, torch.Generator().manual_seed(0))
