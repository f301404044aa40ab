"""Block-by-block decoding with a KV cache (tcsm.sampling.blocks) against exact enumeration.

With the exact block denoiser (tcsm.evaluation.exact.ExactBlockDenoiser, whose cache is the clean prefix) and an
in-block sampler that is exact on one block, the draws follow p_1 (chi-square): revealed-only orders with one position
per step on the masked path, the analytic bridge with one position per block on the uniform path. Prompts of
different lengths in one batch give each row its own conditional; EOS stops rows exactly (the law of p_1 cut at its
first EOS); the network calls are blocks x steps, the prompt prefilled in one cache call; misuse fails in one line.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

from tcsm.core.errors import ConfigError
from tcsm.evaluation.exact import EnumerableDistribution, ExactBlockDenoiser
from tcsm.models.blocks import build_block_denoiser
from tcsm.paths import MaskedPath, UniformPath
from tcsm.sampling.blocks import CachedBlockDenoiser, decode_blocks
from tcsm.sampling.registry import sampler_class
from tcsm.sampling.settings import SampleSettings, draw, sample_settings

pytestmark = pytest.mark.usefixtures("one_thread")


def inner(name, **kw):
    cls = sampler_class(name)
    return cls(cls.settings_type(**kw))


def p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square test of counts against probs, cells with expectation < 5 pooled into one."""
    n = float(counts.sum())
    expected = n * probs.double()
    big = expected >= 5
    obs = torch.cat([counts[big].double(), counts[~big].double().sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    return float(chi2.sf(stat, int(keep.sum()) - 1))


def counts_of(d: EnumerableDistribution, x: torch.Tensor) -> torch.Tensor:
    return torch.bincount(d.index(x), minlength=d.states.shape[0])


@pytest.fixture(scope="module")
def dist():
    # V = 3, L = 4, blocks of 2: correlated enough that a wrong conditional or a factorization error shows.
    return EnumerableDistribution.random(3, 4, seed=1, concentration=0.5)


def _decode(d, path, k, sampler, n, seed=0, **kw):
    return decode_blocks(ExactBlockDenoiser(d, path, k), path, sampler, n, d.length,
                         generator=torch.Generator().manual_seed(seed), **kw)  # fmt: skip


@pytest.mark.parametrize("method", ["random", "margin", "entropy"])
def test_one_position_per_step_draws_p1(method, dist):
    x, st = _decode(dist, MaskedPath(3), 2, inner(method, steps=2), 20000)
    assert p_value(counts_of(dist, x), dist.probs) > 1e-3
    assert st.method == f"blocks+{method}" and st.num_calls == 4 and st.counts == {"blocks": 2, "cache_calls": 1}


def test_uniform_path_one_position_per_block_draws_p1(dist):
    # The analytic bridge draws each position from its marginal: exact for a block of one position at any K (the
    # marginal is the block's joint), not for larger blocks, where it is exact only as K → ∞.
    x, st = _decode(dist, UniformPath(3), 1, inner("analytic", steps=3), 20000)
    assert p_value(counts_of(dist, x), dist.probs) > 1e-3
    assert st.num_calls == 4 * 3


def test_the_chi_square_sees_a_factorization_error(dist):
    # the same check fails for two positions drawn at once from their marginals (one ancestral step per block)
    x, _ = _decode(dist, MaskedPath(3), 2, inner("ancestral", steps=1), 20000)
    assert p_value(counts_of(dist, x), dist.probs) < 1e-6


def conditional(d, prompt):
    """p_1(x | x^{<P} = prompt) over `d.states` (zero off the prompt)."""
    match = (d.states[:, : len(prompt)] == torch.tensor(prompt)).all(-1)
    p = torch.where(match, d.probs, torch.zeros_like(d.probs))
    return p / p.sum()


def _prompted(prompts, L, reps):
    rows = [p for p in prompts for _ in range(reps)]
    fixed = torch.zeros(len(rows), L, dtype=torch.bool)
    values = torch.zeros(len(rows), L, dtype=torch.long)
    for i, p in enumerate(rows):
        fixed[i, : len(p)] = True
        values[i, : len(p)] = torch.tensor(p, dtype=torch.long)
    return fixed, values


def test_prompts_of_different_lengths_each_get_their_own_conditional():
    # Rows with prompts of 1, 3 and 4 tokens share a batch (blocks of 2: a prompt ends inside block 0, inside
    # block 1, at a block's end). Each row must follow p_1 given its own prompt: a decoder that let the other rows'
    # prompt lengths decide which blocks are prefilled, the times, or the cache positions would not.
    d = EnumerableDistribution.random(3, 6, seed=2, concentration=0.5)
    prompts, reps = [[2], [0, 1, 1], [1, 2, 0, 0]], 3000
    fixed, values = _prompted(prompts, 6, reps)
    x, st = _decode(d, MaskedPath(3), 2, inner("margin", steps=2), fixed.shape[0], seed=3, fixed=fixed, values=values)
    assert torch.equal(x[fixed], values[fixed])
    for i, prompt in enumerate(prompts):
        rows = x[i * reps : (i + 1) * reps]
        assert p_value(counts_of(d, rows), conditional(d, prompt)) > 1e-3, prompt
    assert st.counts["blocks"] == 3  # no block is pinned for every row


def test_a_row_draws_the_same_tokens_batched_as_alone():
    # Greedy blocks (one step, argmax) are a function of the row's own prefix: batched rows with prompts of
    # different lengths must equal each row decoded alone.
    d = EnumerableDistribution.random(3, 6, seed=5, concentration=0.5)
    path = MaskedPath(3)
    greedy = inner("ancestral", steps=1, final_argmax=True)
    prompts = [[], [1], [0, 2, 2], [2, 2, 1, 0], [0, 1, 0, 2, 1]]
    fixed, values = _prompted(prompts, 6, 1)
    batched, _ = _decode(d, path, 2, greedy, len(prompts), fixed=fixed, values=values)
    for i in range(len(prompts)):
        alone, _ = _decode(d, path, 2, greedy, 1, seed=9, fixed=fixed[i : i + 1], values=values[i : i + 1])
        assert torch.equal(batched[i], alone[0]), prompts[i]


def cut_at_eos(x, eos):
    pos = torch.arange(x.shape[1]).expand_as(x)
    first = torch.where(x == eos, pos, torch.full_like(pos, x.shape[1])).min(-1, keepdim=True).values
    return torch.where(pos > first, torch.full_like(x, eos), x)


def test_eos_stops_a_row_and_keeps_the_law_of_p1_cut_at_eos(dist):
    eos = 0
    x, _ = _decode(dist, MaskedPath(3), 2, inner("margin", steps=2), 20000, eos_id=eos)
    pushed = torch.zeros_like(dist.probs).index_add_(0, dist.index(cut_at_eos(dist.states, eos)), dist.probs)
    assert torch.equal(cut_at_eos(x, eos), x)
    assert p_value(counts_of(dist, x), pushed) > 1e-3


def test_decoding_ends_when_every_row_has_stopped():
    # every sequence of this p_1 starts with the EOS token: one block is drawn, the rest is EOS
    probs = torch.rand(3**4, generator=torch.Generator().manual_seed(0))
    d = EnumerableDistribution(probs, 3, 4)
    d = EnumerableDistribution(torch.where(d.states[:, 0] == 2, d.probs, torch.zeros_like(d.probs)), 3, 4)
    x, st = _decode(d, MaskedPath(3), 2, inner("random", steps=2), 50, eos_id=2)
    assert (x == 2).all() and st.num_calls == 2 and st.counts == {"blocks": 1, "cache_calls": 0}


def test_a_stopped_row_beside_a_longer_prompt_enters_the_cache_as_eos():
    # row 0 stops in block 0; block 1 is row 1's prompt, so no row draws it; block 2 is drawn for row 1 only
    probs = torch.rand(3**6, generator=torch.Generator().manual_seed(1))
    d = EnumerableDistribution(probs, 3, 6)
    d = EnumerableDistribution(torch.where(d.states[:, 0] == 2, d.probs, torch.zeros_like(d.probs)), 3, 6)
    fixed, values = _prompted([[], [2, 0, 1, 1]], 6, 1)
    model = Counting(d, MaskedPath(3), 2)
    x, st = decode_blocks(model, MaskedPath(3), inner("margin", steps=2), 2, 6, fixed=fixed, values=values, eos_id=2)
    assert (x[0] == 2).all() and x[1, :4].tolist() == [2, 0, 1, 1]
    assert model.extends == [4] and st.num_calls == 4 and st.counts == {"blocks": 2, "cache_calls": 1}


def test_an_eos_in_the_prompt_does_not_stop_the_row(dist):
    fixed, values = _prompted([[0]], 4, 200)
    x, _ = _decode(dist, MaskedPath(3), 2, inner("margin", steps=2), 200, eos_id=0, fixed=fixed, values=values)
    assert (x[:, 1:] != 0).any()


def test_a_pinned_suffix_after_the_stop_keeps_its_tokens():
    """V = 3, L = 6, blocks of 2, eos = 0, positions 4..5 pinned to [1, 1]: the rows that stop before the suffix
    (most of them: p_1 puts its mass on sequences starting with eos) keep [1, 1] there, and their free positions
    after the first generated eos are eos."""
    eos, n = 0, 64
    probs = torch.rand(3**6, generator=torch.Generator().manual_seed(0))
    d = EnumerableDistribution(probs, 3, 6)
    d = EnumerableDistribution(torch.where(d.states[:, 1] == eos, 10 * d.probs, d.probs), 3, 6)
    path = MaskedPath(3)
    fixed = torch.zeros(n, 6, dtype=torch.bool)
    fixed[:, 4:] = True
    values = torch.zeros(n, 6, dtype=torch.long)
    values[:, 4:] = 1
    x, _ = decode_blocks(ExactBlockDenoiser(d, path, 2), path, inner("margin", steps=2), n, 6, fixed=fixed,
                         values=values, eos_id=eos, generator=torch.Generator().manual_seed(1))  # fmt: skip
    assert torch.equal(x[:, 4:], values[:, 4:])
    pos = torch.arange(4).expand(n, 4)
    first = torch.where(x[:, :4] == eos, pos, torch.full_like(pos, 4)).min(-1, keepdim=True).values
    stopped = first.squeeze(-1) < 3
    assert int(stopped.sum()) >= n // 2  # the case under test happens, in most rows
    assert bool(((x[:, :4] == eos) | (pos <= first)).all())  # free positions after the stop are eos


def test_a_row_subset_is_evaluated_at_its_own_times():
    """`CachedBlockDenoiser.batch_rows(x, rows, t)` (an in-block sampler evaluating some rows only) gives each chosen
    row the logits of the whole batch's call at that row's time, for a time-conditioned block model."""
    torch.manual_seed(0)
    V, k, B = 5, 2, 3
    model = build_block_denoiser("tiny", k, vocab_size=V, num_states=V + 1, d_model=16, n_layers=1, n_heads=2,
                                 cond_dim=8, max_len=4).eval()  # fmt: skip
    with torch.no_grad():  # the zero-initialised head and gates would hide the time
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    cache = model.new_cache(B)
    with torch.no_grad():
        model.extend_cache(cache, torch.tensor([[1, 2], [3, 4], [0, 1]]))
        x = torch.tensor([[V, 1], [V, V], [2, V]])
        rows, t = torch.tensor([2, 0]), torch.tensor([0.8, 0.1])
        got = CachedBlockDenoiser(model, cache, False).batch_rows(x, rows, t)
        for i, (r, ti) in enumerate(zip(rows.tolist(), t.tolist())):
            want = model.denoise(x, torch.full((B,), ti), cache)[r]
            torch.testing.assert_close(got[i], want, atol=1e-6, rtol=0)
        assert not torch.allclose(got[0], model.denoise(x, torch.full((B,), 0.1), cache)[2])  # the time matters


def test_a_network_decoded_with_its_cache_equals_the_one_pass_forward():
    # Greedy blocks (one step, argmax, t = 0) of a block transformer through its KV cache equal the argmax of its
    # one-pass forward given the decoded prefix, for prompts of different lengths in one batch and for each row alone.
    torch.manual_seed(0)
    V, L, k = 11, 12, 4
    model = build_block_denoiser("tiny", k, vocab_size=V, num_states=V + 1, d_model=32, n_layers=2, n_heads=2,
                                 cond_dim=16, max_len=16).eval()  # fmt: skip
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # random matrices, no biases: the zero-initialised head would make every argmax 0
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.zero_()
    path = MaskedPath(V)
    fixed, values = _prompted([[], [3], [1, 2, 3, 4, 5], [7] * 8], L, 1)
    greedy = inner("ancestral", steps=1, final_argmax=True)
    x, st = decode_blocks(model, path, greedy, 4, L, fixed=fixed, values=values)
    ref = torch.where(fixed, values, torch.full_like(values, V))
    with torch.no_grad():
        for lo in range(0, L, k):
            best = model(ref, torch.zeros(4), x1=torch.where(ref == V, 0, ref))[:, lo : lo + k].argmax(-1)
            ref[:, lo : lo + k] = torch.where(fixed[:, lo : lo + k], values[:, lo : lo + k], best)
    assert torch.equal(x, ref) and st.num_calls == 3 and st.counts == {"blocks": 3, "cache_calls": 2}
    assert len(set(x[~fixed].tolist())) >= 2  # not a constant: the argmax depends on the context
    for i in range(4):
        alone, _ = decode_blocks(model, path, greedy, 1, L, fixed=fixed[i : i + 1], values=values[i : i + 1])
        assert torch.equal(alone[0], x[i])


class Counting(ExactBlockDenoiser):
    """The exact block denoiser, recording each cache call's width and the cache length at each denoise call."""

    def __init__(self, *a):
        super().__init__(*a)
        self.extends, self.denoised_at = [], []

    def extend_cache(self, cache, x_clean):
        self.extends.append(x_clean.shape[1])
        super().extend_cache(cache, x_clean)

    def denoise(self, xt_block, t, cache):
        self.denoised_at.append(cache.length)
        return super().denoise(xt_block, t, cache)


@pytest.mark.parametrize("method", ["margin", "euler"])
def test_calls_are_blocks_times_steps_and_a_prompt_is_prefilled_at_once(method):
    d = EnumerableDistribution.random(3, 6, seed=2, concentration=0.5)
    path = MaskedPath(3)
    model = Counting(d, path, 2)
    x, st = decode_blocks(model, path, inner(method, steps=2, cache=False), 4, 6)
    assert st.num_calls == 3 * 2 == len(model.denoised_at) and model.denoised_at == [0, 0, 2, 2, 4, 4]
    assert model.extends == [2, 2]  # the last block never enters the cache
    model = Counting(d, path, 2)
    fixed, values = _prompted([[1, 0, 2, 2], [0, 1, 1, 2, 0]], 6, 2)
    x, st = decode_blocks(model, path, inner(method, steps=2, cache=False), 4, 6, fixed=fixed, values=values)
    assert model.extends == [4] and st.num_calls == 2 and st.counts == {"blocks": 1, "cache_calls": 1}
    assert torch.equal(x[fixed], values[fixed])


def test_draw_decodes_a_block_model_with_the_run_sampler(dist):
    path = MaskedPath(3)
    model = ExactBlockDenoiser(dist, path, 2)
    settings = SampleSettings(method="entropy", steps=2)
    x, st = draw(model, path, 10, 4, settings, generator=torch.Generator().manual_seed(0), prompt=torch.tensor([1]),
                 chunk_size=4)  # fmt: skip
    assert x.shape == (10, 4) and (x[:, 0] == 1).all() and st.method == "blocks+entropy"
    # three chunks; block 0 has one free position (one call: the order's other step reveals none), block 1 two
    assert st.num_calls == 3 * (1 + 2) and st.row_calls.shape == (10,) and st.counts["cache_calls"] == 3


@pytest.mark.parametrize(
    "settings, msg",
    [
        ({"method": "margin", "steps": 2, "semi_ar_block": 2}, "uncached block decoding"),
        ({"method": "joint", "steps": 2}, "draws whole sequences"),
        ({"method": "margin", "steps": 3}, "steps per block"),
    ],
)
def test_a_block_model_refuses_what_does_not_fit_in_one_line(settings, msg, dist):
    path = MaskedPath(3)
    with pytest.raises(ValueError, match=msg) as e:
        draw(ExactBlockDenoiser(dist, path, 2), path, 2, 4, SampleSettings(**settings))
    assert "\n" not in str(e.value)


def test_a_full_sequence_model_refuses_block_decoding(dist):
    path = MaskedPath(3)
    with pytest.raises(ValueError, match="full-sequence model"):
        decode_blocks(dist.denoiser(path), path, inner("margin", steps=2), 2, 4)
    with pytest.raises(ValueError, match="eos_id"):
        draw(dist.denoiser(path), path, 2, 4, SampleSettings(steps=2, eos_id=0))


def test_lengths_paths_and_eos_ids_are_checked(dist):
    path = MaskedPath(3)
    model = ExactBlockDenoiser(dist, path, 2)
    with pytest.raises(ValueError, match="multiple of the model's block length 2"):
        decode_blocks(model, path, inner("margin", steps=2), 2, 3)
    with pytest.raises(ValueError, match="path.block_length=4"):
        decode_blocks(model, MaskedPath(3, block_length=4), inner("margin", steps=2), 2, 4)
    with pytest.raises(ValueError, match="not a token id"):
        decode_blocks(model, path, inner("margin", steps=2), 2, 4, eos_id=3)
    with pytest.raises(ConfigError, match="eos_id must be"):
        sample_settings({"eos_id": -1})
    with pytest.raises(ValueError, match="clean sequence"):
        model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1))
