"""Preference fine-tuning (MATH.md §5.3, §8 item 18): the losses' optima by exact enumeration, the sequence
log-ratio's support (noised response positions only), prompts as conditioning, the frozen reference, the held-out
metrics, and the `pairs` data kind's record handling."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from tcsm.core.batch import Batch
from tcsm.data import DataError, build_data
from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.paths import MaskedPath, UniformPath
from tcsm.paths.schedules import LinearSchedule
from tcsm.paths.timesteps import sample_times
from tcsm.posttrain.preference.objective import (
    PreferenceObjective,
    dpo_preference_loss,
    paper_preference_loss,
    sequence_log_ratio,
)

PATHS = {"masked": MaskedPath, "uniform": UniformPath}
GPT2_BPE = Path(__file__).resolve().parents[4] / "shared" / "data" / "gpt2_bpe"


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --------------------------------------------------------------------------------------------------- optima


def _bradley_terry(V: int = 3, L: int = 2, seed: int = 0):
    """p over V^L sequences, a reward R, and the normalised BT winner / loser laws
    p^w(x) = 2 p(x) Σ_y p(y) σ(R(x) − R(y)), p^l(x) = 2 p(x) Σ_y p(y) σ(R(y) − R(x)) (MATH.md §5.3)."""
    p = EnumerableDistribution.random(V, L, seed=seed).probs
    R = torch.randn(p.numel(), generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    win = torch.sigmoid(R[:, None] - R[None, :])  # P(x ≻ y)
    unnormalised = p * (win * p[None, :]).sum(1)
    assert abs(float(unnormalised.sum()) - 0.5) < 1e-12  # MATH.md §5.3: the printed winner law sums to 1/2
    return p, R, win, 2 * unnormalised, 2 * p * (win.T * p[None, :]).sum(1)


def _minimise(fn, n: int) -> torch.Tensor:
    rho = torch.zeros(n, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([rho], lr=1, max_iter=500, tolerance_grad=1e-13, tolerance_change=1e-15,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = fn(rho)
        loss.backward()
        return loss

    opt.step(closure)
    return rho.detach()


@pytest.mark.parametrize("beta", [0.1, 1.0, 5.0])
def test_paper_loss_pointwise_optimum_is_beta_times_winner_over_loser(beta):
    """E_{x~p^w} softplus(log β − Δ(x)) + E_{x~p^l} softplus(Δ(x) − log β) over a free log-ratio Δ per sequence is
    minimised at e^Δ = p^θ/p^ref = β p^w/p^l, not p^w/p^ref (MATH.md §5.3, oracle vi.f)."""
    _, _, _, pw, pl = _bradley_terry()
    inf = torch.full_like(pw, math.inf)

    def expected(rho):  # the winner term alone (Δ_l = −∞) and the loser term alone (Δ_w = +∞), exactly weighted
        return (pw * paper_preference_loss(rho, -inf, beta)).sum() + (pl * paper_preference_loss(inf, rho, beta)).sum()

    want = torch.log(beta * pw / pl)
    star = want.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(expected(star), star)
    assert grad.abs().max() < 1e-14  # stationary exactly at the stated optimum
    torch.testing.assert_close(_minimise(expected, pw.numel()), want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("beta", [0.2, 1.0, 3.0])
def test_dpo_loss_optimum_is_reference_tilted_by_reward(beta):
    """Pairs (x, y) ~ p ⊗ p with x preferred w.p. σ(R(x) − R(y)): E softplus(−β(Δ_w − Δ_l)) is minimised exactly at
    Δ = R/β + c, i.e. p^θ ∝ p^ref e^{R/β} — DPO's KL-regularised optimum (MATH.md §5.3's DPO-style option)."""
    p, R, win, _, _ = _bradley_terry(seed=3)
    pair = p[:, None] * p[None, :] * win  # P(winner = x, loser = y)

    def expected(rho):
        return (pair * dpo_preference_loss(rho[:, None], rho[None, :], beta)).sum()

    star = (R / beta + 0.7).requires_grad_(True)  # any shift c: the loss sees differences only
    (grad,) = torch.autograd.grad(expected(star), star)
    assert grad.abs().max() < 1e-14
    got = _minimise(expected, p.numel())
    torch.testing.assert_close(got - got.mean(), R / beta - (R / beta).mean(), atol=1e-5, rtol=0)


def test_paper_beta_is_a_margin_that_pushes_harder_as_it_grows():
    """At Δ_w = Δ_l = 0 (the student at its start, θ = ref) the paper loss's gradients are exactly −β/(1+β) for Δ_w
    and 1/(1+β) for Δ_l: a larger β pushes the winner up harder (MATH.md §5.3: β is a margin, not a temperature)."""
    for beta in (0.1, 1.0, 10.0):
        dw = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        dl = torch.zeros(1, dtype=torch.float64, requires_grad=True)
        gw, gl = torch.autograd.grad(paper_preference_loss(dw, dl, beta).sum(), (dw, dl))
        assert float(gw) == pytest.approx(-beta / (1 + beta), abs=1e-15)
        assert float(gl) == pytest.approx(1 / (1 + beta), abs=1e-15)


# --------------------------------------------------------------------------------------------------- Δ


class Table(torch.nn.Module):
    """A denoiser whose logits depend on (position, input token) through a table, plus optional poison."""

    def __init__(self, V: int, L: int, seed: int, scale: float = 1.0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.w = torch.nn.Parameter(scale * torch.randn(L, V + 1, V, generator=g, dtype=torch.float64))
        self.poison = None  # BoolTensor [B, L] → NaN logits there

    def forward(self, xt, t):
        out = self.w[torch.arange(xt.shape[1]), xt]
        if self.poison is not None:
            out = torch.where(self.poison[..., None], torch.full_like(out, math.nan), out)
        return out


def _pairs(B: int, L: int, V: int, P: int, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (2, B, L), generator=g)
    x[1, :, :P] = x[0, :, :P]  # one prompt per pair
    cond = torch.zeros(B, L, dtype=torch.bool)
    cond[:, :P] = True
    return Batch(x1=x[0], rejected=x[1], cond_mask=cond)


def test_sequence_log_ratio_sums_scored_positions_only_and_ignores_the_rest():
    """Δ = Σ_{i∈M} [log m^θ_i(x^i) − log m^ref_i(x^i)]: carry-over positions contribute 0 even when either model emits
    NaN there, and the gradient stays finite (MATH.md §5.3 step 2)."""
    V, L = 4, 5
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, L, V, generator=g, dtype=torch.float64, requires_grad=True)
    ref = torch.randn(3, L, V, generator=g, dtype=torch.float64)
    x1 = torch.randint(0, V, (3, L), generator=g)
    mask = torch.rand(3, L, generator=g) < 0.5
    want = torch.zeros(3, dtype=torch.float64)
    for b, i in itertools.product(range(3), range(L)):
        if mask[b, i]:
            want[b] += torch.log_softmax(logits[b, i], -1)[x1[b, i]] - torch.log_softmax(ref[b, i], -1)[x1[b, i]]
    poisoned = torch.where(mask[..., None], logits, torch.full_like(logits, math.nan))
    ref_poisoned = torch.where(mask[..., None], ref, torch.full_like(ref, math.inf))
    got = sequence_log_ratio(poisoned, ref_poisoned, x1, mask)
    torch.testing.assert_close(got, want.detach(), atol=1e-12, rtol=0)
    got.sum().backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[~mask] == 0).all()
    # The NaN as the model's own output (a leaf, not behind a torch.where that already stops its gradient).
    leaf = poisoned.detach().requires_grad_(True)
    sequence_log_ratio(leaf, ref_poisoned, x1, mask).sum().backward()
    assert torch.isfinite(leaf.grad).all() and (leaf.grad[~mask] == 0).all()


@pytest.mark.parametrize("source", sorted(PATHS))
@pytest.mark.parametrize("loss", ["paper", "dpo"])
def test_objective_is_the_stated_loss_of_delta_at_independent_xt_with_shared_t(source, loss):
    """Replaying the objective's random stream: t antithetic per (pair, repeat), shared by both sides; x_t^w then
    x_t^l drawn independently with the prompt pinned; Δ summed over the noised response positions by hand; the loss
    is the mean of softplus(log β − Δ_w) + softplus(Δ_l − log β) (paper) or softplus(−β_DPO (Δ_w − Δ_l)) (dpo)."""
    V, L, P, B, K = 4, 6, 2, 3, 2
    path = PATHS[source](V)
    model, ref = Table(V, L, 0), Table(V, L, 1)
    obj = PreferenceObjective(path, loss=loss, beta=0.5, beta_dpo=2.0, num_t=K, reference=ref)
    batch = _pairs(B, L, V, P)
    value, metrics = obj(model, batch, torch.Generator().manual_seed(7))

    g = torch.Generator().manual_seed(7)
    t = sample_times(B * K, generator=g).view(K, B).T.reshape(-1)  # draw k of pair b: time k·B + b (pair_times)
    w, l, cond = (x.repeat_interleave(K, 0) for x in (batch.x1, batch.rejected, batch.cond_mask))
    xt_w = torch.where(cond, w, path.draw_xt(w, t, g))
    xt_l = torch.where(cond, l, path.draw_xt(l, t, g))
    deltas = []
    for x, xt in ((w, xt_w), (l, xt_l)):
        lm, lr = torch.log_softmax(model(xt, t), -1), torch.log_softmax(ref(xt, t), -1)
        d = torch.zeros(B * K, dtype=torch.float64)
        for b, i in itertools.product(range(B * K), range(L)):
            if path.free(xt)[b, i] and not cond[b, i]:
                d[b] += lm[b, i, x[b, i]] - lr[b, i, x[b, i]]
        deltas.append(d)
    dw, dl = deltas
    if loss == "paper":
        want = (torch.nn.functional.softplus(math.log(0.5) - dw) + torch.nn.functional.softplus(dl - math.log(0.5)))
    else:
        want = torch.nn.functional.softplus(-2.0 * (dw - dl))
    torch.testing.assert_close(value, want.mean(), atol=1e-12, rtol=0)
    assert float(metrics["margin"]) == pytest.approx(float((dw - dl).detach().mean()), abs=1e-6)
    if source == "uniform":  # no carry-over: every response position is scored
        assert float(metrics["loss_positions"]) == pytest.approx((L - P) / L)


@pytest.mark.parametrize("source", sorted(PATHS))
def test_prompt_positions_never_change_and_never_enter_the_loss(source):
    """Over many draws x_t keeps every prompt token; NaN logits at prompt positions change neither the loss nor
    the (finite) gradient, for both sides of each pair."""
    V, L, P = 5, 6, 3
    path = PATHS[source](V)
    batch = _pairs(16, L, V, P, seed=2)
    obj = PreferenceObjective(path, num_t=4, beta=2.0)
    for s in range(20):
        t = sample_times(16, generator=torch.Generator().manual_seed(s))
        xw, xl = obj.noised_pair(batch, t, torch.Generator().manual_seed(s))
        assert torch.equal(xw[:, :P], batch.x1[:, :P]) and torch.equal(xl[:, :P], batch.rejected[:, :P])
    model, ref = Table(V, L, 3), Table(V, L, 4)
    obj.reference = ref
    clean, _ = obj(model, batch, torch.Generator().manual_seed(5))
    (g_clean,) = torch.autograd.grad(clean, model.w)
    model.poison = ref.poison = batch.cond_mask.repeat_interleave(4, 0).repeat(2, 1)
    poisoned, _ = obj(model, batch, torch.Generator().manual_seed(5))
    (g_poisoned,) = torch.autograd.grad(poisoned, model.w)
    assert torch.equal(clean, poisoned) and torch.equal(g_clean, g_poisoned) and torch.isfinite(g_clean).all()


def test_shared_noise_couples_the_two_masks():
    """noise="shared": x_t^w and x_t^l come from the same draws (same masked positions), each still ~ p_{t|1}."""
    path = MaskedPath(6)
    batch = _pairs(256, 8, 6, 0, seed=4)
    t = torch.full((256,), 0.3)
    shared = PreferenceObjective(path, noise="shared")
    xw, xl = shared.noised_pair(batch, t, torch.Generator().manual_seed(0))
    assert torch.equal(xw == path.mask_id, xl == path.mask_id)
    assert abs(float((xw == path.mask_id).float().mean()) - 0.7) < 0.03
    xw, xl = PreferenceObjective(path).noised_pair(batch, t, torch.Generator().manual_seed(0))
    assert not torch.equal(xw == path.mask_id, xl == path.mask_id)


def test_reference_stays_frozen_and_gets_no_gradient():
    V, L = 4, 5
    path = MaskedPath(V)
    model, ref = Table(V, L, 0), Table(V, L, 1)
    before = ref.w.detach().clone()
    obj = PreferenceObjective(path, reference=ref, num_t=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    for s in range(3):
        loss, _ = obj(model, _pairs(4, L, V, 1, seed=s), torch.Generator().manual_seed(s))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert ref.w.grad is None and torch.equal(ref.w, before)
    assert not torch.equal(model.w, Table(V, L, 0).w)


def test_objective_rejects_unpaired_batches_and_bad_settings():
    path = MaskedPath(4)
    with pytest.raises(ValueError, match="pairs"):
        PreferenceObjective(path, reference=Table(4, 3, 0))(Table(4, 3, 1), torch.zeros(2, 3, dtype=torch.long))
    for kwargs in ({"loss": "ipo"}, {"beta": 0.0}, {"beta_dpo": -1.0}, {"num_t": 0}, {"noise": "same"}):
        with pytest.raises(ValueError):
            PreferenceObjective(path, **kwargs)


# --------------------------------------------------------------------------------------------------- evaluate


def test_evaluate_is_zero_at_the_reference_and_sees_a_model_that_prefers_the_chosen():
    """θ = ref: margin, KL and accuracy 0 exactly. A student that adds +1 to each chosen token's logit at every
    position has a positive implicit reward margin, accuracy above 1/2 and a positive KL; the report has the
    trainer's bound keys (masked: the chosen responses' conditional bound)."""
    V, L, P = 4, 6, 2
    path = MaskedPath(V)
    ref = Table(V, L, 1)
    batch = _pairs(64, L, V, P, seed=6)
    obj = PreferenceObjective(path, reference=ref, eval_num_t=4)
    same = obj.evaluate(ref, batch, batch_size=16, generator=torch.Generator().manual_seed(0))
    assert same["reward_margin"] == 0 and same["kl_ref"] == 0 and same["pref_accuracy"] == 0
    assert same["pref_loss"] == pytest.approx(2 * math.log(2))

    class Prefers(torch.nn.Module):
        """ref + 1 on each pair's chosen token, on both sides (evaluate stacks [x_t^w; x_t^l] per chunk of 64)."""

        def forward(self, xt, t):
            return ref(xt, t) + torch.nn.functional.one_hot(batch.x1, V).double().repeat(2, 1, 1)

    student = Prefers()
    got = obj.evaluate(student, batch, batch_size=64, generator=torch.Generator().manual_seed(0))
    assert got["reward_margin"] > 0 and got["pref_accuracy"] > 0.5 and got["kl_ref"] > 0
    assert {"bpc", "bpc_stderr", "perplexity", "bound", "num_sequences"} <= set(got)
    assert got["num_pairs"] == 64 and "chosen | prompt" in got["bound"]


