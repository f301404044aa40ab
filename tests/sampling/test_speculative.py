"""Speculative decoding (tcsm.sampling.speculative, MATH.md §6.4) against exact enumeration.

Targets whose conditionals are not those of one joint (random tables over the revealed tokens), so the reveal order
matters and the law kept is the one-position-per-step sampler's, enumerated over every order: a full-sequence masked
model, a block model with a prefix cache, and an autoregressive LM, each with a good and a deliberately bad drafter.
The sampling floor is measured, not assumed: the mean TV of 20,000 draws from the exact law itself.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from tcsm.core.errors import ConfigError
from tcsm.core.protocols import Samples
from tcsm.evaluation.exact import PrefixCache
from tcsm.models.kinds import CAUSAL, ModelKind
from tcsm.paths import MaskedPath
from tcsm.sampling.settings import draw, make_sampler, sample_settings
from tcsm.sampling.speculative import Speculative, speculative_decode

pytestmark = pytest.mark.usefixtures("one_thread")

N = 20000
V = 3


def _table(seed, *shape, scale=1.5):
    return scale * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


class ToyMasked:
    """logits[i, v] = W[i, v] + Σ_j C[i, j, x_j, v] over the input symbols (the mask included): a masked model whose
    conditionals need not come from one joint."""

    time_independent = True

    def __init__(self, L, seed, scale=1.5):
        self.W, self.C = _table(seed, L, V, scale=scale), _table(seed + 1, L, L, V + 1, V, scale=scale)

    def __call__(self, xt, t=None):
        L = xt.shape[1]
        onehot = torch.nn.functional.one_hot(xt, V + 1).double()  # [B, L, V+1]
        return self.W + torch.einsum("bjs,ijsv->biv", onehot, self.C[:, :L])


class ToyCausal:
    """An AR LM: logits[:, j] = W[j] + Σ_{i<j} C[j, i, x_i] (BOS-free, position 0 from W alone)."""

    model_kind = CAUSAL

    def __init__(self, L, seed, scale=1.5, base=None, noise=0.0):
        if base is None:
            self.W, self.C = _table(seed, L, V, scale=scale), _table(seed + 1, L, L, V, V, scale=scale)
        else:  # a perturbed copy of `base`: a good drafter
            self.W = base.W + _table(seed, L, V, scale=noise)
            self.C = base.C + _table(seed + 1, L, L, V, V, scale=noise)
        L = self.W.shape[0]
        self.causal = torch.ones(L, L, dtype=torch.bool).tril(-1).double()  # i < j

    def __call__(self, x):
        onehot = torch.nn.functional.one_hot(x.clamp_max(V - 1), V).double()
        return self.W + torch.einsum("bis,jisv,ji->bjv", onehot, self.C, self.causal)


class ToyBlock:
    """A block model: the logits of block b read its noisy block and the clean prefix (kept in a `PrefixCache`)."""

    model_kind = ModelKind("denoiser", "blocks", None, "a toy block model", blocks=True)
    time_independent = True

    def __init__(self, L, block_length, seed):
        self.block_length, self.L = block_length, L
        self.W, self.C = _table(seed, L, V), _table(seed + 1, L, L, V + 1, V)

    def new_cache(self, batch_size):
        return PrefixCache(torch.zeros(batch_size, 0, dtype=torch.long))

    def extend_cache(self, cache, x_clean):
        cache.tokens = torch.cat([cache.tokens, x_clean], 1)

    def denoise(self, xt_block, t, cache):
        lo, n = cache.length, xt_block.shape[1]
        seq = torch.cat([cache.tokens, xt_block], 1)
        onehot = torch.nn.functional.one_hot(seq, V + 1).double()
        return self.W[lo : lo + n] + torch.einsum("bjs,ijsv->biv", onehot, self.C[lo : lo + n, : lo + n])


def states(L):
    return torch.tensor(list(itertools.product(range(V), repeat=L)), dtype=torch.long)


def order_law(cond, S, positions, orders, start):
    """Σ_σ P(σ) Π_i p(x^{σ_i} | x^{σ<i}) over `orders` (uniform) of `positions`, from the states `start` [N, L]
    (masks at the positions), with cond(x) → log-probs [N, L, V]: the law [N] of S at those positions."""
    total = torch.zeros(S.shape[0], dtype=torch.float64)
    for sigma in orders:
        cur, lp = start.clone(), torch.zeros(S.shape[0], dtype=torch.float64)
        for i in sigma:
            lp += torch.log_softmax(cond(cur)[:, i], -1).gather(-1, S[:, i : i + 1]).squeeze(-1)
            cur[:, i] = S[:, i]
        total += lp.exp()
    return total / len(orders)


def masked_law(model, L, order="random"):
    S = states(L)
    orders = list(itertools.permutations(range(L))) if order == "random" else [tuple(range(L))]
    return order_law(lambda x: model(x).double(), S, range(L), orders, torch.full_like(S, V))


def block_law(model, L, k):
    S = states(L)
    law = torch.ones(S.shape[0], dtype=torch.float64)
    for lo in range(0, L, k):
        cache = PrefixCache(S[:, :lo])
        start = S.clone()
        start[:, lo:] = V

        def cond(x, lo=lo, cache=cache):
            out = torch.zeros(x.shape[0], L, V, dtype=torch.float64)
            out[:, lo : lo + k] = model.denoise(x[:, lo : lo + k], None, cache)
            return out

        law *= order_law(cond, S, range(lo, lo + k), list(itertools.permutations(range(lo, lo + k))), start)
    return law


def causal_law(model, L):
    S = states(L)
    return torch.log_softmax(model(S), -1).gather(-1, S.unsqueeze(-1)).squeeze(-1).sum(-1).exp()


def index(x):
    L = x.shape[1]
    return (x * V ** torch.arange(L - 1, -1, -1)).sum(-1)


def tv_of(x, law):
    emp = torch.bincount(index(x), minlength=law.numel()).double() / x.shape[0]
    return 0.5 * float((emp - law).abs().sum())


def floor(law, reps=30):
    """The sampling floor: the mean and standard deviation of the TV of N draws from `law` itself."""
    g = torch.Generator().manual_seed(123)
    tvs = []
    for _ in range(reps):
        emp = torch.bincount(torch.multinomial(law, N, replacement=True, generator=g), minlength=law.numel())
        tvs.append(0.5 * float((emp.double() / N - law).abs().sum()))
    t = torch.tensor(tvs)
    return float(t.mean()), float(t.std())


def check_law(x, law):
    """TV within five standard deviations of the floor's mean (at 27 states and N = 20,000: 0.0086 ± 0.0023, the
    largest of 200 exact draws 0.0169)."""
    mean, sd = floor(law)
    got = tv_of(x, law)
    assert got < mean + 5 * sd, f"TV {got:.4f} to the exact law, sampling floor {mean:.4f} ± {sd:.4f}"


def run(target, L, drafter=None, seed=0, **kw):
    return speculative_decode(target, MaskedPath(V), N, L, drafter=drafter, generator=torch.Generator().manual_seed(seed),
                              **kw)  # fmt: skip


@pytest.mark.parametrize("drafter", ["self", "bad"])
@pytest.mark.parametrize("order", ["random", "left_to_right"])
def test_masked_target_keeps_the_one_position_law(drafter, order):
    L = 3
    target = ToyMasked(L, 0)
    bad = ToyMasked(L, 50, scale=4.0) if drafter == "bad" else None
    x, st = run(target, L, bad, draft_length=2, order=order)
    check_law(x, masked_law(target, L, order))
    assert st.counts["drafted"] > 0 and 0 < st.counts["accepted"] < st.counts["drafted"]


def test_the_check_sees_the_order():
    """The reveal order changes this target's law by far more than the floor: the checks above can fail."""
    target = ToyMasked(3, 0)
    a, b = masked_law(target, 3, "random"), masked_law(target, 3, "left_to_right")
    mean, sd = floor(a)
    assert 0.5 * float((a - b).abs().sum()) > mean + 20 * sd


