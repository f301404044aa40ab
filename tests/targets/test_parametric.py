"""Parametric targets (MATH.md §4, §5.4): AR marginalisation, teacher targets vs exact enumeration, caching, and
training a student against an explicit target."""

from __future__ import annotations

import math

import pytest
import torch

from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.models.lm_families import build_lm
from tcsm.objectives import Objective, distrib_loss, score_loss
from tcsm.paths import MaskedPath, UniformPath
from tcsm.targets.ar import (
    ExactARScore,
    TaylorARScore,
    TopKARScore,
    make_ar_estimator,
    score_candidates,
    score_candidates_naive,
)
from tcsm.targets.base import ConditionalTarget
from tcsm.targets.parametric import ARTeacher, HollowTeacher, ParametricTarget, make_teacher

PATHS = {"masked": MaskedPath, "uniform": UniformPath}


def _random_causal(V: int, seed: int = 0, **kw):
    torch.manual_seed(seed)
    m = build_lm("causal", "tiny", vocab_size=V, **kw)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.3)
    return m.eval()


def _ar_as_table(model, V: int, L: int) -> EnumerableDistribution:
    """p^AR over all V^L sequences, enumerated: the brute-force oracle."""
    toy = EnumerableDistribution(torch.ones(V**L), V, L)
    with torch.no_grad():
        logp = model.log_prob(toy.states).double()
    return EnumerableDistribution(torch.softmax(logp, 0), V, L)


@pytest.mark.parametrize("V,L", [(3, 4), (4, 3)])
def test_ar_marginal_equals_enumeration(V, L):
    """softmax_y[log p^AR([y, x^{≠i}]) − log p^AR(x)] = p^AR(y | x^{≠i}) from the enumerated joint (MATH.md §4)."""
    model = _random_causal(V, n_layers=2)
    table = _ar_as_table(model, V, L)
    assert math.isclose(float(table.probs.sum()), 1.0, rel_tol=1e-9)
    x = table.states  # every sequence
    want = table.conditionals(x)
    for est in (ExactARScore(), ExactARScore(prefix_reuse=False), TopKARScore(k=V)):
        got = est.conditionals(model, x).double()
        assert torch.allclose(got, want, atol=1e-5), est
    # The log concrete score itself: log p([y, x^{≠i}]) − log p(x).
    ell = ExactARScore()(model, x).double()
    i = 1
    y = x.clone()
    y[:, i] = (x[:, i] + 1) % V
    assert torch.allclose(
        ell[torch.arange(len(x)), i, y[:, i]], table.log_prob(y) - table.log_prob(x), atol=1e-5
    )
    assert torch.all(ell.gather(-1, x.unsqueeze(-1)) == 0)


@pytest.mark.parametrize("max_tokens", [1 << 16, 7])
def test_prefix_reuse_equals_naive(max_tokens):
    """KV-cached suffix scoring = scoring every modified sequence in full, for any chunking (MATH.md §4)."""
    V, L = 6, 9
    model = _random_causal(V, seed=1, n_layers=2)
    x = torch.randint(0, V, (3, L), generator=torch.Generator().manual_seed(0))
    cands = torch.randint(0, V, (3, L, 4), generator=torch.Generator().manual_seed(1))
    fast = score_candidates(model, x, cands, max_tokens=max_tokens)
    slow = score_candidates_naive(model, x, cands, max_tokens=max_tokens)
    assert torch.allclose(fast, slow, atol=2e-5)


def test_topk_truncates_to_candidates():
    V, L, K = 6, 5, 2
    model = _random_causal(V, seed=2)
    x = torch.randint(0, V, (4, L), generator=torch.Generator().manual_seed(0))
    ell = TopKARScore(k=K)(model, x)
    exact = ExactARScore()(model, x)
    finite = torch.isfinite(ell)
    assert (finite.sum(-1) >= K).all() and (finite.sum(-1) <= K + 1).all()
    assert finite.gather(-1, x.unsqueeze(-1)).all()  # the observed token is always a candidate
    top = model(x).topk(K, dim=-1).indices
    assert finite.gather(-1, top).all()  # candidates come from p(· | x^{<i})
    assert torch.allclose(ell[finite], exact[finite], atol=1e-5)  # candidates are scored exactly
    assert TopKARScore(k=3).sequence_scores(L, V) == L * 3 + 1
    assert ExactARScore().sequence_scores(L, V) == (V - 1) * L + 1


