"""The density-ratio objectives the trainer runs (MATH.md §5.1), their references, the energy model and its
likelihood estimate, checked against the loss functions of tcsm.posttrain.dre.losses and by exact enumeration."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from dre_oracles import strategy_i_loss, strategy_ii_loss

from tcsm.core.batch import Batch
from tcsm.core.errors import CheckpointError, ConfigError
from tcsm.core.protocols import Evaluates, Samples, StepInfo, TrainerCallback
from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.models.transformer import build_denoiser
from tcsm.paths import MaskedPath, UniformPath
from tcsm.paths.timesteps import sample_times
from tcsm.posttrain.dre.energy import EnergyModel
from tcsm.posttrain.dre.likelihood import energy_integrand, energy_nelbo_terms, evaluate_energy_estimate
from tcsm.posttrain.dre.losses import draw_reference_samples
from tcsm.posttrain.dre.objective import DensityRatioObjective, EnergyObjective
from tcsm.posttrain.dre.ratio_head import RatioHead
from tcsm.posttrain.dre.references import EMAReference, PreviousIterateReference
from tcsm.storage.checkpoint import save_checkpoint

V, L = 3, 3
PATHS = {"masked": MaskedPath, "uniform": UniformPath}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def dist():
    return EnumerableDistribution.random(V, L, seed=2, concentration=1.0)


def _denoiser(path, seed=0):
    torch.manual_seed(seed)
    model = build_denoiser(
        "tiny",
        vocab_size=V,
        num_states=path.num_states,
        d_model=16,
        n_layers=1,
        n_heads=2,
        cond_dim=8,
        max_len=L,
    )
    with torch.no_grad():  # a non-trivial reference / student (the zero head would make every ratio 1)
        model.head.weight.normal_(0, 0.5)
    return model


def _energy(path, readout=0.3):
    ref = _denoiser(path, seed=1)
    head = RatioHead.from_denoiser(ref)
    with torch.no_grad():
        head.out.weight.normal_(0, readout)
    return EnergyModel(ref, head)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# --- the objectives are the tested losses, drawn the way the trainer draws them ----------------------------------


@pytest.mark.parametrize("source", sorted(PATHS))
@pytest.mark.parametrize("loss", ["lsif", "bce", "gkl"])
def test_strategy_i_objective_is_strategy_i_loss(source, loss, dist):
    """Identity: per step the objective is strategy_i_loss at its own (t, x_t) draws — sequence level as is,
    token level divided by L (nats per token) — so the exact-enumeration minimisers of test_losses apply."""
    path = PATHS[source](V)
    ref, student = _denoiser(path, 1), _denoiser(path, 2)
    x1 = dist.sample(8, _gen(5))
    for level in ("token", "sequence"):
        obj = DensityRatioObjective(path, ref, level=level, loss=loss, num_negatives=3)
        got, _ = obj(student, x1, _gen(7))
        g = _gen(7)
        t = sample_times(8, antithetic=True, generator=g)
        xt = path.draw_xt(x1, t, g)
        want = strategy_i_loss(
            student,
            ref,
            path,
            x1,
            xt,
            t,
            bregman=loss,
            num_negatives=3,
            per_token=level == "token",
            generator=g,
        )
        scale = L if level == "token" else 1
        torch.testing.assert_close(got, want / scale, rtol=1e-5, atol=1e-6)


def test_sequence_level_objective_by_hand(dist):
    """Strategy (i) at the sequence level, composed by hand from the drawn tokens (not through the library's
    log-ratio): log r = Σ_{i: x_t^i = M} [log m^θ_i − log m^ref_i](x_1^i), BCE = E_data softplus(−log r) +
    E_ref softplus(log r) (MATH.md §5.1, §8 item 11). Carried positions must add nothing."""
    path = MaskedPath(V)
    ref, student = _denoiser(path, 1), _denoiser(path, 2)
    x1 = dist.sample(8, _gen(5))
    obj = DensityRatioObjective(path, ref, level="sequence", loss="bce", num_negatives=3)
    got, _ = obj(student, x1, _gen(7))
    g = _gen(7)
    t = sample_times(8, antithetic=True, generator=g)
    xt = path.draw_xt(x1, t, g)
    with torch.no_grad():
        ref_lp = torch.log_softmax(ref(xt, t), -1)
        stu_lp = torch.log_softmax(student(xt, t).float(), -1)
    neg = draw_reference_samples(ref_lp, xt, path, 3, g)
    masked = xt == path.mask_id
    assert masked.any() and (~masked).any()

    def log_r(x):  # x [8, L]
        d = (stu_lp - ref_lp).gather(-1, x.unsqueeze(-1)).squeeze(-1)
        return torch.stack([d[b][masked[b]].sum() for b in range(8)])

    l_ref = torch.stack([log_r(neg[:, j]) for j in range(3)], 1)
    want = F.softplus(-log_r(x1)).mean() + F.softplus(l_ref).mean()
    torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loss", ["lsif", "bce", "gkl"])
def test_energy_objective_is_strategy_ii_loss(loss, dist):
    """Identity: the energy objective is strategy_ii_loss of the model's head over its own frozen reference,
    although it scores data and negatives in one call."""
    path = MaskedPath(V)
    model = _energy(path)
    x1 = dist.sample(8, _gen(5))
    got, metrics = EnergyObjective(path, loss=loss, num_negatives=4)(model, x1, _gen(3))
    g = _gen(3)
    t = sample_times(8, antithetic=True, generator=g)
    xt = path.draw_xt(x1, t, g)
    want = strategy_ii_loss(
        model, model.reference, path, x1, xt, t, bregman=loss, num_negatives=4, generator=g
    )
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())


def test_gradients_reach_only_the_student_or_the_head(dist):
    """The reference is read without gradient under both strategies; the trained model gets one."""
    path = MaskedPath(V)
    ref, student = _denoiser(path, 1), _denoiser(path, 2)
    frozen = copy.deepcopy(ref.state_dict())
    x1 = dist.sample(16, _gen(0))
    loss, _ = DensityRatioObjective(path, ref, num_negatives=2)(student, x1, _gen(1))
    loss.backward()
    assert all(p.grad is None for p in ref.parameters())
    assert student.head.weight.grad.abs().sum() > 0
    model = _energy(path)
    loss, _ = EnergyObjective(path, loss="lsif")(model, x1, _gen(1))
    loss.backward()
    assert all(p.grad is None and not p.requires_grad for p in model.reference.parameters())
    assert model.head.out.weight.grad.abs().sum() > 0 and model.head.embed_clean.weight.grad.abs().sum() > 0
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert {id(p) for p in trainable} == {id(p) for p in model.head.parameters()}
    assert all(torch.equal(frozen[k], v) for k, v in ref.state_dict().items())


def test_conditioning_positions_are_never_noised_redrawn_or_scored(dist):
    """Batch.cond_mask: x_t and every negative keep the clean token there (uniform source, where every other
    position is redrawn), and the student's output there cannot move the loss."""
    path = UniformPath(V)
    ref, student = _denoiser(path, 1), _denoiser(path, 2)
    x1 = dist.sample(8, _gen(0))
    cond = torch.zeros(8, L, dtype=torch.bool)
    cond[:, 0] = True
    batch = Batch(x1, cond_mask=cond)
    obj = DensityRatioObjective(path, ref, num_negatives=5)
    tb, _, neg = obj._draw(batch, ref, _gen(4))
    assert torch.equal(tb.xt[:, 0], x1[:, 0]) and (neg[:, :, 0] == x1[:, :1]).all()
    assert not tb.loss_mask[:, 0].any()

    def loud(xt, t):  # wild logits at the conditioning position only
        out = student(xt, t).clone()
        out[:, 0] = out[:, 0] + 50.0 * torch.arange(V)
        return out

    a, _ = obj(student, batch, _gen(4))
    b, _ = obj(loud, batch, _gen(4))
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("strategy", ["i", "ii"])
def test_batch_weights_enter_linearly(strategy, dist):
    """Identity: a sequence's weight multiplies its data term and its negatives' terms, so with the same draws
    L(w = (1, 1)) = L(w = (1, 0)) + L(w = (0, 1))."""
    path = MaskedPath(V)
    if strategy == "i":
        ref, model = _denoiser(path, 1), _denoiser(path, 2)
        obj = DensityRatioObjective(path, ref, loss="lsif", num_negatives=2)
    else:
        model, obj = _energy(path), EnergyObjective(path, loss="lsif", num_negatives=2)
    x1 = dist.sample(2, _gen(0))

    def loss(w):
        return obj(model, Batch(x1, weight=torch.tensor(w)), _gen(9))[0]

    torch.testing.assert_close(loss([1.0, 1.0]), loss([1.0, 0.0]) + loss([0.0, 1.0]))


