"""AR → diffusion distillation (MATH.md §5.4): right-context n-gram counts, Top-K + n-gram candidates, the
missed-mass audit, teacher-sample and on-policy proposals, cost accounting and the n-gram stored with a run —
each against exact enumeration on tiny state spaces."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch

from tcsm.core.errors import CheckpointError
from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.models.lm_families import build_lm
from tcsm.paths import MaskedPath, UniformPath
from tcsm.posttrain.distill.ngram import RightContextNgram
from tcsm.posttrain.distill.target import NGRAM_FILE, DistillTarget
from tcsm.targets.ar import (
    ExactARScore,
    TaylorARScore,
    TopKARScore,
    TopKNgramARScore,
    first_occurrence,
    missed_mass,
    sample_ar,
    score_candidates,
    score_candidates_naive,
)
from tcsm.targets.parametric import ARTeacher, ParametricTarget


def _random_causal(V: int, seed: int = 0, **kw):
    torch.manual_seed(seed)
    m = build_lm("causal", "tiny", vocab_size=V, **kw)
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.3)
    return m.eval()


def _ar_table(model, V: int, L: int) -> EnumerableDistribution:
    """p^AR over all V^L sequences, enumerated (the brute-force oracle)."""
    toy = EnumerableDistribution(torch.ones(V**L), V, L)
    with torch.no_grad():
        logp = model.log_prob(toy.states).double()
    return EnumerableDistribution(torch.softmax(logp, 0), V, L)


# --------------------------------------------------------------------------------------------------- n-gram


def _brute_counts(rows, c: int) -> Counter:
    """n(token, x^{i+1:i+c}) by direct iteration over every row and position."""
    out = Counter()
    for row in rows.tolist():
        for i in range(len(row) - c):
            out[(row[i], tuple(row[i + 1 : i + 1 + c]))] += 1
    return out


def test_ngram_counts_are_exact_on_a_toy_corpus():
    """Every (token, right context) count of every order equals direct counting; contexts stop at a row's end."""
    V, N = 4, 3
    rows = torch.randint(0, V, (37, 9), generator=torch.Generator().manual_seed(0))
    ng = RightContextNgram.fit(rows, N, V)
    for c in range(N):
        want = _brute_counts(rows, c)
        for tok in range(V):
            for ctx in itertools.product(range(V), repeat=c):
                assert ng.count(tok, ctx) == want.get((tok, ctx), 0), (tok, ctx)
    assert sum(ng.count(t) for t in range(V)) == rows.numel()  # c = 0: the unigram of every position
    with pytest.raises(ValueError):
        ng.count(0, (1, 2, 3))


def test_ngram_backoff_distribution_and_topk_order():
    """log_probs uses the longest seen right context (shorter ones when unseen or cut by the sequence end);
    topk lists its tokens by count, then fills from shorter contexts, with no repeats and −1 when exhausted."""
    rows = torch.tensor([[0, 1, 2, 1, 2], [1, 1, 2, 0, 2]])
    ng = RightContextNgram.fit(rows, 3, 4)  # token 3 never occurs
    x = torch.tensor([[3, 1, 2, 3, 3, 2]])
    p = ng.log_probs(x).exp()
    assert torch.allclose(p.sum(-1), torch.ones(1, 6, dtype=torch.float64))
    # i = 0: context (1, 2) seen after 0, 2 (row 0) and 1 (row 1): uniform over {0, 1, 2}.
    assert torch.allclose(p[0, 0, :3], torch.full((3,), 1 / 3, dtype=torch.float64)) and p[0, 0, 3] == 0
    # i = 2: context (3, 3) unseen, (3,) unseen: back off to the unigram 2:10 → 0: 2, 1: 4, 2: 4.
    assert torch.allclose(p[0, 2], torch.tensor([0.2, 0.4, 0.4, 0.0], dtype=torch.float64))
    # i = 5 (last): no right context at all: the unigram.
    assert torch.allclose(p[0, 5], p[0, 2])
    top = ng.topk(x, 4)
    assert top[0, 0].tolist()[:3] == [0, 1, 2] and top[0, 0, 3] == -1  # only 3 distinct tokens ever seen
    # i = 1: context (2, 3) unseen → (2,): after "2" come 1 (twice) and 0 (once); then the unigram adds 2.
    assert top[0, 1].tolist() == [1, 0, 2, -1]
    assert first_occurrence(torch.tensor([[3, 1, 3, -1, 1, 0]])).tolist() == [[True, True, False, False, False, True]]