def test_taylor_estimator():
    """Exact at the last position (no later tokens); the target-selection part is exact everywhere, and a
    model that ignores its inputs makes the whole estimate exact (MATH.md §5.4)."""
    V, L = 5, 6
    model = _random_causal(V, seed=3, n_layers=2)
    x = torch.randint(0, V, (3, L), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the estimator must work inside the no_grad a target runs under
        tay = TaylorARScore()(model, x)
    exact = ExactARScore()(model, x)
    assert torch.allclose(tay[:, -1], exact[:, -1], atol=1e-5)
    assert not torch.allclose(tay[:, 0], exact[:, 0], atol=1e-3)  # earlier positions are approximate
    assert torch.all(tay.gather(-1, x.unsqueeze(-1)) == 0)
    assert all(p.grad is None for p in model.parameters())
    # Temperature divides ℓ.
    assert torch.allclose(TaylorARScore(temperature=2.0)(model, x), tay / 2, atol=1e-6)
    # Inputs ignored (embedding zeroed): p(x^j | x^{<j}) is position-only, so first order is exact.
    with torch.no_grad():
        model.embed.weight.zero_()
    assert torch.allclose(TaylorARScore()(model, x), ExactARScore()(model, x), atol=1e-5)
    with pytest.raises(ValueError):
        make_ar_estimator("beam")


def _exact_site_posterior(toy: EnumerableDistribution, x1, xt, t, path):
    """log p_{1|t}(x_1^i = y | x_1^{≠i}, x_t) by enumeration of the joint posterior (MATH.md §1.3)."""
    B, L = x1.shape
    V = toy.vocab_size
    post = toy.log_posterior(xt, t, path)  # [B, V^L]
    seqs = x1[:, None, None, :].repeat(1, L, V, 1)
    pos = torch.arange(L)
    seqs[:, pos, :, pos] = torch.arange(V).expand(B, L, V).permute(1, 0, 2)
    vals = post.gather(1, toy.index(seqs).view(B, -1)).view(B, L, V)
    return torch.log_softmax(vals, dim=-1)


@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_perfect_teacher_target_equals_exact_posterior_conditional(source):
    """ConditionalTarget with the toy's exact p_1(· | x^{≠i}) gives q^i = p_{1|t}(x_1^i | x_1^{≠i}, x_t) (MATH.md §1.3, §4)."""
    V, L, B = 3, 3, 64
    toy = EnumerableDistribution.random(V, L, seed=4)
    path = PATHS[source](V)
    g = torch.Generator().manual_seed(0)
    x1 = toy.sample(B, g)
    t = torch.rand(B, generator=g, dtype=torch.float64) * 0.98 + 0.01
    batch = ConditionalTarget(toy.conditionals)(x1, t, path, g)
    want = _exact_site_posterior(toy, x1, batch.xt, t, path)
    got = batch.log_q.double()
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(got))
    assert torch.allclose(got[finite], want[finite], atol=1e-5)
    if source == "masked":
        unmasked = ~batch.loss_mask
        assert torch.allclose(
            got[unmasked].exp(), torch.nn.functional.one_hot(batch.xt[unmasked], V).double()
        )


@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_ar_teacher_target_equals_posterior_of_ar_model(source):
    """With data drawn from p^AR itself, the AR parametric target is the exact posterior conditional (MATH.md §4)."""
    V, L, B = 3, 4, 32
    model = _random_causal(V, seed=5, n_layers=2)
    table = _ar_as_table(model, V, L)
    path = PATHS[source](V)
    g = torch.Generator().manual_seed(1)
    x1 = table.sample(B, g)
    t = torch.rand(B, generator=g) * 0.98 + 0.01
    batch = ParametricTarget(ARTeacher(model))(x1, t, path, g)
    want = _exact_site_posterior(table, x1, batch.xt, t.double(), path)
    finite = torch.isfinite(want)
    assert torch.allclose(batch.log_q.double()[finite], want[finite], atol=1e-4)