def test_evaluate_kl_is_student_to_reference_summed_over_scored_positions():
    """kl_ref = E Σ_{i scored} KL(m^θ_i ‖ m^ref_i) (MATH.md §5.3 evaluation). On the uniform source every response
    position is scored at every t, so for models that ignore x_t and t it is exactly Σ_{i ≥ P} KL, in that direction
    (KL(ref ‖ θ) differs: the two tables are far from symmetric)."""
    V, L, P = 4, 5, 2
    g = torch.Generator().manual_seed(3)
    student_tab, ref_tab = 2.0 * torch.randn(L, V, generator=g, dtype=torch.float64), torch.zeros(L, V)
    ref_tab[:, 0] = 3.0

    class Const(torch.nn.Module):
        def __init__(self, tab):
            super().__init__()
            self.tab = tab

        def forward(self, xt, t):
            return self.tab.expand(xt.shape[0], L, V)

    obj = PreferenceObjective(UniformPath(V), reference=Const(ref_tab.double()), eval_num_t=2)
    got = obj.evaluate(Const(student_tab), _pairs(8, L, V, P, seed=1), batch_size=8)
    lp, lr = torch.log_softmax(student_tab, -1), torch.log_softmax(ref_tab.double(), -1)
    want = (lp.exp() * (lp - lr)).sum(-1)[P:].sum()
    backward = (lr.exp() * (lr - lp)).sum(-1)[P:].sum()
    assert got["kl_ref"] == pytest.approx(float(want), rel=1e-9) and abs(float(want - backward)) > 0.5