def test_ngram_save_load_roundtrip_and_order_limit(tmp_path):
    rows = torch.randint(0, 7, (20, 6), generator=torch.Generator().manual_seed(1))
    ng = RightContextNgram.fit(rows, 3, 7)
    ng.save(tmp_path / "ng.safetensors", {"hello": 1})
    back, info = RightContextNgram.load(tmp_path / "ng.safetensors")
    assert info == {"hello": 1} and back.order == 3 and back.vocab_size == 7
    assert torch.equal(back.topk(rows, 5), ng.topk(rows, 5))
    assert not list(tmp_path.glob(".*"))  # the temporary file of the atomic write is gone
    (tmp_path / "bad.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="n-gram"):
        RightContextNgram.load(tmp_path / "bad.safetensors")
    with pytest.raises(ValueError, match="too large"):
        RightContextNgram.check_order(5, 50257)


# --------------------------------------------------------------------------------------------------- estimators


def test_topk_ngram_union_is_scored_exactly():
    """C_i = TopK p^AR(·|x^{<i}) ∪ TopK' n-gram ∪ {x^i}: every member finite and equal to the exact ℓ, nothing else."""
    V, L = 7, 6
    model = _random_causal(V, seed=1, n_layers=2)
    data = torch.randint(0, V, (50, L), generator=torch.Generator().manual_seed(2))
    ng = RightContextNgram.fit(data, 3, V)
    x = torch.randint(0, V, (4, L), generator=torch.Generator().manual_seed(3))
    est = TopKNgramARScore(k=2, ngram=ng, ngram_k=2)
    ell = est(model, x)
    exact = ExactARScore()(model, x)
    want = torch.zeros(4, L, V, dtype=torch.bool)
    want.scatter_(-1, model(x).topk(2, dim=-1).indices, True)
    g = ng.topk(x, 2)
    want.scatter_(-1, g.clamp_min(0), g >= 0)
    want.scatter_(-1, x.unsqueeze(-1), True)
    assert torch.equal(torch.isfinite(ell), want)
    assert torch.allclose(ell[want], exact[want], atol=1e-5)
    assert est.sequence_scores(L, V) == L * 4 + 1


@pytest.mark.parametrize("k,ngram_k", [(7, 1), (1, 7)])
def test_topk_ngram_equals_exact_when_candidates_cover_the_vocabulary(k, ngram_k):
    """With K = V (teacher) or K' = V (an n-gram that has seen every token) the candidate set is 𝒳 and the
    conditionals equal the exact AR marginal, as does the resulting target (MATH.md §5.4)."""
    V, L = 7, 5
    model = _random_causal(V, seed=4, n_layers=2)
    data = torch.arange(V * L).remainder(V).view(V, L)  # every token occurs
    ng = RightContextNgram.fit(data, 2, V)
    x = torch.randint(0, V, (6, L), generator=torch.Generator().manual_seed(5))
    est = TopKNgramARScore(k=k, ngram=ng, ngram_k=ngram_k)
    assert torch.allclose(est.conditionals(model, x), ExactARScore().conditionals(model, x), atol=1e-5)
    path = MaskedPath(V)
    t = torch.rand(6, generator=torch.Generator().manual_seed(6))
    got = DistillTarget(ARTeacher(model, est))(x, t, path, torch.Generator().manual_seed(7))
    ref = ParametricTarget(ARTeacher(model, "exact"))(x, t, path, torch.Generator().manual_seed(7))
    assert torch.equal(got.xt, ref.xt) and torch.equal(got.loss_mask, ref.loss_mask)
    finite = torch.isfinite(ref.log_q)
    assert torch.equal(finite, torch.isfinite(got.log_q))
    assert torch.allclose(got.log_q[finite], ref.log_q[finite], atol=1e-5)
    assert got.stats["seq_scores"] == (V - 1) * L + 1  # all of 𝒳 scored, each changed sequence once


@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_distill_target_is_the_parametric_target_on_both_sources(source):
    """log q^i = log_softmax[log p^AR(· | x^{≠i}) + log k_t(x_t^i | ·)] at the drawn (t, x_t) (MATH.md §1.3, §5.4):
    equal to `ParametricTarget` with the same teacher, and to the formula. On the masked source the kernel is flat
    at masked positions, so only the uniform source sees the kernel's time (k at 1 − t differs by nats there)."""
    V, L, B = 5, 4, 6
    model = _random_causal(V, seed=9, n_layers=1)
    path = {"masked": MaskedPath, "uniform": UniformPath}[source](V)
    x = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(0))
    t = torch.tensor([0.05, 0.2, 0.35, 0.6, 0.8, 0.95])
    got = DistillTarget(ARTeacher(model, "exact"))(x, t, path, torch.Generator().manual_seed(1))
    ref = ParametricTarget(ARTeacher(model, "exact"))(x, t, path, torch.Generator().manual_seed(1))
    assert torch.equal(got.xt, ref.xt) and torch.equal(got.loss_mask, ref.loss_mask)
    finite = torch.isfinite(ref.log_q)
    assert torch.equal(finite, torch.isfinite(got.log_q))
    torch.testing.assert_close(got.log_q[finite], ref.log_q[finite], atol=1e-5, rtol=0)
    cond = ExactARScore().conditionals(model, x).double()
    want = torch.log_softmax(cond + path.log_kernel(got.xt, t.double()), -1)
    torch.testing.assert_close(got.log_q.double()[finite], want[finite], atol=1e-5, rtol=0)