@pytest.mark.parametrize("drafter", ["self", "bad"])
def test_block_target_keeps_the_law_block_by_block(drafter):
    L, k = 4, 2
    target = ToyBlock(L, k, 0)
    bad = ToyMasked(L, 70, scale=4.0) if drafter == "bad" else None
    x, st = run(target, L, bad, draft_length=2)
    check_law(x, block_law(target, L, k))
    assert st.counts["cache_calls"] == 1  # the second block's prefix, once, for every row of the repeated cache


@pytest.mark.parametrize("drafter", ["good", "bad", "masked"])
def test_causal_target_keeps_the_ar_law(drafter):
    L = 4
    target = ToyCausal(L, 0)
    d = {"good": ToyCausal(L, 9, base=target, noise=0.3), "bad": ToyCausal(L, 30, scale=4.0),
         "masked": ToyMasked(L, 40)}[drafter]  # fmt: skip
    x, st = run(target, L, d, draft_length=3)
    check_law(x, causal_law(target, L))
    assert st.num_rows == st.counts["sequence_passes"]  # one causal row per sequence and pass
    if drafter == "good":
        assert st.counts["sequence_passes"] / N < 0.6 * L  # most drafts accepted: far fewer passes than positions


def test_acceptance_rate_has_its_closed_form():
    """L = 2, one draft per round, left to right, a masked drafter: E[accepted] = A_0 + (1 − A_0) Σ_z r_0(z) A_1(z),
    E[drafted] = 2 − A_0, with A = Σ_y min(p, q) and r_0 = norm(max(0, p_0 − q_0))."""
    L = 2
    target, drafter = ToyMasked(L, 3), ToyMasked(L, 80, scale=2.0)
    _x, st = run(target, L, drafter, draft_length=1, order="left_to_right")
    empty = torch.full((1, L), V)
    p0, q0 = (torch.softmax(m(empty)[0, 0], -1) for m in (target, drafter))
    a0 = float(torch.minimum(p0, q0).sum())
    r0 = (p0 - q0).clamp_min(0) / (p0 - q0).clamp_min(0).sum()
    after = torch.stack([torch.tensor([z, V]) for z in range(V)])
    p1, q1 = (torch.softmax(m(after)[:, 1], -1) for m in (target, drafter))
    a1 = torch.minimum(p1, q1).sum(-1)
    accepted = a0 + (1 - a0) * float((r0 * a1).sum())
    tol = 5 / math.sqrt(N)
    assert abs(st.counts["accepted"] / N - accepted) < tol
    assert abs(st.counts["drafted"] / N - (2 - a0)) < tol
    # one position, one draft: the rate is Σ min(p, q) itself
    _, one = run(ToyMasked(1, 3), 1, ToyMasked(1, 80, scale=2.0), draft_length=1)
    p, q = (torch.softmax(m(torch.full((1, 1), V))[0, 0], -1) for m in (ToyMasked(1, 3), ToyMasked(1, 80, scale=2.0)))
    rate = float(torch.minimum(p, q).sum())
    assert one.counts["drafted"] == N
    assert abs(one.counts["accepted"] / N - rate) < 5 * math.sqrt(rate * (1 - rate) / N)


