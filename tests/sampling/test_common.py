"""Per-row random streams (`tcsm.sampling.common.RowStreams`) and the batch invariance they give the samplers.

The streams: uniforms in (0, 1) that a plain-Python evaluation of the same hash reproduces (so they do not depend on
the device or on tensor kernels), uniform in law, and a Gumbel-max categorical with the right law. Batch invariance:
on the CPU in fp32, every row of a batch of 16 is bit-identical to the same row decoded alone with its own seed, for
the path samplers (cached and uncached ancestral, analytic on a uniform path, Euler), the decoding orders, block
models through their KV cache (eager and the engine's fixed-shape path) and AR decoding (static cache, prompts).
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2

from tcsm.models.blocks import build_block_denoiser
from tcsm.models.lm_families import build_lm
from tcsm.models.transformer import build_denoiser
from tcsm.paths import MaskedPath, UniformPath
from tcsm.sampling.blocks import decode_blocks
from tcsm.sampling.common import RowStreams, inverse_cdf, row_streams
from tcsm.sampling.decoding import decode
from tcsm.sampling.registry import sampler_class
from tcsm.sampling.samplers import sample
from tcsm.targets.ar import sample_ar

pytestmark = pytest.mark.usefixtures("one_thread")

V, L, B = 7, 12, 16


def _py_splitmix(z: int) -> int:
    M = 2**64 - 1
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)


def test_the_hash_is_plain_integer_arithmetic():
    # the tensor hash is SplitMix64 on unsigned 64-bit words, as Python's integers compute it
    M = 2**64 - 1
    seeds = [5, 2**62 + 7, 0]
    u = RowStreams(torch.tensor(seeds)).uniform([11, 12], 4)
    for r, seed in enumerate(seeds):
        base = _py_splitmix((seed * 0x9E3779B97F4A7C15 + 0x3C6EF372FE94F82B) & M)
        for j, key in enumerate([11, 12]):
            for i in range(4):
                z = _py_splitmix(base ^ ((((key << 32) + i) * 0x9E3779B97F4A7C15) & M))
                assert u[r, j, i].item() == ((z >> 11) + 0.5) * 2.0**-53


def test_uniforms_are_uniform_and_keyed():
    s = RowStreams.from_generator(torch.Generator().manual_seed(0), 8, "cpu")
    u = s.uniform(3, 5000)
    assert 0 < u.min() and u.max() < 1
    counts = torch.histc(u.flatten().float(), 20, 0, 1)
    stat = float(((counts - u.numel() / 20) ** 2 / (u.numel() / 20)).sum())
    assert chi2.sf(stat, 19) > 1e-3
    assert not torch.equal(s.uniform(4, 5000), u) and torch.equal(s.uniform([2, 3], 5000)[:, 1], u)
    assert not torch.equal(s.fork(1).uniform(3, 50), s.fork(2).uniform(3, 50))
    # a row's uniforms are its own: the same from a sub-batch
    assert torch.equal(s.select(torch.tensor([5])).uniform(3, 5000), u[5:6])
    assert torch.equal(s.uniform(3, 5000, torch.tensor([2, 5])), u[[2, 5]])


def test_the_inverse_cdf_draw_has_the_law_of_its_probabilities():
    probs = torch.tensor([0.05, 0.0, 0.15, 0.3, 0.5, 0.0])
    s = RowStreams.from_generator(torch.Generator().manual_seed(1), 4, "cpu")
    draws = inverse_cdf((probs * 3).log().expand(4, 5000, 6), s.uniform(0, 5000))  # unnormalised
    counts = torch.bincount(draws.flatten(), minlength=6).double()
    assert counts[1] == 0 and counts[5] == 0  # never a token of probability 0
    keep = probs > 0
    expected = draws.numel() * probs[keep]
    stat = float(((counts[keep] - expected) ** 2 / expected).sum())
    assert chi2.sf(stat, 3) > 1e-3
    # the edges: u next to 1 lands on the last token of positive probability, u next to 0 on the first
    edge = inverse_cdf(probs.log().expand(2, 6), torch.tensor([1 - 2.0**-53, 2.0**-54], dtype=torch.float64))
    assert edge.tolist() == [4, 0]


def test_row_streams_take_the_seed_of_the_first_draw_plus_the_row_index():
    a = row_streams(torch.Generator().manual_seed(9), 16, "cpu")
    b = row_streams(torch.Generator().manual_seed(9), 1, "cpu")
    assert torch.equal(a.seeds[:1], b.seeds) and torch.equal(a.seeds - a.seeds[0], torch.arange(16))
    assert row_streams(a, 16, "cpu") is a
    with pytest.raises(ValueError, match="16 row streams for a batch of 3"):
        row_streams(a, 3, "cpu")


def _randomised(model, scale=0.5):
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # the zero-initialised head and adaLN would make every conditional uniform
        for p in model.parameters():
            p.copy_(scale * torch.randn(p.shape, generator=g))
    return model.eval()


def _each_row_alone(run, streams):
    """Assert that every row of run(streams of 16 rows) equals run(that row's stream alone)."""
    batch = run(streams)
    assert batch.shape[0] == B
    for i in range(B):
        alone = run(streams.select(slice(i, i + 1)))
        assert torch.equal(alone[0], batch[i]), f"row {i} differs alone"
    return batch


def _streams(seed=3):
    return RowStreams.from_generator(torch.Generator().manual_seed(seed), B, "cpu")


@pytest.mark.parametrize(("path", "method", "time_conditioning"), [
    (MaskedPath(V), "ancestral", False),  # MDLM's cache: the rows evaluated differ from call to call
    (MaskedPath(V), "ancestral", True),
    (MaskedPath(V), "euler", True),
    (UniformPath(V), "analytic", True),
    (UniformPath(V), "euler", True),
])  # fmt: skip
def test_path_samplers_draw_each_row_as_if_alone(path, method, time_conditioning):
    model = _randomised(build_denoiser("tiny", vocab_size=V, num_states=path.num_states, max_len=L,
                                       time_conditioning=time_conditioning), 0.15)  # fmt: skip
    prompt = torch.randint(0, V, (B, 3), generator=torch.Generator().manual_seed(1))

    def run(streams):
        rows = streams.seeds - _streams().seeds[0]  # which rows of the batch these are (for their prompts)
        return sample(model, path, batch_size=len(streams), length=L, num_steps=6, method=method,
                      generator=streams, prompt=prompt[rows], chunk_size=5)  # fmt: skip

    x = _each_row_alone(run, _streams())
    assert len(set(x[:, 3:].flatten().tolist())) > 2


@pytest.mark.parametrize("method", ["random", "confidence", "threshold", "ancestral"])
def test_decoding_orders_draw_each_row_as_if_alone(method):
    path = MaskedPath(V)
    model = _randomised(build_denoiser("tiny", vocab_size=V, num_states=V + 1, max_len=L, time_conditioning=False))

    def run(streams):
        return decode(model, path, batch_size=len(streams), length=L, num_steps=6, method=method, block_length=6,
                      threshold=0.3, time_independent=True, generator=streams)[0]  # fmt: skip

    _each_row_alone(run, _streams())


@pytest.mark.parametrize("engine", ["eager", "graph"])
@pytest.mark.parametrize("inner", ["ancestral", "confidence"])
def test_block_models_draw_each_row_as_if_alone(engine, inner):
    path = MaskedPath(V)
    model = _randomised(build_block_denoiser("tiny", 4, vocab_size=V, num_states=V + 1, max_len=L), 0.3)
    cls = sampler_class(inner)
    sampler = cls(cls.settings_type(steps=2, engine=engine))
    x = _each_row_alone(lambda s: decode_blocks(model, path, sampler, len(s), L, generator=s)[0], _streams())
    eager = cls(cls.settings_type(steps=2, engine="eager"))
    assert torch.equal(decode_blocks(model, path, eager, B, L, generator=_streams())[0], x)


@pytest.mark.parametrize("prompt", [0, 4])
def test_ar_decoding_draws_each_row_as_if_alone(prompt):
    model = _randomised(build_lm("causal", "tiny", vocab_size=V, max_len=32), 0.3)
    prefix = torch.randint(0, V, (B, prompt), generator=torch.Generator().manual_seed(2)) if prompt else None

    def run(streams):
        rows = streams.seeds - _streams().seeds[0]
        return sample_ar(model, len(streams), 20, streams, prefix=None if prefix is None else prefix[rows],
                         temperature=0.9)  # fmt: skip

    _each_row_alone(run, _streams())


def test_a_torch_generator_seed_gives_the_first_rows_of_a_bigger_batch():
    # `sample.seed` fixes row i's stream whatever the batch size: batch 1 is row 0 of batch 16
    path = MaskedPath(V)
    model = _randomised(build_denoiser("tiny", vocab_size=V, num_states=V + 1, max_len=L))
    one, many = (sample(model, path, batch_size=n, length=L, num_steps=5, generator=torch.Generator().manual_seed(4))
                 for n in (1, B))  # fmt: skip
    assert torch.equal(one[0], many[0])


def test_streams_held_on_the_host_derive_the_device_seeds_of_their_forks_and_slices():
    # a block decoder under the engine seeds per-row generators from forked streams without a device read
    streams = RowStreams(torch.tensor([2**63 - 1, -(2**63), 0, -1, 12345])).on_host()
    for tag in (0, 3, -1, -2, 10**6):
        for s in (streams.fork(tag), streams.fork(tag).select(slice(1, 4)).fork(-1), streams.fork(tag).fork(tag)):
            assert s._host is not None and s.host_seeds() == s.seeds.tolist()
    assert streams.select(torch.tensor([0, 2]))._host is None  # (rows chosen on the device: read when asked)


def count_host_reads(monkeypatch) -> dict:
    """Counts host reads of tensor values (bool(), item(), tolist(), nonzero(), int(), float(), a tensor used as a
    Python index) into reads["n"]."""
    reads = {"n": 0}
    for name in ("__bool__", "item", "tolist", "nonzero", "__int__", "__float__", "__index__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, **kw):
            reads["n"] += 1
            return _original(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


@pytest.mark.parametrize("method", ["ancestral", "analytic", "confidence", "random", "margin", "entropy", "threshold"])
def test_the_engines_block_steps_read_nothing_on_the_host(monkeypatch, method):
    # host reads of device values counted over a whole block decode (path samplers and decoding orders in the
    # blocks): with the engine they do not grow with the steps per block (none inside the step loop), eagerly they do
    path = (UniformPath if method == "analytic" else MaskedPath)(V, block_length=4)
    model = _randomised(build_block_denoiser("tiny", 4, vocab_size=V, num_states=path.num_states, max_len=L,
                                             check_inputs=False), 0.3)  # (its id check reads CPU tensors only)
    reads = count_host_reads(monkeypatch)

    def count(engine, steps):
        cls = sampler_class(method)
        kw = {"threshold": 1.0} if method == "threshold" else {}  # (one position a step: every step is taken)
        reads["n"] = 0
        decode_blocks(model, path, cls(cls.settings_type(steps=steps, engine=engine, **kw)), B, L,
                      generator=_streams())  # fmt: skip
        return reads["n"]

    assert count("graph", 2) == count("graph", 4)
    assert count("eager", 2) < count("eager", 4)


@pytest.mark.parametrize("method", ["confidence", "threshold", "ancestral"])
def test_the_engines_decoding_order_loop_reads_nothing_on_the_host(monkeypatch, method):
    # a full-sequence model's decoding-order loop (semi-autoregressive blocks, a prompt): with the engine the host
    # reads do not grow with the steps (counted per decode, per block), eagerly they do (threshold 1: one position
    # a step, so every step is taken)
    path = MaskedPath(V)
    model = _randomised(build_denoiser("tiny", vocab_size=V, num_states=V + 1, max_len=L, check_inputs=False), 0.3)
    prompt = torch.randint(0, V, (B, 3), generator=torch.Generator().manual_seed(1))
    fixed = torch.zeros(B, L, dtype=torch.bool)
    fixed[:, :3] = True
    values = torch.zeros(B, L, dtype=torch.long)
    values[:, :3] = prompt
    reads = count_host_reads(monkeypatch)

    def count(engine, steps):
        reads["n"] = 0
        decode(model, path, batch_size=B, length=L, num_steps=steps, method=method, block_length=6, threshold=1.0,
               fixed=fixed, values=values, generator=_streams(), engine=engine)  # fmt: skip
        return reads["n"]

    assert count("graph", 4) == count("graph", 12)
    assert count("eager", 4) < count("eager", 12)