def test_parametric_target_cache():
    V, L = 5, 6
    torch.manual_seed(0)
    hollow = build_lm("hollow", "tiny", vocab_size=V)
    with torch.no_grad():
        for p in hollow.parameters():
            p.normal_(0.0, 0.3)
    calls = []
    teacher = HollowTeacher(hollow)
    inner = teacher.conditionals
    teacher.conditionals = lambda x: calls.append(len(x)) or inner(x)
    target = ParametricTarget(teacher, cache_size=6)
    path = MaskedPath(V)
    x = torch.randint(0, V, (4, L), generator=torch.Generator().manual_seed(0))
    t = torch.full((4,), 0.5)
    uncached = ParametricTarget(HollowTeacher(hollow))(x, t, path, torch.Generator().manual_seed(3))
    first = target(x, t, path, torch.Generator().manual_seed(3))
    assert torch.allclose(first.log_q, uncached.log_q, atol=1e-6)
    again = target(x[[2, 0, 1]], t[:3], path)
    assert calls == [4] and target.hits == 3 and target.misses == 4
    assert torch.allclose(target.conditionals(x[[2, 0]]), teacher(x[[2, 0]]), atol=1e-6)
    assert again.log_q.shape == (3, L, V)
    new = torch.randint(0, V, (4, L), generator=torch.Generator().manual_seed(9))
    target(new, t, path)
    assert len(target._cache) == 6  # least recently used entries were evicted
    with pytest.raises(ValueError, match="vocabulary"):
        target(x, t, MaskedPath(V + 1))
    # Precomputed conditionals (e.g. from disk) are served without calling the teacher.
    primed = ParametricTarget(teacher, cache_size=8)
    primed.prime(new, torch.zeros(4, L, V))
    n_calls = len(calls)
    assert torch.equal(primed.conditionals(new[[1, 3]]), torch.zeros(2, L, V)) and len(calls) == n_calls
    with pytest.raises(ValueError):
        primed.prime(new, torch.zeros(4, L, V + 1))


@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_objectives_accept_parametric_targets(source):
    """distrib (KL = soft CE, and other f-divergences) and exact score-GKL run on explicit targets and vanish /
    are minimal when the student equals the target (MATH.md §3.2, §4)."""
    V, L, B = 4, 5, 8
    torch.manual_seed(0)
    hollow = build_lm("hollow", "tiny", vocab_size=V)
    with torch.no_grad():
        for p in hollow.parameters():
            p.normal_(0.0, 0.3)
    path = PATHS[source](V)
    g = torch.Generator().manual_seed(0)
    x1 = torch.randint(0, V, (B, L), generator=g)
    t = torch.rand(B, generator=g) * 0.9 + 0.05
    batch = ParametricTarget(make_teacher(hollow))(x1, t, path, g)
    assert batch.explicit and batch.log_q.shape == (B, L, V)
    perfect = batch.log_q.clamp_min(-60.0)
    other = torch.randn(B, L, V, generator=g)
    mask = batch.loss_mask
    for div in ("kl", "reverse_kl", "itakura_saito", "squared", "logistic"):
        at_opt = distrib_loss(perfect, batch, path, divergence=div)
        away = distrib_loss(other, batch, path, divergence=div)
        assert torch.isfinite(at_opt).all() and torch.isfinite(away).all(), div
        if div == "kl":  # cross-entropy: minimal (= entropy of q) at the target
            ent = -(batch.log_q.exp() * batch.log_q.clamp_min(-60)).sum(-1)
            assert torch.allclose(at_opt[mask], ent[mask], atol=1e-4)
            assert (away[mask] >= at_opt[mask] - 1e-5).all()
        else:
            assert at_opt[mask].abs().max() < 1e-4, div
    gkl_opt = score_loss(perfect, batch, path)
    gkl_away = score_loss(other, batch, path)
    assert gkl_opt[mask].abs().max() < 1e-3 and (gkl_away[mask] > 0).all()