# --------------------------------------------------------------------------------------------------- data


def _write(path: Path, records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8")
    return path


CHARS = {"kind": "synthetic", "vocab_size": 4, "seq_len": 8, "num_train": 16, "num_valid": 4, "num_test": 4}


def test_pairs_records_are_counted_and_the_usable_ones_tokenised(tmp_path):
    f = _write(tmp_path / "p.jsonl", [
        {"prompt": "ab", "chosen": "cd", "rejected": "dc"},
        {"prompt": "", "chosen": "abcdabcd", "rejected": "dcbadcba"},
        {"prompt": "a", "chosen": "b"},  # missing field
        {"prompt": "a", "chosen": "  ", "rejected": "b"},  # empty text
        {"prompt": "a", "chosen": "bc", "rejected": "bc"},  # identical
        {"prompt": "a", "chosen": "bz", "rejected": "bc"},  # outside the 4-symbol vocabulary
        "{not json",
        "[1, 2]",
    ])
    data = build_data({"kind": "pairs", "path": str(f), "tokenizer": CHARS, "pad": "a", "valid_frac": 0.0})
    assert data.meta["bad_records"] == {
        "missing field": 1, "empty text": 1, "identical chosen and rejected": 1, "unreadable JSON": 1,
        "not a JSON object": 1, "text outside the tokenizer's vocabulary": 1,
    }
    assert "skipped" in data.summary() and len(data.train) == 2
    rows = {data.decode(c): (data.decode(r), m.tolist()) for c, r, m in
            zip(data.train.chosen, data.train.rejected, data.train.prompt_mask)}
    assert rows["abcdaaaa"] == ("abdcaaaa", [True, True] + [False] * 6)  # padded with "a" after the response
    assert rows["abcdabcd"] == ("dcbadcba", [False] * 8)
    batch = data.get_batch("train", torch.tensor([0, 1]))
    assert batch.paired and batch.cond_mask.dtype == torch.bool and batch.x1.dtype == torch.long


def test_too_long_pairs_are_refused_unless_truncated(tmp_path):
    f = _write(tmp_path / "p.jsonl", [
        {"prompt": "abc", "chosen": "dddddd", "rejected": "cc"},
        {"prompt": "abcdabcd", "chosen": "a", "rejected": "b"},
        {"prompt": "abcdab", "chosen": "cdaa", "rejected": "cdab"},
        {"prompt": "a", "chosen": "bb", "rejected": "cc"},
    ])
    cfg = {"kind": "pairs", "path": str(f), "tokenizer": CHARS, "pad": "a", "valid_frac": 0.0}
    with pytest.raises(DataError, match=r"3 pair\(s\) .* do not fit the model's 8 tokens \(first: line 1, 9 tokens"):
        build_data(cfg)
    data = build_data({**cfg, "truncate": True})
    assert data.meta["truncated"] == 2 and len(data.train) == 2
    assert data.meta["bad_records"] == {"prompt leaves no room for a response": 1, "identical after truncation": 1}
    assert "2 truncated to fit" in data.summary()


def test_unusable_files_and_settings_are_one_line_errors(tmp_path):
    bad = _write(tmp_path / "bad.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "b"}, {"chosen": "a"}])
    cfg = {"kind": "pairs", "path": str(bad), "tokenizer": CHARS, "pad": "a"}
    with pytest.raises(DataError) as err:
        build_data(cfg)
    assert "no usable preference pair" in str(err.value) and "1 missing field" in str(err.value)
    assert "\n" not in str(err.value)
    good = _write(tmp_path / "good.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "c"}])
    with pytest.raises(DataError, match="no end-of-text token"):
        build_data({**cfg, "path": str(good), "pad": None, "valid_frac": 0.0})
    with pytest.raises(DataError, match="exactly one token"):
        build_data({**cfg, "path": str(good), "pad": "ab"})
    with pytest.raises(DataError, match="needs `tokenizer`"):
        build_data({"kind": "pairs", "path": str(good)})
    with pytest.raises(DataError, match="not found"):
        build_data({**cfg, "path": str(tmp_path / "missing.jsonl")})
    renamed = _write(tmp_path / "named.jsonl", [{"question": "a", "good": "b", "bad": "c"}])
    data = build_data({**cfg, "path": str(renamed), "prompt_field": "question", "chosen_field": "good",
                       "rejected_field": "bad", "valid_frac": 0.0})
    assert len(data.train) == 1


def test_stored_token_ids_are_used_only_with_the_same_tokenizer(tmp_path):
    """Records of `tcsm pairs` carry the sampled ids and the tokenizer's signature: with that tokenizer the ids are
    used as they are (here they deliberately disagree with the texts), with another one the texts are tokenized."""
    from tcsm.data.pairs import tokenizer_signature

    signature = tokenizer_signature(build_data(CHARS))
    ids = {"prompt_ids": [1], "chosen_ids": [2, 2, 2, 2, 2, 2, 2], "rejected_ids": [3, 3, 3, 3, 3, 3, 3]}
    f = _write(tmp_path / "p.jsonl", [
        {"prompt": "a", "chosen": "bb", "rejected": "cc", "tokenizer": signature, **ids},
        {"prompt": "a", "chosen": "dd", "rejected": "cc", "tokenizer": "another/V=4", **ids},
    ])
    data = build_data({"kind": "pairs", "path": str(f), "tokenizer": CHARS, "pad": "a", "valid_frac": 0.0})
    got = sorted(data.decode(r) for r in data.train.chosen)
    assert got == ["addaaaaa", "bccccccc"]  # stored ids "b"+"c"*7; text "a"+"dd" padded with "a"
    assert data.meta["stored_token_ids"] == 1 and "1 with their stored token ids" in data.summary()


@pytest.mark.skipif(not (GPT2_BPE / "encoder.json").is_file(), reason="needs ../shared/data/gpt2_bpe")
def test_gpt2_pairs_pad_with_end_of_text_and_split_deterministically(tmp_path):
    pytest.importorskip("tokenizers")
    corpus = tmp_path / "c.txt"
    corpus.write_text("Once upon a time there was a cat. " * 40, encoding="utf-8")
    tok = {"kind": "bpe", "path": str(corpus), "tokenizer": "gpt2", "bpe_dir": str(GPT2_BPE), "seq_len": 12}
    records = [{"prompt": "Once upon a time", "chosen": f" a happy cat number {i}", "rejected": f" a sad dog {i}"}
               for i in range(20)]
    f = _write(tmp_path / "p.jsonl", records)
    cfg = {"kind": "pairs", "path": str(f), "tokenizer": tok, "valid_frac": 0.25}
    data, again = build_data(cfg), build_data(cfg)
    assert (len(data.train), len(data.valid)) == (15, 5) and torch.equal(data.valid.chosen, again.valid.chosen)
    row = data.train.chosen[0].long()
    P = int(data.train.prompt_mask[0].sum())
    assert data.decode(row[:P]) == "Once upon a time" and P == 4
    assert row[-1] == 50256 and data.decode(row).startswith("Once upon a time a happy cat number")


def test_each_pair_gets_its_own_spread_of_times():
    """num_t = K draws per pair: with antithetic times a pair's K times lie exactly 1/K apart (mod 1) — not inside
    a window of width 1/B, which repeating each pair before drawing one antithetic batch gave — the K·B times of
    a call form one even grid of step 1/(KB), and K = 1 is MDLM's antithetic batch unchanged."""
    from tcsm.paths.timesteps import sample_times
    from tcsm.posttrain.preference.objective import pair_times

    B, K = 5, 3
    t = pair_times(B, K, generator=torch.Generator().manual_seed(3), dtype=torch.float64).view(B, K)
    for row in t:
        gaps = torch.diff(torch.sort(row).values)
        assert torch.allclose(torch.cat([gaps, (1 + row.min() - row.max()).view(1)]), torch.full((K,), 1 / K, dtype=row.dtype))
    grid = torch.sort(t.flatten()).values
    assert torch.allclose(torch.diff(grid), torch.full((B * K - 1,), 1 / (B * K), dtype=grid.dtype))
    one = pair_times(B, 1, generator=torch.Generator().manual_seed(3))
    assert torch.equal(one, sample_times(B, generator=torch.Generator().manual_seed(3)))
    iid = pair_times(B, K, antithetic=False, generator=torch.Generator().manual_seed(3)).view(B, K)
    assert iid.shape == (B, K) and (iid > 0).all() and (iid < 1).all()


def test_the_objective_draws_a_pairs_times_with_pair_times():
    """The call repeats each pair K times (rows b·K + k) and gives draw k of pair b the time pair_times gives it:
    the objective's mean t equals the mean of those times."""
    from tcsm.posttrain.preference.objective import pair_times

    path = MaskedPath(vocab_size=4, schedule=LinearSchedule())
    batch = Batch(torch.zeros(6, 3, dtype=torch.long), rejected=torch.ones(6, 3, dtype=torch.long))
    obj = PreferenceObjective(path, num_t=4, reference=Table(4, 3, 0))
    _, metrics = obj(Table(4, 3, 1), batch, torch.Generator().manual_seed(11))
    t = pair_times(6, 4, generator=torch.Generator().manual_seed(11))
    assert torch.allclose(metrics["t_mean"], t.mean())