def test_energy_model_starts_at_the_reference_and_reports_chance_accuracy(dist):
    """f ≡ 0 at init (zero readout): log r = 0 on data and negatives, accuracy 1/2, BCE = 2 log 2 per sequence."""
    path = MaskedPath(V)
    model = _energy(path, readout=0.0)
    loss, m = EnergyObjective(path, loss="bce")(model, dist.sample(8, _gen(0)), _gen(1))
    assert float(m["log_r_data"]) == 0.0 and float(m["log_r_ref"]) == 0.0 and float(m["accuracy"]) == 0.5
    torch.testing.assert_close(loss, torch.tensor(2 * math.log(2)))


def test_declared_protocols():
    """Strategy (ii) brings its own evaluation and sampler; strategy (i) trains a denoiser and has neither, so the
    trainer evaluates it with the valid bound and samples it with the plain sampler. Both are callbacks."""
    path = MaskedPath(V)
    ii, i = EnergyObjective(path), DensityRatioObjective(path, "ema")
    assert isinstance(ii, Evaluates) and isinstance(ii, Samples)
    assert not isinstance(i, Evaluates) and not isinstance(i, Samples) and isinstance(i, TrainerCallback)


def test_energy_model_is_not_a_denoiser_and_keeps_its_reference_in_eval_mode():
    path = MaskedPath(V)
    model = _energy(path)
    model.train()
    assert model.head.training and not model.reference.training
    with pytest.raises(ValueError, match="SIR sampler"):
        model(torch.full((2, L), V), torch.rand(2))


