"""Reward fine-tuning targets and reward functions (MATH.md §5.2), checked by exact enumeration where possible."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from tcsm import objectives
from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.paths import MaskedPath, UniformPath
from tcsm.posttrain.reward.targets import (
    RewardFullTarget,
    RewardN1Target,
    factorized_proposals,
    snis_weights,
    tilted_conditionals,
)
from tcsm.rewards.functions import CallableReward, GridReward, evaluate_reward, make_reward

V, L = 3, 3


def _table_reward(dist: EnumerableDistribution, values: torch.Tensor):
    """R(x) = values[index(x)]: an arbitrary reward over the enumerable state space."""
    return CallableReward(lambda x: values[dist.index(x)].float())


def _toy(seed=0):
    dist = EnumerableDistribution.random(V, L, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    r_values = 1.5 * torch.randn(V**L, generator=g, dtype=torch.float64)
    return dist, r_values


def _tilted(dist, log_table, r_values, beta):
    """p ∝ exp(log_table) · e^{R/β} over the states, normalised in log space."""
    return torch.log_softmax(log_table + r_values / beta, dim=-1)


def _marginals(dist, log_probs):
    onehot = torch.nn.functional.one_hot(dist.states, dist.vocab_size).double()
    return torch.einsum("n,nlv->lv", log_probs.exp(), onehot)


# --------------------------------------------------------------------------------------------------
# N^full: self-normalised importance sampling
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [MaskedPath(V), UniformPath(V)], ids=["masked", "uniform"])
def test_nfull_weighted_minimiser_is_tilted_posterior_marginal(path):
    """Oracle v.b/v.c: with h = exact p_{1|t} and large B, the weighted-distrib minimiser over a factorized θ,
    m^i(y) = Σ_b w_b 1[x^i_{1,b} = y], equals the marginals of p^R_{1|t} ∝ p_{1|t} e^{R/β} (TV < 0.015 at B = 10^5:
    a few ESS^{-1/2}, with R/β of standard deviation 1.5)."""
    dist, r_values = _toy(0)
    beta, B = 1.0, 100_000

    def exact_proposal(xt, t, num, generator):
        post = dist.log_posterior(xt, t, path).exp()
        return dist.states[torch.multinomial(post, num, replacement=True, generator=generator)]

    target = RewardFullTarget(
        None, _table_reward(dist, r_values), beta, num_proposals=B, xt_source="data", proposal=exact_proposal
    )
    g = torch.Generator().manual_seed(3)
    x1 = dist.sample(4, generator=g)
    t = torch.full((4,), 0.35)
    batch = target(x1, t, path, g)
    assert batch.xt.shape == (4 * B, L) and batch.weight.shape == (4 * B,)
    w = batch.weight.double().reshape(4, B) / B
    assert torch.allclose(w.sum(-1), torch.ones(4, dtype=torch.float64), atol=1e-6)
    props = batch.x1.reshape(4, B, L)
    m_hat = torch.einsum("nb,nblv->nlv", w, torch.nn.functional.one_hot(props, V).double())
    for n in range(4):
        xt_n = batch.xt[n * B : n * B + 1]
        log_post = dist.log_posterior(xt_n, t[:1], path)[0]
        exact = _marginals(dist, _tilted(dist, log_post, r_values, beta))
        tv = 0.5 * (m_hat[n] - exact).abs().sum(-1)
        assert tv.max() < 0.015, (n, tv)  # carry-over positions are exact point masses on both sides


def test_nfull_objective_gradient_vanishes_at_weighted_marginals():
    """The distrib objective on the N^full batch is −Σ_b w_b Σ_i log m^i(x^i_{1,b}) per group (MATH.md §5.2 step 3):
    its gradient w.r.t. free per-group logits is zero at log m = the weighted empirical marginals."""
    path = MaskedPath(V)
    dist, r_values = _toy(1)
    B, N = 64, 5

    def exact_proposal(xt, t, num, generator):
        post = dist.log_posterior(xt, t, path).exp()
        return dist.states[torch.multinomial(post, num, replacement=True, generator=generator)]

    target = RewardFullTarget(
        None, _table_reward(dist, r_values), 0.5, num_proposals=B, xt_source="data", proposal=exact_proposal
    )
    g = torch.Generator().manual_seed(0)
    batch = target(dist.sample(N, generator=g), torch.full((N,), 0.3), path, g)
    w = batch.weight.double().reshape(N, B) / B
    m_hat = torch.einsum(
        "nb,nblv->nlv", w, torch.nn.functional.one_hot(batch.x1.reshape(N, B, L), V).double()
    )
    logits = torch.log(m_hat.clamp_min(1e-300)).clamp_min(-50).requires_grad_(True)
    obj = objectives.Objective(path, loss="distrib", weighting="none")
    loss, _ = obj.loss_from_batch(logits.repeat_interleave(B, 0), batch)
    (grad,) = torch.autograd.grad(loss, logits)
    assert torch.isfinite(loss)
    mask = batch.loss_mask.reshape(N, B, L)[:, 0]
    assert grad[mask].abs().max() < 1e-6


def test_snis_weights_finite_for_huge_negative_rewards_and_skip_empty_groups():
    r = torch.tensor([[0.0, -1e5, -1e5], [-1e5, -1e5, -1e5], [-math.inf] * 3, [math.nan, 0.0, -math.inf]])
    w, valid = snis_weights(r, beta=1e-3, floor=-1e4)
    assert torch.isfinite(w).all()
    assert valid.tolist() == [True, False, False, True]
    assert torch.allclose(w[0], torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64))
    assert (w[1:3] == 0).all()
    assert torch.allclose(w[3], torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))
    # Without a floor, equal finite rewards are a valid (uniform) group; only −inf/NaN groups are skipped.
    w2, valid2 = snis_weights(r, beta=1e-3)
    assert valid2.tolist() == [True, True, False, True] and torch.isfinite(w2).all()
    assert torch.allclose(w2[1], torch.full((3,), 1 / 3, dtype=torch.float64))
    with pytest.raises(ValueError):
        snis_weights(torch.tensor([[math.inf, 0.0]]), 1.0)


def test_nfull_grid_reward_batch_and_loss_stay_finite():
    """R = −10^5 on half the grid with a small β: weights, loss and gradients stay finite, all-impossible groups
    get weight 0."""
    W = 16
    path = UniformPath(W)
    net = torch.nn.Sequential(torch.nn.Embedding(W, 8), torch.nn.Linear(8, W))
    model = lambda xt, t: net(xt)
    target = RewardFullTarget(
        model, GridReward(W), beta=1e-3, num_proposals=4, xt_source="data", reward_floor=-1e4
    )
    g = torch.Generator().manual_seed(0)
    x1 = torch.randint(0, W, (32, 2), generator=g)
    x1[:8, 0] = W - 1  # right half
    t = torch.linspace(0.05, 0.999, 32)
    batch = target(x1, t, path, g)
    assert torch.isfinite(batch.weight).all() and (batch.weight >= 0).all()
    groups = batch.weight.reshape(32, 4)
    right = batch.x1.reshape(32, 4, 2)[..., 0] >= W // 2
    assert (groups[right.all(-1)] == 0).all()  # all proposals impossible: the group is skipped
    assert (groups[right] == 0).all()  # an impossible proposal never gets weight
    skipped = right.all(-1).double().mean()
    assert skipped > 0 and batch.stats["groups_skipped"] == skipped  # exactly the all-impossible groups
    obj = objectives.Objective(path, target, loss="distrib")
    loss, _ = obj(model, x1, g)
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in net.parameters())


def test_pretrained_model_is_frozen():
    net = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 4))
    target = RewardFullTarget(net, GridReward(4), 1.0, xt_source="data")
    assert target.pretrained is net and not net.training
    assert not any(p.requires_grad for p in net.parameters())


def test_factorized_proposals_carry_over_unmasked_tokens():
    path = MaskedPath(4)
    xt = torch.tensor([[0, 4, 2, 4], [4, 4, 4, 4]])
    logits = torch.randn(2, 4, 4)
    props = factorized_proposals(logits, xt, path.loss_mask(xt), 50, torch.Generator().manual_seed(0))
    assert props.shape == (2, 50, 4) and props.max() < 4
    assert (props[0, :, 0] == 0).all() and (props[0, :, 2] == 2).all()


# --------------------------------------------------------------------------------------------------
# N^1: explicit tilted conditionals
# --------------------------------------------------------------------------------------------------


def _with_log_probs(dist, log_probs):
    """A differentiable view of `dist` with another probability table (its `conditionals` then carry grad)."""
    model = EnumerableDistribution.__new__(EnumerableDistribution)
    model.__dict__.update(dist.__dict__, log_probs=log_probs)
    return model


def _exact_conditional_fn(dist, path):
    return lambda x1, xt, t: path.target_conditional(dist.conditionals(x1), xt, t)


def test_n1_target_with_joint_conditionals_equals_tilted_posterior_conditionals():
    """q^{R,i} built from a joint model's conditionals p(· | x^{≠i}, x_t) is exactly the conditional of
    p^R_{1|t} ∝ p_{1|t} e^{R/β} (MATH.md §5.2, oracle v.a), for the uniform path at a fixed x_t."""
    path = UniformPath(V)
    dist, r_values = _toy(2)
    beta = 0.8
    xt = torch.tensor([[0, 2, 1]])
    t = torch.tensor([0.4])
    x1 = dist.states
    n = x1.shape[0]
    pre = _exact_conditional_fn(dist, path)(x1, xt.expand(n, L), t.expand(n))
    log_q, mask = tilted_conditionals(
        pre, x1, torch.ones(n, L, dtype=torch.bool), _table_reward(dist, r_values), beta
    )
    tilted_post = _tilted(dist, dist.log_posterior(xt, t, path)[0], r_values, beta)
    exact = EnumerableDistribution(tilted_post.exp(), V, L).conditionals(x1)
    assert mask.all()
    assert torch.allclose(log_q.double(), exact, atol=1e-5)


def test_n1_joint_model_recovers_tilted_distribution():
    """Oracle v.e: a joint model trained with L_distrib against the N^1 reward target (joint pre-trained
    conditionals, full-support proposal h) recovers p^R exactly. Masked path at t = 0: x_t is all-mask, so
    p^R_{1|t} = p^R_1; the joint model is a free table of log-probabilities."""
    path = MaskedPath(V)
    dist, r_values = _toy(4)
    beta = 0.6
    x1 = dist.states  # h = uniform over states: every x_1 weighted equally
    n = x1.shape[0]
    target = RewardN1Target(
        None,
        _table_reward(dist, r_values),
        beta,
        xt_source="data",
        pre_conditional=_exact_conditional_fn(dist, path),
    )
    batch = target(x1, torch.zeros(n), path, torch.Generator().manual_seed(0))
    assert batch.loss_mask.all()
    q = batch.log_q.double().exp()
    theta = torch.zeros(n, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [theta],
        lr=1,
        max_iter=500,
        tolerance_grad=1e-12,
        tolerance_change=1e-14,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        model = _with_log_probs(dist, torch.log_softmax(theta, -1))
        loss = -(q * model.conditionals(x1)).sum() / n  # Σ_i KL(q^{R,i} ‖ p^θ(· | x^{≠i})) + const
        loss.backward()
        return loss

    opt.step(closure)
    p_theta = torch.softmax(theta.detach(), -1)
    p_r = _tilted(dist, dist.log_probs, r_values, beta).exp()
    assert 0.5 * (p_theta - p_r).abs().sum() < 1e-4


def test_n1_factorized_pretrained_target_and_loss():
    """Factorized m^pre: q^{R,i} ∝ m^pre_i · e^{R([y, x^{≠i}])/β}; carry-over positions are δ and not in the loss;
    the objective accepts it with KL and reverse KL."""
    path = MaskedPath(V)
    dist, r_values = _toy(5)
    pre = dist.denoiser(path)
    reward = _table_reward(dist, r_values)
    target = RewardN1Target(pre, reward, 0.5, xt_source="data")
    g = torch.Generator().manual_seed(1)
    x1 = dist.sample(16, generator=g)
    t = torch.rand(16, generator=g)
    batch = target(x1, t, path, g)
    assert torch.equal(batch.loss_mask, batch.xt == path.mask_id)
    for b, i in batch.loss_mask.nonzero().tolist():
        variants = batch.x1[b].repeat(V, 1)
        variants[:, i] = torch.arange(V)
        want = torch.log_softmax(
            pre(batch.xt[b : b + 1], t[b : b + 1])[0, i] + evaluate_reward(reward, variants) / 0.5, -1
        )
        assert torch.allclose(batch.log_q[b, i], want.float(), atol=1e-5)
    model = lambda xt, tt: torch.zeros(xt.shape + (V,), requires_grad=True)
    for div in ("kl", "reverse_kl"):
        loss, _ = objectives.Objective(path, target, loss="distrib", divergence=div)(model, x1, g)
        assert torch.isfinite(loss)


def test_n1_all_impossible_position_is_dropped_not_nan():
    log_pre = torch.log_softmax(torch.randn(2, 2, 4), -1)
    x1 = torch.tensor([[0, 1], [2, 3]])
    reward = CallableReward(lambda x: torch.where(x[:, 0] == 0, torch.tensor(-math.inf), torch.tensor(0.0)))
    log_q, mask = tilted_conditionals(log_pre, x1, torch.ones(2, 2, dtype=torch.bool), reward, 1.0)
    assert not torch.isnan(log_q).any()
    # row 0, position 1: x^0 = 0 fixed, so every candidate is impossible → dropped; position 0 is fine.
    assert mask.tolist() == [[True, False], [True, True]]
    assert log_q[0, 0, 0] == -math.inf


def test_pool_sources_and_prompt_pinning():
    """x_t from a pool of pre-trained / on-policy samples; a prompt stays clean and outside the loss."""
    path = MaskedPath(5)
    calls = []

    def sampler(denoiser, n, length, p, generator):
        calls.append(denoiser)
        return torch.randint(0, 5, (n, length), generator=generator)

    pre = lambda xt, t: torch.zeros(xt.shape + (5,))
    cur = torch.nn.Linear(1, 1)  # stands in for the trained model; only its identity matters here
    reward = CallableReward(lambda x: x.float().sum(-1))
    target = RewardFullTarget(
        pre,
        reward,
        1.0,
        num_proposals=2,
        sampler=sampler,
        pool_size=16,
        refresh_every=2,
        prompt=torch.tensor([4, 3]),
    )
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        batch = target(torch.zeros(6, 5, dtype=torch.long), torch.full((6,), 0.5), path, g)
    assert calls == [pre, pre]  # refreshed after 2 calls
    assert (batch.xt[:, :2] == torch.tensor([4, 3])).all() and (batch.x1[:, :2] == torch.tensor([4, 3])).all()
    assert not batch.loss_mask[:, :2].any()
    onpolicy = RewardFullTarget(pre, reward, 1.0, num_proposals=2, sampler=sampler, xt_source="model")
    with pytest.raises(ValueError, match="model="):
        onpolicy(torch.zeros(2, 5, dtype=torch.long), torch.full((2,), 0.5), path, g)
    onpolicy(torch.zeros(2, 5, dtype=torch.long), torch.full((2,), 0.5), path, g, model=cur)
    assert calls[-1] is cur and cur.training  # the trained model's mode is restored


class _Constant(torch.nn.Module):
    """A denoiser whose every conditional is one token (`token`): its samples are that token wherever it is free."""

    def __init__(self, V: int, token: int):
        super().__init__()
        self.V, self.token = V, token
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, xt, t):
        return torch.nn.functional.one_hot(torch.full_like(xt, self.token), self.V).float() * 50 * self.scale


@pytest.mark.parametrize("cls", [RewardFullTarget, RewardN1Target])
def test_prompted_rows_are_completed_per_row_not_pooled(cls):
    """With prompts per row (Batch.cond_mask, task data), a sampling x_t source completes each row's own prompt (the
    current model's draw for "model", the frozen one's for "pretrained"); the prompt stays clean and outside the loss."""
    from tcsm.core.batch import Batch

    V, L = 5, 6
    path = MaskedPath(V)
    cur, pre = _Constant(V, 2), _Constant(V, 3)
    reward = CallableReward(lambda x: (x == 2).float().sum(-1))
    x1 = torch.tensor([[4, 1, 0, 0, 0, 0], [1, 4, 4, 0, 0, 0]])
    cond = torch.tensor([[1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]], dtype=torch.bool)
    g = torch.Generator().manual_seed(0)
    for source, token, model in (("model", 2, cur), ("pretrained", 3, None)):
        target = cls(pre, reward, 1.0, xt_source=source, sample_steps=4, pool_size=64)
        out = target(Batch(x1=x1, cond_mask=cond), torch.full((2,), 0.7), path, g, model=model)
        xt, loss = out.xt.view(2, -1, L)[:, 0], out.loss_mask.view(2, -1, L)[:, 0]
        assert torch.equal(xt[cond], x1[cond]) and not loss[cond].any()
        assert set(xt[~cond].tolist()) <= {token, path.mask_id}  # x_t noises the source's completions
        if cls is RewardN1Target:
            assert torch.equal(out.x1, torch.where(cond, x1, torch.full_like(x1, token)))
        assert target._pool is None  # no pool of unprompted draws
    # a prompt of the target's own is what every sample continues: the pool again, the rows' prompts not used
    target = cls(pre, reward, 1.0, xt_source="model", sample_steps=4, pool_size=8, prompt=torch.tensor([1]))
    out = target(Batch(x1=x1, cond_mask=cond), torch.full((2,), 0.7), path, g, model=cur)
    assert target._pool is not None and (out.xt[:, 0] == 1).all() and not out.loss_mask[:, 0].any()


# --------------------------------------------------------------------------------------------------
# reward functions
# --------------------------------------------------------------------------------------------------


def test_grid_reward_and_specs():
    r = GridReward(128)
    x = torch.tensor([[0, 5], [63, 127], [64, 0], [127, 127]])
    assert r(x).tolist() == [0.0, 0.0, -1e5, -1e5]
    r2 = make_reward("grid:width=16,right=-3")
    assert r2(torch.tensor([[7, 0], [8, 0]])).tolist() == [0.0, -3.0]
    assert make_reward({"name": "grid", "width": 16})(torch.tensor([[9, 1]])).item() == -1e5
    fn = make_reward("python:tcsm.rewards.functions:GridReward,width=4")
    assert fn(torch.tensor([[3, 0]])).item() == -1e5
    assert evaluate_reward(r, x.reshape(2, 2, 2), chunk_size=1).shape == (2, 2)
    with pytest.raises(ValueError, match="unknown reward"):
        make_reward("nope")
    with pytest.raises(ValueError, match="decode"):
        make_reward("vader")


def _decode(ids):
    return "".join(" abcdefghijklmnopqrstuvwxyz!"[i % 28] for i in ids)


def _encode(s):
    return [" abcdefghijklmnopqrstuvwxyz!".index(c) for c in s]


@pytest.mark.skipif(importlib.util.find_spec("vaderSentiment") is None, reason="vaderSentiment not installed")
def test_vader_reward_scores_decoded_text():
    r = make_reward("vader", decode=_decode)
    x = torch.tensor([_encode("i love this wonderful day"), _encode("i hate this horrible day!")])
    s = r(x)
    assert s.shape == (2,) and s[0] > 0.3 and s[1] < -0.3


@pytest.mark.skipif(
    importlib.util.find_spec("profanity_check") is None, reason="alt-profanity-check not installed"
)
def test_profanity_reward_scores_decoded_text():
    r = make_reward("profanity", decode=_decode)
    x = torch.tensor([_encode("what a lovely garden    "), _encode("you stupid fucking idiot")])
    s = r(x)
    assert s.shape == (2,) and (s <= 0).all() and s[0] > s[1]


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="transformers not installed")
def test_hf_classifier_reward_from_local_path(tmp_path):
    """A tiny random classifier built from a config (no download), saved and loaded back by path."""
    import transformers

    cfg = transformers.BertConfig(
        vocab_size=30,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
        num_labels=2,
    )
    torch.manual_seed(0)
    clf = transformers.BertForSequenceClassification(cfg).eval()
    clf.save_pretrained(tmp_path)
    x = torch.randint(0, 30, (3, 10), generator=torch.Generator().manual_seed(0))
    r = make_reward(f"hf:{tmp_path},label=1,mode=logit")
    with torch.no_grad():
        want = clf(input_ids=x).logits[:, 1]
    assert torch.allclose(r(x), want, atol=1e-5)
    lp = make_reward({"name": "hf", "path": str(tmp_path), "mode": "logprob"})(x)
    assert (lp <= 0).all() and lp.shape == (3,)


def test_task_reward_spec_scores_the_task_verifier_on_the_runs_ids():
    from tcsm.data.build import build_data

    data = build_data({"kind": "task", "task": "countdown", "num_train": 8, "num_valid": 0, "num_test": 8,
                       "options": {"count": 4}})  # fmt: skip
    reward = make_reward("task:countdown,count=4", decode=data.decode, vocab_size=data.vocab_size)
    x = data.test.x1.long()
    assert torch.equal(reward(x), torch.ones(8))
    P = data.meta["prompt_len"]
    assert reward(torch.cat([x[:, :P], x.roll(1, 0)[:, P:]], 1)).sum() < 8  # answers to other prompts
    with pytest.raises(ValueError, match="needs a task name"):
        make_reward("task")


def test_a_task_reward_takes_the_runs_task_options_as_its_defaults():
    """"task:countdown" on a run trained on Countdown with numbers up to 9 scores that Countdown (one-digit numbers,
    a shorter prompt), not the default one: with the default options every reference answer would score 0."""
    from tcsm.data.build import build_data
    from tcsm.data.tasks import run_task_options

    section = {"kind": "task", "task": "countdown", "num_train": 8, "num_valid": 0, "num_test": 8,
               "options": {"max_number": 9}}  # fmt: skip
    data = build_data(section)
    x = data.test.x1.long()
    options = run_task_options(section)
    assert options == {"countdown": {"max_number": 9}}
    ours = make_reward("task:countdown", decode=data.decode, vocab_size=data.vocab_size, task_options=options)
    assert torch.equal(ours(x), torch.ones(8))
    default = make_reward("task:countdown", decode=data.decode, vocab_size=data.vocab_size)
    assert default(x).sum() == 0
    spec_wins = make_reward("task:countdown,max_number=20", decode=data.decode, vocab_size=data.vocab_size,
                            task_options=options)  # fmt: skip
    assert spec_wins.task.options()["max_number"] == 20
    other = make_reward("task:sudoku", task_options=options)  # another task's defaults stay its own
    assert other.task.options() == make_reward("task:sudoku").task.options()
    assert run_task_options({"kind": "text"}) == {} and run_task_options(None) == {}
