"""GRPO as d1 defines it and as a user watches it: completion tokens after the first end-of-sequence token leave the
loss (by default, an option keeps them), and each step reports the reward's spread, the share of flat groups and a
warning when every group is flat."""

from __future__ import annotations

import warnings

import pytest
import torch

from tcsm.core.batch import Batch
from tcsm.models import Denoiser, DenoiserConfig
from tcsm.paths import make_path
from tcsm.posttrain.rl.estimators import OneStepEstimate, through_first_eos
from tcsm.posttrain.rl.objective import GRPOObjective
from tcsm.sampling.settings import sample_settings

V, L, P, EOS = 4, 6, 2, 3


@pytest.fixture
def parts(one_thread):
    torch.manual_seed(0)
    path = make_path("masked", V, "linear")
    model = Denoiser(DenoiserConfig(vocab_size=V, num_states=V + 1, max_len=L, d_model=16, n_layers=1, n_heads=2))
    x1 = torch.randint(0, V, (3, L))
    cond = torch.zeros(3, L, dtype=torch.bool)
    cond[:, :P] = True
    return path, model, Batch(x1=x1, cond_mask=cond)


def test_through_first_eos_keeps_the_completion_up_to_its_first_eos():
    x = torch.tensor([[3, 1, 2, 3, 0, 3], [0, 1, 2, 2, 1, 0]])
    cond = torch.zeros(2, 6, dtype=torch.bool)
    cond[:, :2] = True  # the prompt's own EOS (row 0, position 0) does not end the completion
    keep = through_first_eos(x, cond, EOS)
    assert keep.tolist() == [[True, True, True, True, False, False], [True] * 6]


def test_the_one_step_estimate_leaves_out_the_tokens_after_the_first_eos(parts):
    path, model, _ = parts
    x = torch.tensor([[1, 2, 0, 3, 1, 2]])
    cond = torch.tensor([[True, True, False, False, False, False]])
    est = OneStepEstimate(path, prompt_mask_prob=0.0)
    keep = through_first_eos(x, cond, EOS)
    whole = est(model, x, cond, torch.Generator().manual_seed(0))
    cut = est(model, x, cond, torch.Generator().manual_seed(0), keep=keep)
    after = x.clone()
    after[0, 4:] = torch.tensor([2, 1])  # other tokens after the EOS change nothing the cut estimate scores
    again = est(model, after, cond, torch.Generator().manual_seed(0), keep=through_first_eos(after, cond, EOS))
    assert not torch.allclose(whole, cut) and torch.allclose(cut, again)


def _objective(path, reward, **kw):
    return GRPOObjective(path, OneStepEstimate(path), reward, settings=sample_settings({"steps": 3}), group_size=4,
                         **kw)  # fmt: skip


def test_the_loss_scores_through_the_first_eos_by_default_and_every_token_on_request(parts):
    path, model, batch = parts

    def reward(x):
        return x[:, P:].float().sum(-1)

    grads = {}
    for keep in (False, True):
        obj = _objective(path, reward, eos_id=EOS, keep_after_eos=keep)
        model.zero_grad()
        loss, _ = obj(model, batch, torch.Generator().manual_seed(0))
        loss.backward()  # on-policy the loss is 0 in value; its gradient is what the tokens scored change
        grads[keep] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        assert (obj.eos_id is None) == keep
    tokens = obj.buffer[0].tokens
    assert bool((tokens[:, P:-1] == EOS).any())  # some rollout has tokens after an EOS
    assert not torch.allclose(grads[False], grads[True])


def test_each_step_reports_the_reward_spread_and_flat_groups_and_warns_when_all_are_flat(parts):
    path, model, batch = parts
    obj = _objective(path, lambda x: torch.ones(x.shape[0]))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _, m = obj(model, batch, torch.Generator().manual_seed(0))
    assert float(m["flat_groups"]) == 1.0 and float(m["reward_std"]) == 0.0
    assert any("every group's rewards are equal" in str(w.message) for w in seen)
    line = obj.log_line({k: float(v) for k, v in m.items()})
    assert "reward 1 (std 0)" in line and "flat groups 100%" in line and "clip fraction" in line and "kl" in line
    varied = _objective(path, lambda x: x[:, P:].float().sum(-1))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _, m = varied(model, batch, torch.Generator().manual_seed(0))
    assert float(m["flat_groups"]) < 1.0 and float(m["reward_std"]) > 0
    assert not any("every group's rewards are equal" in str(w.message) for w in seen)