# --- references of strategy (i) --------------------------------------------------------------------------------


def _info(step, model, ema=None, run_dir=None):
    return StepInfo(step=step, model=model, ema_model=ema, run_dir=run_dir)


def test_previous_iterate_reference_refreshes_every_n_steps():
    """p^ref = θ at the last multiple of N: unchanged in between, a frozen copy (no storage shared)."""
    student = torch.nn.Linear(2, 2)
    src = PreviousIterateReference(refresh_every=2)
    src.on_fit_start(_info(0, student))
    w0 = student.weight.detach().clone()
    with torch.no_grad():
        student.weight.add_(1.0)
    src.on_step_end(_info(1, student))
    assert torch.equal(src.module.weight, w0) and not src.module.weight.requires_grad
    src.on_step_end(_info(2, student))
    assert torch.equal(src.module.weight, student.weight)
    assert src.module.weight.data_ptr() != student.weight.data_ptr()


def test_previous_iterate_resume_loads_the_anchor_step_or_refuses(tmp_path):
    """Resume at step 3 with N = 2: the reference is the student of step 2, read from that step's checkpoint;
    without it the resume would change the reference, so it is refused in one line."""
    student = torch.nn.Linear(2, 2)
    anchor = torch.nn.Linear(2, 2)
    src = PreviousIterateReference(refresh_every=2)
    with pytest.raises(CheckpointError, match="step 2"):
        src.on_fit_start(_info(3, student, run_dir=tmp_path))
    save_checkpoint(tmp_path / "checkpoints", 2, model=anchor, state={})
    src = PreviousIterateReference(refresh_every=2)
    src.on_fit_start(_info(3, student, run_dir=tmp_path))
    assert torch.equal(src.module.weight, anchor.weight) and not torch.equal(
        src.module.weight, student.weight
    )


def test_ema_reference_follows_the_trainers_ema_copy():
    ema = torch.nn.Linear(2, 2)
    src = EMAReference()
    src.on_fit_start(_info(0, torch.nn.Linear(2, 2), ema))
    assert src.module is ema
    with pytest.raises(ConfigError, match="train.ema"):
        EMAReference().on_fit_start(_info(0, ema, None))


# --- the likelihood estimate of the energy model ---------------------------------------------------------------