def test_proposals_are_what_gets_noised_and_prompts_are_never_scored():
    """x_t ~ p_{t|1}(· | x_1) of the proposal x_1 itself (MATH.md §3.1, §5.4: the pair (x_1, x_t) is drawn from h),
    not of the data batch; prompt positions stay clean and out of the loss on the uniform source too, where every
    other position is free."""
    from tcsm.core.batch import Batch

    V, L, B = 5, 4, 32
    model = _random_causal(V, seed=10)
    path = MaskedPath(V)
    data = torch.zeros(B, L, dtype=torch.long)
    tb = DistillTarget(ARTeacher(model, "topk", k=2), "teacher")(
        data, torch.full((B,), 0.6), path, torch.Generator().manual_seed(0)
    )
    kept = tb.xt != path.mask_id
    assert kept.any() and torch.equal(tb.xt[kept], tb.x1[kept]) and (tb.x1[kept] != 0).any()
    prompt = torch.zeros(B, L, dtype=torch.bool)
    prompt[:, :2] = True
    x = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(1))
    tb = DistillTarget(ARTeacher(model, "exact"))(
        Batch(x, cond_mask=prompt), torch.full((B,), 0.3), UniformPath(V), torch.Generator().manual_seed(2)
    )
    assert torch.equal(tb.xt[prompt], x[prompt])
    assert not tb.loss_mask[prompt].any() and tb.loss_mask[~prompt].all()


def test_estimator_option_errors_are_value_errors():
    """Options of another estimator and a missing n-gram are user errors (one line in the CLI), not crashes."""
    from tcsm.targets.ar import make_ar_estimator

    with pytest.raises(ValueError, match="topk"):
        make_ar_estimator("topk", temperature=2.0)
    model = _random_causal(4)
    with pytest.raises(ValueError, match="no n-gram"):
        make_ar_estimator("topk_ngram", k=2)(model, torch.zeros(1, 3, dtype=torch.long))


def test_cost_accounting_counts_what_the_teacher_evaluates():
    """seq_scores = 1 + distinct changed sequences ((V−1)L+1 for exact); token_evals = the positions the teacher
    really ran: L for the base pass plus L−1−i per changed sequence at i (prefix reuse), counted by a wrapper."""
    V, L, B = 5, 6, 3
    model = _random_causal(V, seed=6)
    evaluated = []
    inner = model.extend

    def counting_extend(tokens, cache, start, return_cache=False):
        evaluated.append(tokens.numel())
        return inner(tokens, cache, start, return_cache)

    model.extend = counting_extend
    x = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(0))
    est = ExactARScore(max_tokens=40).estimate(model, x)
    assert torch.equal(est.seq_scores, torch.full((B,), float((V - 1) * L + 1)))
    assert sum(evaluated) + B * L == float(est.token_evals.sum())
    assert float(est.token_evals[0]) == L + (V - 1) * L * (L - 1) / 2
    evaluated.clear()
    top = TopKARScore(k=3).estimate(model, x)
    n_changed = torch.isfinite(top.ell).sum(-1) - 1  # candidates other than x^i, each scored once
    assert torch.equal(top.seq_scores, 1.0 + n_changed.sum(-1).float())
    assert (top.seq_scores <= TopKARScore(k=3).sequence_scores(L, V)).all()
    assert sum(evaluated) + B * L == float(top.token_evals.sum())