def test_passes_and_rows_are_counted_apart():
    """Self-drafting a near-factorised target: fewer sequential passes than positions, k+1 rows per pass at most."""
    L, k = 6, 3
    target = ToyMasked(L, 5, scale=0.2)
    _x, st = speculative_decode(target, MaskedPath(V), 200, L, draft_length=k, generator=torch.Generator().manual_seed(1))
    passes = st.counts["sequence_passes"] / 200
    assert passes < 0.6 * L
    assert st.num_rows <= (k + 1) * st.counts["sequence_passes"]
    assert st.num_rows > st.counts["sequence_passes"]
    assert int(st.row_calls.sum()) == st.num_rows
    assert st.counts["draft_calls"] == 0  # the self-drafter costs no pass


def test_pinned_positions_are_kept():
    L = 4
    fixed = torch.tensor([[True, False, True, False]])
    values = torch.tensor([[2, 0, 1, 0]])
    x, _ = speculative_decode(ToyMasked(L, 0), MaskedPath(V), 50, L, fixed=fixed, values=values,
                              generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert (x[:, 0] == 2).all() and (x[:, 2] == 1).all()


class _OwnObjective:
    def sample(self, model, num, length, generator=None, device=None, *, settings=None, fixed=None, values=None):
        raise AssertionError("the objective's own sampler must not run")


def test_the_registry_and_draw_route_it():
    assert isinstance(_OwnObjective(), Samples)
    settings = sample_settings({"method": "speculative", "draft_length": 2})
    target, d = ToyCausal(3, 0), ToyCausal(3, 9)
    sampler = make_sampler(settings, _OwnObjective(), drafter_model=d)
    assert isinstance(sampler, Speculative) and sampler.drafter_model is d  # replaces an AR run's own sampler
    x, st = draw(target, MaskedPath(V), 8, 3, settings, objective=_OwnObjective(), drafter_model=d,
                 generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert x.shape == (8, 3) and st.method == "speculative"
    with pytest.raises(ConfigError, match="drafter"):
        make_sampler(sample_settings({"method": "ancestral"}), drafter_model=d)
    with pytest.raises(ConfigError, match="passed no drafter"):
        draw(ToyMasked(3, 0), MaskedPath(V), 2, 3, sample_settings({"method": "speculative", "drafter": "runs/x"}))
    with pytest.raises(ConfigError, match="AR"):
        draw(target, MaskedPath(V), 2, 3, settings, objective=_OwnObjective())
    with pytest.raises(ConfigError, match="draft_length"):
        sample_settings({"method": "speculative", "draft_length": 0})
    with pytest.raises(ConfigError, match="reveal_order"):
        sample_settings({"method": "speculative", "reveal_order": "confidence"})


def test_block_model_with_eos_is_cut_like_block_decoding():
    L, k = 4, 2
    settings = sample_settings({"method": "speculative", "eos_id": 0})
    x, _ = draw(ToyBlock(L, k, 0), MaskedPath(V), 300, L, settings, generator=torch.Generator().manual_seed(0))
    first = torch.where(x == 0, torch.arange(L), torch.full_like(x, L)).min(-1).values
    after = torch.arange(L) > first.unsqueeze(1)
    assert (x[after] == 0).all() and after.any()


def tiny_lm(seed, L, scale=4.0, vocab=V, base=None, noise=0.0):
    """A CausalLM with a static cache, its weights random (its initialisation zeroes the head) and `scale` sharp, so
    that drafts get rejected; with `base`, a perturbed copy of it (a good drafter)."""
    from tcsm.models.causal import CausalLM
    from tcsm.models.lm import LMConfig

    torch.manual_seed(seed)
    model = CausalLM(LMConfig(vocab_size=vocab, max_len=L, d_model=16, n_layers=2, n_heads=2)).eval()
    with torch.no_grad():
        if base is not None:
            for p, q in zip(model.parameters(), base.parameters()):
                p.copy_(q + noise * torch.randn_like(q))
        else:
            for p in model.parameters():
                p.copy_(0.5 * torch.randn_like(p))
            model.head.weight.mul_(scale)
    return model


def _no_full_pass(model):
    def refuse(*a, **k):
        raise AssertionError("the cached verifier recomputed the whole prefix")

    model.forward = refuse
    return model


@pytest.mark.parametrize("drafter", ["good", "bad"])
def test_cached_causal_verifier_keeps_the_ar_law(drafter):
    L = 4
    target = tiny_lm(0, L)
    law = causal_law(target, L)
    d = tiny_lm(1, L, base=target, noise=0.05) if drafter == "good" else tiny_lm(2, L, scale=12.0)
    x, st = run(_no_full_pass(target), L, _no_full_pass(d), draft_length=3)
    check_law(x, law)
    assert 0 < st.counts["accepted"] < st.counts["drafted"]
    if drafter == "good":
        assert st.counts["sequence_passes"] / N < 0.6 * L


@pytest.mark.parametrize("batch", [1, 7])
def test_cached_verifier_draws_the_uncached_tokens(batch):
    """fp32 on the CPU, the same generator: the KV-cached verifier and drafter (rolled back after each rejection)
    give the tokens and counts of recomputing the prefix on every pass, also with pinned positions in the middle;
    at batch 1 the host-side round (`host_loop`) gives those of the tensor loop."""
    L, vocab = 12, 6
    target = tiny_lm(3, L, scale=3.0, vocab=vocab)
    d = tiny_lm(4, L, vocab=vocab, base=target, noise=0.1)
    fixed = torch.zeros(batch, L, dtype=torch.bool)
    fixed[:, 5] = True
    values = torch.full((batch, L), 2)
    for seed in range(6):
        outs = []
        for cached, host_loop in ((False, False), (True, False), (True, True)):  # batch 1: host bookkeeping too
            outs.append(speculative_decode(target, MaskedPath(vocab), batch, L, drafter=d, draft_length=3,
                                           generator=torch.Generator().manual_seed(seed), cached=cached,
                                           host_loop=host_loop, fixed=fixed if seed % 2 else None,
                                           values=values if seed % 2 else None))  # fmt: skip
        sa = _same_draws(outs)
        assert 0 < sa.counts["accepted"] < sa.counts["drafted"]


def _same_draws(outs):
    """Asserts that every (tokens, stats) of `outs` equals the first, tokens and counts; the first's stats."""
    (a, sa), *rest = outs
    for b, sb in rest:
        assert torch.equal(a, b)
        assert sa.counts == sb.counts and sa.num_calls == sb.num_calls and sa.num_rows == sb.num_rows
    return sa


def test_ngram_drafter_keeps_the_ar_law_and_learns_its_data():
    """An n-gram table counted on the target's own draws drafts well (most drafts accepted) and the law stays the
    target's; its q is the back-off of the counts (checked against a direct count at one context)."""
    from tcsm.sampling.ngram import NGramDraft

    L = 4
    target = tiny_lm(5, L)
    data, _ = run(target, L, tiny_lm(6, L, base=target, noise=0.1), draft_length=2, seed=1)
    table = NGramDraft(data, V, order=3)
    law = causal_law(target, L)
    x, st = run(_no_full_pass(target), L, table, draft_length=3)
    check_law(x, law)
    assert st.counts["accepted"] > 0.8 * st.counts["drafted"]
    # q(· | x^0 = 1, x^1 = 2) at p = 2 from the trigram counts with β = 1 back-off to the bigram's
    ctx = torch.tensor([[1, 2, 0, 0]])
    at2 = data[:, 2:][(data[:, :-2] == 1) & (data[:, 1:-1] == 2)]
    after2 = data[:, 1:][data[:, :-1] == 2]
    uni = (torch.bincount(data.flatten(), minlength=V).double() + 1) / (data.numel() + V)
    big = (torch.bincount(after2, minlength=V).double() + uni) / (after2.numel() + 1)
    tri = (torch.bincount(at2, minlength=V).double() + big) / (at2.numel() + 1)
    torch.testing.assert_close(table.log_q(ctx, torch.tensor([2])).exp()[0], tri)


def test_ngram_drafter_draws_one_row_from_its_q():
    """Batch 1 drafts on the host (memoised q, inverse CDF): each draft's frequency is its q, and q is the batched
    table's at the context with the earlier draft filled in."""
    from tcsm.sampling.ngram import NGramDraft
    from tcsm.sampling.samplers import SamplingStats
    from tcsm.sampling.speculative import _Shape

    data = torch.randint(0, V, (200, 4), generator=torch.Generator().manual_seed(0))
    table = NGramDraft(data, V, order=2)
    shape, g = _Shape(V, V, 1.0, 1.0), torch.Generator().manual_seed(1)
    x, pos, valid = torch.tensor([[1, V, V]]), torch.tensor([[1, 2]]), torch.ones(1, 2, dtype=torch.bool)
    stats = SamplingStats(method="speculative", num_steps=2, cached=False, times=torch.empty(0))
    stats.counts.update(draft_calls=0, draft_rows=0)
    first, second, n = torch.zeros(V), {}, 4000
    for _ in range(n):
        y, lq, _ = table.propose(x, pos, valid, 0, shape, g, stats)
        first[y[0, 0]] += 1
        second[int(y[0, 0])] = lq[0, 1]
    for y0, lq1 in second.items():
        torch.testing.assert_close(lq1, table.log_q(torch.tensor([[1, y0, 0]]), torch.tensor([2]))[0])
    q = table.log_q(torch.tensor([[1, 0, 0]]), torch.tensor([1]))[0].exp()
    torch.testing.assert_close(lq[0, 0].exp(), q)
    assert (first / n - q).abs().max() < 5 * math.sqrt(0.25 / n)
    assert stats.counts["draft_calls"] == 2 * n
    # the memo filled in one batched lookup holds what the lookups one by one found
    lazy = dict(table._memo)
    filled = NGramDraft(data, V, order=2)
    assert filled.precompute() == V + 1  # every token and the sequence start as contexts
    for key, (lp, _cum) in lazy.items():
        torch.testing.assert_close(filled._memo[key][0], lp)


def test_ngram_drafter_host_round_draws_the_tensor_loops_tokens():
    """Batch 1 with an n-gram drafter: the host round (`draft_one`, the sequence as a host list, cached and
    uncached verifier) gives the tokens and counts of the tensor loop, also with a pinned position in between."""
    from tcsm.sampling.ngram import NGramDraft

    L, vocab = 12, 6
    target = tiny_lm(3, L, scale=3.0, vocab=vocab)
    data = torch.randint(0, vocab, (300, L), generator=torch.Generator().manual_seed(0))
    fixed = torch.zeros(1, L, dtype=torch.bool)
    fixed[:, 5] = True
    values = torch.full((1, L), 2)
    for seed in range(6):
        outs = []
        for cached, host_loop in ((True, False), (True, True), (False, True)):
            table = NGramDraft(data, vocab, order=3)
            outs.append(speculative_decode(target, MaskedPath(vocab), 1, L, drafter=table, draft_length=4,
                                           generator=torch.Generator().manual_seed(seed), cached=cached,
                                           host_loop=host_loop, fixed=fixed if seed % 2 else None,
                                           values=values if seed % 2 else None))  # fmt: skip
        sa = _same_draws(outs)
        assert 0 < sa.counts["accepted"] < sa.counts["drafted"]