def _exact_energy(dist, path, ref_log_m):
    """f*(x_1, x_t) = log p_{1|t}(x_1|x_t) − log p^ref(x_1|x_t) as a table over every (x_t, x_1) at one t, for a
    factorized reference with logits `ref_log_m(x_t)` [.., L, V] and carry-over (MATH.md §5.1 (ii) optimum)."""
    S = path.num_states
    xt_states = torch.tensor(list(itertools.product(range(S), repeat=L)))
    t = torch.full((xt_states.shape[0],), 0.5, dtype=torch.float64)
    log_post = dist.log_posterior(xt_states, t, path)  # [S^L, N]
    lm = torch.log_softmax(ref_log_m(xt_states).double(), -1)[:, torch.arange(L), dist.states]  # [S^L, N, L]
    masked = (xt_states == path.mask_id).unsqueeze(1)
    log_ref = torch.where(masked, lm, torch.zeros_like(lm)).sum(-1)
    table = torch.where(log_post > -math.inf, log_post - log_ref, torch.full_like(log_post, -1e4))
    radix = S ** torch.arange(L - 1, -1, -1)
    return lambda x1, xt, t: table[(xt * radix).sum(-1), dist.index(x1)].float()


def test_energy_integrand_converges_to_the_exact_posterior_marginals(dist):
    """With the exact ratio f* over a wrong (random) factorized reference, p^ref e^{f*} is the true posterior, so as
    n grows the estimated integrand Σ_{i masked} −log m̂_i(x_1^i) tends to the exact one of the true marginals
    (MATH.md §5.1, oracle vi.a); G_ref is the reference's exactly; n = 1 is far off."""
    path = MaskedPath(V)
    table = torch.log_softmax(torch.randn(L, V, generator=_gen(3)), -1)
    ref = lambda xt, t: table.expand(*xt.shape, V)
    energy = _exact_energy(dist, path, lambda xt: table.expand(*xt.shape, V))
    xt = path.draw_xt(dist.states.repeat(8, 1), torch.full((8 * V**L,), 0.5), _gen(0))
    x1 = dist.states.repeat(8, 1)
    t = torch.full((x1.shape[0],), 0.5)
    _, g_ref, g_est, _ = energy_integrand(
        ref, energy, x1, xt, t, path, num_samples=[1, 1024, 4096], generator=_gen(1)
    )
    masked = xt == V
    m_true = dist.marginals(xt, t.double(), path).gather(-1, x1.unsqueeze(-1)).squeeze(-1)
    exact = torch.where(masked, -m_true.log(), torch.zeros_like(m_true)).sum(-1)
    exact_ref = torch.where(masked, -table[torch.arange(L), x1], torch.zeros_like(m_true)).sum(-1)
    torch.testing.assert_close(g_ref, exact_ref.double(), rtol=1e-5, atol=1e-5)
    err = [float((g - exact).abs().mean()) for g in g_est]  # IS error ~ n^(-1/2): 1.4, 0.06, 0.03 nats here
    assert err[0] > 0.5 and err[2] < err[1] and err[2] < 0.05


@pytest.mark.parametrize("shift", [2.0, -5.0])
def test_the_estimate_is_unchanged_when_a_constant_is_added_to_the_energy(shift):
    """f and f + c define the same model (the normalisers Ẑ and Ẑ_i take the constant out): equal G_est with common
    random numbers, log Ẑ moved by c; for f ≡ c, G_est = G_ref (each masked position's log Ẑ − log Ẑ_i is 0)."""
    path = MaskedPath(V)
    table = torch.log_softmax(torch.randn(L, V, generator=_gen(3)), -1)
    ref = lambda xt, t: table.expand(*xt.shape, V)
    weights = torch.randn(L, V, generator=_gen(4))
    f = lambda x1, xt, t: weights[torch.arange(L), x1].sum(-1)
    x1 = torch.randint(0, V, (16, L), generator=_gen(0))
    t = torch.full((16,), 0.4)
    xt = path.draw_xt(x1, t, _gen(1))
    assert bool((xt == V).any())
    runs = {}
    for name, energy in {"f": f, "f+c": lambda *a: f(*a) + shift, "c": lambda x1, *_: torch.full((x1.shape[0],), shift)}.items():
        runs[name] = energy_integrand(ref, energy, x1, xt, t, path, num_samples=[1, 8], generator=_gen(2))
    (_, g_ref, g_f, z_f), (_, _, g_fc, z_fc), (_, _, g_c, z_c) = runs["f"], runs["f+c"], runs["c"]
    torch.testing.assert_close(g_fc, g_f, atol=1e-5, rtol=0)
    torch.testing.assert_close(z_fc, z_f + shift, atol=1e-5, rtol=0)
    torch.testing.assert_close(g_c, g_ref.expand_as(g_c), atol=1e-9, rtol=0)
    torch.testing.assert_close(z_c, torch.full_like(z_c, shift), atol=1e-9, rtol=0)
    assert not torch.allclose(g_f[-1], g_ref)  # a non-constant f does move the estimate