def test_ragged_scoring_skips_invalid_entries_and_matches_naive():
    V, L = 6, 7
    model = _random_causal(V, seed=7, n_layers=2)
    x = torch.randint(0, V, (3, L), generator=torch.Generator().manual_seed(0))
    cands = torch.randint(-1, V, (3, L, 5), generator=torch.Generator().manual_seed(1))
    valid = torch.rand(3, L, 5, generator=torch.Generator().manual_seed(2)) < 0.6
    fast = score_candidates(model, x, cands, max_tokens=9, valid=valid)
    slow = score_candidates_naive(model, x, cands, valid=valid)
    use = valid & (cands >= 0)
    assert torch.equal(torch.isfinite(fast), use) and torch.equal(torch.isfinite(slow), use)
    assert torch.allclose(fast[use], slow[use], atol=2e-5)


# --------------------------------------------------------------------------------------------------- audit


@pytest.mark.parametrize("source", ["masked", "uniform"])
def test_missed_mass_metric_is_exact_on_an_enumerable_teacher(source):
    """target/missed_mass = mean over (b, i) of 1 − Σ_{y∈C_i} p^AR(y | x^{≠i}), with p^AR(·|x^{≠i}) from the
    enumerated joint; for truncation estimators it equals the TV to the exact conditional, Taylor misses none."""
    V, L, B = 4, 3, 16
    model = _random_causal(V, seed=8, n_layers=2)
    table = _ar_table(model, V, L)
    x = table.sample(B, torch.Generator().manual_seed(0))
    path = {"masked": MaskedPath, "uniform": UniformPath}[source](V)
    t = torch.rand(B, generator=torch.Generator().manual_seed(1))
    want_cond = table.conditionals(x).double().exp()
    for est in (TopKARScore(k=1), TopKARScore(k=2)):
        tb = DistillTarget(ARTeacher(model, est), audit_rows=B)(x, t, path, torch.Generator().manual_seed(2))
        inside = torch.isfinite(est(model, x))
        want = (1 - (want_cond * inside).sum(-1)).mean()
        assert math.isclose(float(tb.stats["missed_mass"]), float(want), abs_tol=1e-5)
        assert math.isclose(float(tb.stats["tv_to_exact"]), float(want), abs_tol=1e-5)
        assert float(want) > 0.01
    tb = DistillTarget(ARTeacher(model, TaylorARScore()), audit_rows=4)(x, t, path)
    assert abs(float(tb.stats["missed_mass"])) < 1e-6 and float(tb.stats["tv_to_exact"]) > 0.01
    assert float(missed_mass(ExactARScore()(model, x), table.conditionals(x)).abs().max()) < 1e-6


# --------------------------------------------------------------------------------------------------- proposals


def test_teacher_samples_follow_the_teacher_distribution():
    """x_1 ~ p^AR through the KV cache: empirical TV to the enumerated p^AR is at the Monte Carlo level, and the
    cached sampler draws exactly what the uncached one draws with the same generator."""
    V, L, n = 3, 3, 20000
    model = _random_causal(V, seed=9, n_layers=2)
    table = _ar_table(model, V, L)
    x = sample_ar(model, n, L, torch.Generator().manual_seed(0))
    counts = torch.bincount(table.index(x), minlength=V**L).double()
    tv = 0.5 * (counts / n - table.probs.double()).abs().sum()
    assert float(tv) < 0.03  # E[TV] ≈ 0.012 for 27 states and 20k draws
    plain = torch.nn.Module()
    plain.forward = lambda y: model(y)  # no kv_cache / extend: reruns every prefix
    plain.vocab_size = V
    plain.register_parameter("p", torch.nn.Parameter(torch.zeros(1)))
    assert torch.equal(sample_ar(plain, 64, L, torch.Generator().manual_seed(3)),
                       sample_ar(model, 64, L, torch.Generator().manual_seed(3)))  # fmt: skip