@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_student_trains_against_parametric_target(source):
    """A tiny student trained a few steps against a Hollow-teacher target lowers its soft cross-entropy."""
    from tcsm.models.transformer import build_denoiser

    V, L, B = 5, 8, 16
    torch.manual_seed(0)
    hollow = build_lm("hollow", "tiny", vocab_size=V)
    with torch.no_grad():
        for p in hollow.parameters():
            p.normal_(0.0, 0.3)
    path = PATHS[source](V)
    student = build_denoiser("tiny", vocab_size=V, num_states=path.num_states, d_model=32, n_layers=1)
    obj = Objective(path, ParametricTarget(make_teacher(hollow), cache_size=64), loss="distrib")
    x1 = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(0))

    def eval_loss():
        with torch.no_grad():
            return obj(student, x1, torch.Generator().manual_seed(123))[0].item()

    before = eval_loss()
    opt = torch.optim.Adam(student.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(1)
    for _ in range(30):
        loss, _ = obj(student, x1, g)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert eval_loss() < before


# --- `tcsm train` integration: an LM from config, then a student against it -----------------------

_COMMON = [
    "data.kind=synthetic", "data.vocab_size=5", "data.seq_len=8", "data.num_train=128", "data.num_valid=16",
    "data.num_test=16", "train.batch_size=16", "train.precision=fp32", "train.device=cpu", "train.progress=false",
    "train.tensorboard=false", "train.log_every=5", "train.eval_examples=16", "train.eval_every=0",
    "train.save_every=0", "sample.num=0", "optim.warmup=2", "optim.lr=3e-3", "train.steps=6",
]  # fmt: skip
_STUDENT = [
    "model.preset=tiny",
    "model.d_model=32",
    "model.n_layers=1",
    "model.n_heads=2",
    "model.cond_dim=16",
]


@pytest.mark.parametrize("family", ["mlm", "causal", "hollow"])
def test_train_teacher_then_student_from_config(tmp_path, family):
    from tcsm.builders.config import load_config
    from tcsm.core.errors import CheckpointError, ConfigError
    from tcsm.train.trainer import Trainer

    teacher_dir = tmp_path / family
    cfg = load_config(
        None, _COMMON + [f"model.name={family}", "model.preset=tiny", "objective.name=lm"]
    )
    summary = Trainer.from_config(cfg, teacher_dir, log=lambda s: None).fit()
    assert summary["bound"] == ("ar-nll" if family == "causal" else "pseudo-nll")
    assert 0 < summary["bpc"] < 2 * math.log2(5)
    for source in ("masked", "uniform"):
        cfg = load_config(
            None,
            _COMMON + _STUDENT + [f"path.source={source}", "target.name=parametric", f"target.teacher={teacher_dir}",
                                  "target.cache_size=64"],
        )  # fmt: skip
        trainer = Trainer.from_config(cfg, tmp_path / f"student-{family}-{source}", log=lambda s: None)
        target = trainer.objective.target
        assert isinstance(target, ParametricTarget) and not target.teacher.model.training
        summary = trainer.fit()
        assert math.isfinite(summary["bpc"]) and target.hits > 0  # 6 steps × 16 over 128 sequences repeat
    with pytest.raises(ConfigError, match="teacher"):
        Trainer.from_config(load_config(None, _COMMON + _STUDENT + ["target.name=parametric"]), None)
    if family == "causal":  # estimator options reach the AR teacher; options of other estimators are dropped
        from tcsm.builders.targets import load_teacher

        teacher = load_teacher(teacher_dir, estimator="topk", k=2, temperature=3.0, max_tokens=512)
        assert isinstance(teacher.estimator, TopKARScore) and teacher.estimator.k == 2
        x = torch.randint(0, 5, (2, 8))
        assert (torch.isfinite(teacher(x)).sum(-1) <= 3).all()
        assert isinstance(load_teacher(teacher_dir, estimator="taylor", k=2).estimator, TaylorARScore)
    # A diffusion checkpoint is not a teacher; an LM objective needs an LM.
    student_dir = tmp_path / f"student-{family}-masked"
    with pytest.raises(CheckpointError, match="not an LM of the families"):
        Trainer.from_config(load_config(
                None, _COMMON + _STUDENT + ["target.name=parametric", f"target.teacher={student_dir}"]
            ),
            None,
        )
    with pytest.raises(ConfigError, match="trains an LM"):
        Trainer.from_config(load_config(None, _COMMON + _STUDENT + ["objective.name=lm"]), None)


def test_presets_load():
    from tcsm.builders.config import load_config

    for family, preset in (("mlm", "mlm"), ("causal", "causal-lm"), ("hollow", "hollow")):
        cfg = load_config(preset)
        assert cfg.model.name == family and cfg.objective.name == "lm"
        # Only the AR model can be sampled (ancestrally); the others have no sampler and log none.
        assert cfg.sample.num == (4 if family == "causal" else 0)
    cfg = load_config("parametric-student", ["reference.path=runs/x"])
    assert cfg.target.name == "parametric" and cfg.model.name == "denoiser"