def test_estimate_report_is_labelled_and_moves_with_the_number_of_samples(dist):
    """The report names the estimate an estimate (never a bound), keeps the reference's valid bound in the bound
    keys, gives the estimate for every n, and the estimate settles as n grows; with f ≡ 0 it is the reference's
    bound exactly (Ẑ = Ẑ_i = 1)."""
    path = MaskedPath(V)
    model = _energy(path, readout=1.0)
    data = dist.sample(32, _gen(0))
    ns = [1, 4, 64, 256]
    out = evaluate_energy_estimate(
        model.reference, model, data, path, num_t=4, num_samples=ns, generator=_gen(1)
    )
    assert "not a bound" in out["bound"] and "reference" in out["bound"]
    assert out["bpc"] == out["reference_bpc"] and out["bpc_estimate"] == out["bpc_estimate_n256"]
    est = [out[f"bpc_estimate_n{n}"] for n in ns]
    assert len(set(est)) == len(ns)
    assert abs(est[2] - est[3]) < abs(est[0] - est[3])
    assert out["log_z_mean_n1"] < out["log_z_mean_n256"]  # E log Ẑ_n rises with n towards log Z (Jensen)
    flat = _energy(path, readout=0.0)
    out0 = evaluate_energy_estimate(
        flat.reference, flat, data, path, num_t=4, num_samples=[8], generator=_gen(1)
    )
    assert out0["bpc_estimate"] == pytest.approx(out0["reference_bpc"], abs=1e-9)
    assert out0["bpc_estimate_minus_reference"] == pytest.approx(0.0, abs=1e-9)


def test_energy_estimate_reference_part_is_the_reference_bound(dist):
    """The reference's part of `energy_nelbo_terms` estimates its valid masked bound without bias (MATH.md §2.2,
    §2.4): with the exact posterior marginals as reference the bound is tight, so its p_1-average is the entropy of
    p_1; with f ≡ 0 the estimate is the same number. (Without the weight κ_t it would be ∫ E[G] dt, far below.)"""
    path = MaskedPath(V)
    R = 24
    x1 = dist.states.repeat(R, 1)
    ref, est, _ = energy_nelbo_terms(
        dist.denoiser(path),
        lambda x, xt, t: torch.zeros(x.shape[0]),
        x1,
        path,
        num_t=16,
        num_samples=[1],
        generator=_gen(0),
    )
    w = dist.probs.double().repeat(R) / R
    mean = float((w * ref).sum())
    se = math.sqrt(float((w * (ref - mean) ** 2).sum()) / R)
    assert abs(mean - dist.entropy()) < 5 * se + 1e-3, (mean, dist.entropy(), se)
    torch.testing.assert_close(est[0], ref)


def test_student_and_reference_see_the_same_noisy_input(dist):
    """r = p^θ_{1|t} / p^ref_{1|t} at one (x_t, t) (MATH.md §5.1): the objective calls both models on exactly the
    drawn x_t and t (a time-conditioned reference at another t gives another ratio)."""
    path = UniformPath(V)
    seen = {}

    def spy(name, model):
        def fn(xt, t):
            seen[name] = (xt.clone(), t.clone())
            return model(xt, t)

        return fn

    obj = DensityRatioObjective(path, spy("reference", _denoiser(path, 1)), num_negatives=2)
    obj(spy("student", _denoiser(path, 2)), dist.sample(8, _gen(0)), _gen(1))
    assert torch.equal(seen["reference"][0], seen["student"][0])
    assert torch.equal(seen["reference"][1], seen["student"][1])


def test_energy_objective_sees_through_the_trainers_wrappers(dist):
    """The trainer may hand over DDP(compile(model)) or compile(DDP(model)); the objective finds the energy model."""
    from tcsm.posttrain.dre.objective import _unwrap

    path = MaskedPath(V)
    model = _energy(path)

    class Wrap(torch.nn.Module):
        def __init__(self, inner, attr):
            super().__init__()
            setattr(self, attr, inner)
            self.attr = attr

        def forward(self, *a):
            return getattr(self, self.attr)(*a)

    for wrapped in (Wrap(Wrap(model, "_orig_mod"), "module"), Wrap(Wrap(model, "module"), "_orig_mod")):
        assert _unwrap(wrapped) is model
        loss, _ = EnergyObjective(path)(wrapped, dist.sample(4, _gen(0)), _gen(1))
        assert torch.isfinite(loss)
