"""The GRPO surrogate: group advantages, the sign of every term, the clipping side, and the on-policy gradient
against the exact ∇ E_p[R] by enumeration."""

from __future__ import annotations

import itertools

import pytest
import torch

from tcsm.models.causal import CausalLM
from tcsm.models.lm import LMConfig
from tcsm.posttrain.rl.advantages import group_advantages
from tcsm.posttrain.rl.estimators import ExactEstimate
from tcsm.posttrain.rl.loss import grpo_loss, k3_kl


def test_group_advantages_centre_and_scale_within_each_group():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [3.0, 1.0, 2.0, 2.0]])
    a = group_advantages(r)
    s = torch.tensor([1.0, 0.0, 0.0, 1.0]).std()  # unbiased, as GRPO
    assert torch.allclose(a[0], (r[0] - 0.5) / s)
    assert torch.equal(a[1], torch.zeros(4))  # equal rewards: no signal, not 0/0
    assert torch.allclose(a[2], (r[2] - 2.0) / r[2].std())
    assert torch.allclose(a.sum(1), torch.zeros(3), atol=1e-6)
    assert torch.equal(group_advantages(r, scale=False)[2], r[2] - 2.0)
    with pytest.raises(ValueError, match="G >= 2"):
        group_advantages(torch.ones(3, 1))


def _grad(logp0: float, old: float, adv: float, clip_eps=0.2, ref=None, kl_coef=0.0):
    logp = torch.tensor([logp0], requires_grad=True)
    terms = grpo_loss(logp, torch.tensor([old]), torch.tensor([adv]), clip_eps=clip_eps,
                      ref_logp=None if ref is None else torch.tensor([ref]), kl_coef=kl_coef)  # fmt: skip
    terms.loss.backward()
    return float(logp.grad), terms


def test_advantage_sign_sets_the_direction_of_the_update():
    g_pos, _ = _grad(-2.0, -2.0, 1.5)  # on-policy: ρ = 1
    g_neg, _ = _grad(-2.0, -2.0, -1.5)
    assert g_pos == pytest.approx(-1.5)  # the loss falls as ℓ rises: a step raises a good rollout's likelihood
    assert g_neg == pytest.approx(1.5)


@pytest.mark.parametrize(
    "log_ratio, adv, clipped",
    [(0.5, 1.0, True), (-0.5, 1.0, False), (-0.5, -1.0, True), (0.5, -1.0, False), (0.1, 1.0, False)],
)
def test_clipping_removes_the_gradient_only_on_the_side_that_would_overshoot(log_ratio, adv, clipped):
    """ρ > 1 + ε with A > 0, or ρ < 1 − ε with A < 0: clipped (no gradient); the other sides keep ρ·A."""
    g, terms = _grad(-1.0 + log_ratio, -1.0, adv)
    assert float(terms.clip_fraction) == float(clipped)
    if clipped:
        assert g == 0.0
    else:
        assert g == pytest.approx(-adv * torch.exp(torch.tensor(log_ratio)).item(), rel=1e-5)


def test_k3_kl_is_nonnegative_zero_at_the_reference_and_pulls_toward_it():
    d = torch.linspace(-3, 3, 13)
    kl = k3_kl(torch.zeros(13), d)
    assert bool((kl >= 0).all()) and float(kl[6]) == 0.0
    g_above, t = _grad(-1.0, -1.0, 0.0, ref=-2.0, kl_coef=0.5)  # ℓ_θ above the reference: the KL lowers it
    g_below, _ = _grad(-3.0, -3.0, 0.0, ref=-2.0, kl_coef=0.5)
    assert g_above > 0 and g_below < 0
    assert float(t.kl) == pytest.approx(float(torch.expm1(torch.tensor(-1.0)) + 1.0))


def test_per_token_normalisation_divides_the_log_ratio_by_the_length():
    logp = torch.tensor([-4.0], requires_grad=True)
    terms = grpo_loss(logp, torch.tensor([-5.0]), torch.tensor([1.0]), clip_eps=0.9, num_tokens=torch.tensor([4]))
    assert float(terms.ratio) == pytest.approx(float(torch.exp(torch.tensor(0.25))))


def test_on_policy_surrogate_gradient_is_the_exact_policy_gradient():
    """With ℓ exact (an AR policy), ρ = 1 and no clipping, −∇ of the surrogate over every completion weighted by
    p(c)·N equals ∇ E_{c~p}[R(c)] = Σ_c ∇p(c) R(c), by enumeration; the baseline b drops out (Σ_c ∇p(c) = 0)."""
    torch.manual_seed(0)
    V, L, P = 3, 4, 1
    model = CausalLM(LMConfig(vocab_size=V, max_len=L, d_model=16, n_layers=1, n_heads=2))
    comps = torch.tensor(list(itertools.product(range(V), repeat=L - P)))
    x = torch.cat([torch.full((comps.shape[0], P), 1), comps], 1)
    cond = torch.zeros_like(x, dtype=torch.bool)
    cond[:, :P] = True
    reward = (comps.sum(-1) % 2 == 0).double() + 0.1 * comps[:, 0].double()
    params = [p for p in model.parameters() if p.requires_grad]

    ell = ExactEstimate()(model, x, cond).double()
    expected = torch.autograd.grad((ell.exp() * reward).sum(), params)

    ell = ExactEstimate()(model, x, cond).double()
    p = ell.detach().exp()
    baseline = 0.37
    adv = (reward - baseline) * p * x.shape[0]  # mean over the enumeration = Σ_c p(c) A(c)
    loss = grpo_loss(ell, ell.detach(), adv, clip_eps=0.2).loss
    got = torch.autograd.grad(-loss, params)
    for g, e in zip(got, expected):
        assert torch.allclose(g, e, atol=1e-6, rtol=1e-4)  # the model computes in float32
    assert max(float(e.abs().max()) for e in expected) > 1e-4  # a gradient that is not trivially zero


def test_per_token_kl_is_the_k3_of_the_per_token_log_likelihoods():
    """With `num_tokens` n, the KL term is k3 of ℓ_θ / n against ℓ_ref / n (as the ratio is per token), and it enters
    the loss with its coefficient: at n = 4, ℓ_θ = −4, ℓ_ref = −6, k3 = e^d − d − 1 at d = (ℓ_ref − ℓ_θ)/n = −0.5
    is ≈ 0.107, not the sequence-level d = −2's ≈ 1.135 (the second rollout, at its reference, adds 0)."""
    logp, ref = torch.tensor([-4.0, -2.0]), torch.tensor([-6.0, -2.0])
    n = torch.tensor([4, 1])
    terms = grpo_loss(logp, logp, torch.zeros(2), clip_eps=0.2, ref_logp=ref, kl_coef=0.5, num_tokens=n)
    want = (k3_kl(torch.tensor(-1.0), torch.tensor(-1.5)) + 0.0) / 2
    assert float(terms.kl) == pytest.approx(float(want), rel=1e-6)
    assert float(terms.loss) == pytest.approx(0.5 * float(want), rel=1e-6)  # A = 0: the loss is the KL term alone