def test_teacher_proposal_replaces_the_data_and_student_proposal_samples_the_model():
    V, L, B = 5, 4, 6
    model = _random_causal(V, seed=10)
    teacher = ARTeacher(model, "topk", k=2)
    path = MaskedPath(V)
    data = torch.zeros(B, L, dtype=torch.long)
    t = torch.full((B,), 0.5)
    tb = DistillTarget(teacher, "teacher")(data, t, path, torch.Generator().manual_seed(0))
    assert torch.equal(tb.x1, sample_ar(model, B, L, torch.Generator().manual_seed(0)))

    class Always(torch.nn.Module):  # a student that puts all its mass on token 3
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, xt, t):
            out = torch.full(xt.shape + (V,), -1e4)
            out[..., 3] = 0.0
            return out + self.w

    student = Always().train()
    tb = DistillTarget(teacher, "student", sample_steps=3)(data, t, path, torch.Generator().manual_seed(1), model=student)
    assert torch.equal(tb.x1, torch.full((B, L), 3)) and student.training
    with pytest.raises(ValueError, match="model being trained"):
        DistillTarget(teacher, "student")(data, t, path)
    with pytest.raises(ValueError, match="proposal"):
        DistillTarget(teacher, "beam")


def test_hf_teacher_scores_candidates_with_its_cache_and_samples():
    """Batched, ragged candidate scoring with prefix reuse through the HF key/value cache = naive scoring; the
    HF teacher samples through its cache too (same draws as without)."""
    tf = pytest.importorskip("transformers")
    from tcsm.models.hf import HFCausalLM

    torch.manual_seed(0)
    V, L = 6, 5
    hf = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=9, n_embd=16, n_layer=2, n_head=2, n_positions=16)).eval()
    ad = HFCausalLM(hf, list(range(V)), bos_token_id=8)
    calls = []
    inner = ad.extend
    ad.extend = lambda *a, **k: calls.append(1) or inner(*a, **k)
    x = torch.randint(0, V, (3, L), generator=torch.Generator().manual_seed(1))
    cands = torch.randint(0, V, (3, L, 4), generator=torch.Generator().manual_seed(2))
    valid = first_occurrence(cands)
    fast = score_candidates(ad, x, cands, valid=valid)
    assert calls  # the cached path ran
    slow = score_candidates_naive(ad, x, cands, valid=valid)
    assert torch.allclose(fast[valid], slow[valid], atol=1e-5)
    calls.clear()
    s = sample_ar(ad, 8, L, torch.Generator().manual_seed(4))
    assert len(calls) == L - 1 and s.shape == (8, L) and int(s.max()) < V


# --------------------------------------------------------------------------------------------------- n-gram with a run


def test_ngram_is_stored_with_the_run_and_reused(tmp_path, monkeypatch):
    V, L = 5, 6
    model = _random_causal(V, seed=11)
    rows = torch.randint(0, V, (40, L), generator=torch.Generator().manual_seed(0))
    target = DistillTarget(ARTeacher(model, "topk_ngram", k=2), ngram_rows=rows, ngram_order=3)
    target.prepare_ngram(tmp_path)
    assert (tmp_path / NGRAM_FILE).is_file()
    first = target.estimator.ngram.topk(rows, 3)

    def no_counting(*a, **k):
        raise AssertionError("the stored n-gram should have been loaded")

    monkeypatch.setattr(RightContextNgram, "fit", no_counting)
    again = DistillTarget(ARTeacher(model, "topk_ngram", k=2), ngram_rows=rows, ngram_order=3)
    again.prepare_ngram(tmp_path)
    assert torch.equal(again.estimator.ngram.topk(rows, 3), first)
    other = DistillTarget(ARTeacher(model, "topk_ngram", k=2), ngram_rows=rows, ngram_order=2)
    with pytest.raises(CheckpointError, match="order"):
        other.prepare_ngram(tmp_path)
    (tmp_path / NGRAM_FILE).write_bytes(b"\x00" * 16)
    with pytest.raises(CheckpointError, match="delete it"):
        again.prepare_ngram(tmp_path)
