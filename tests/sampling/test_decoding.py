"""Decoding orders of masked models (tcsm.sampling.decoding) against exact enumeration (tcsm.evaluation.exact).

Exact where a law exists: with the exact denoiser and one position per step, the random, margin and entropy
orders reproduce p_1 (the chain rule in an order that depends only on what is revealed), alone and inside blocks.
The confidence and threshold orders pick positions after seeing the draws: the tests measure their bias instead.
Everything else is checked by its properties: network calls, pinned positions, block order, one-line errors.
"""

from __future__ import annotations

import pytest
import torch
from test_samplers import empirical, exact_denoiser, tv, tv_tol

from tcsm.evaluation.exact import EnumerableDistribution
from tcsm.paths import MaskedPath, UniformPath
from tcsm.sampling import DECODERS, decode
from tcsm.sampling.decoding import count_schedule
from tcsm.sampling.settings import SampleSettings, draw

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def dist():
    # V = 3, L = 3: correlated enough that any factorization error or order bias shows in the TV.
    return EnumerableDistribution.random(3, 3, seed=3, concentration=0.3)


def _draw(dist, method, steps, n=20000, seed=0, **kw):
    path = MaskedPath(dist.vocab_size)
    return decode(exact_denoiser(dist, path), path, batch_size=n, length=dist.length, num_steps=steps,
                  method=method, generator=torch.Generator().manual_seed(seed), **kw)  # fmt: skip


@pytest.mark.parametrize("method", ["random", "margin", "entropy"])
def test_one_position_per_step_in_a_revealed_only_order_is_exact(method, dist):
    n = 20000
    x, st = _draw(dist, method, dist.length, n)
    assert tv(empirical(dist, x), dist.probs) < tv_tol(dist.states.shape[0], n)
    assert st.num_calls == dist.length and int(st.row_calls.max()) == dist.length


@pytest.mark.parametrize("method", ["confidence", "threshold"])
def test_orders_that_look_at_the_draws_are_biased(method, dist):
    # Heuristics: choosing the position after drawing favours likely tokens (a larger TV than the sampling noise).
    n = 20000
    x, _ = _draw(dist, method, dist.length, n, threshold=1.0)
    assert tv(empirical(dist, x), dist.probs) > 3 * tv_tol(dist.states.shape[0], n)


def test_several_positions_per_step_carry_the_factorization_error(dist):
    n = 20000
    x, st = _draw(dist, "margin", 1, n)
    assert st.num_calls == 1
    assert tv(empirical(dist, x), dist.probs) > 3 * tv_tol(dist.states.shape[0], n)


@pytest.mark.parametrize("method", ["margin", "random"])
def test_blocks_of_one_exact_order_stay_exact(method):
    d = EnumerableDistribution.random(2, 4, seed=4, concentration=0.3)
    n = 20000
    x, st = _draw(d, method, 4, n, block_length=2)
    assert tv(empirical(d, x), d.probs) < tv_tol(d.states.shape[0], n)
    assert st.num_calls == 4


def test_blocks_of_one_position_are_the_left_to_right_chain_rule():
    d = EnumerableDistribution.random(2, 4, seed=4, concentration=0.3)
    n = 20000
    for method in ("ancestral", "confidence"):  # one candidate position per block: every order is exact
        x, st = _draw(d, method, 4, n, block_length=1, seed=1)
        assert tv(empirical(d, x), d.probs) < tv_tol(d.states.shape[0], n)
        assert st.num_calls == 4


def test_count_schedule_splits_evenly_and_sums_to_the_masked():
    path = MaskedPath(5)
    grid = torch.linspace(0, 1, 5, dtype=torch.float64)
    c = count_schedule(torch.tensor([4, 10, 0]), grid, path)
    assert c.tolist()[0] == [1, 1, 1, 1] and c.sum(-1).tolist() == [4, 10, 0] and (c[1] >= 2).all()


class Recorder:
    """A time-independent uniform denoiser that records each input (to check which positions were open)."""

    time_independent = False

    def __init__(self, V):
        self.V, self.inputs = V, []

    def __call__(self, xt, t):
        self.inputs.append(xt.clone())
        g = torch.Generator().manual_seed(len(self.inputs))
        return torch.randn(xt.shape[0], xt.shape[1], self.V, generator=g)


@pytest.mark.parametrize("method", DECODERS + ("ancestral",))
def test_blocks_are_decoded_left_to_right_and_pinned_positions_kept(method):
    V, L, bl = 5, 12, 4
    path = MaskedPath(V)
    fixed = torch.zeros(3, L, dtype=torch.bool)
    fixed[:, [0, 5, 11]] = True
    values = torch.randint(0, V, (3, L), generator=torch.Generator().manual_seed(0))
    rec = Recorder(V)
    x, st = decode(rec, path, batch_size=3, length=L, num_steps=6, method=method, block_length=bl, fixed=fixed,
                   values=values, threshold=0.5, generator=torch.Generator().manual_seed(1))  # fmt: skip
    assert (x < V).all() and torch.equal(x[fixed], values[fixed])
    assert st.num_calls == len(rec.inputs)
    for inp in rec.inputs:
        masked = inp == V
        # a later block is entirely masked (but pinned positions) until every earlier block is clean
        for b in range(L // bl - 1):
            here, later = masked[:, b * bl : (b + 1) * bl], masked[:, (b + 1) * bl :]
            # every row pins the same positions, and a call may evaluate some rows only
            assert not (here.any(-1) & (later.sum(-1) < (~fixed[0, (b + 1) * bl :]).sum())).any()
    if method in ("random", "confidence", "margin", "entropy"):
        assert st.num_calls == 6  # 2 steps per block, each unmasks >= 1 position


@pytest.mark.parametrize("method", DECODERS + ("ancestral",))
@pytest.mark.parametrize("time_independent", [True, False])
def test_the_engines_dense_loop_draws_the_eager_tokens(method, time_independent):
    """`engine="graph"`: every row evaluated at every step, every region run to its last step, no host read in the
    loop; the same tokens as the eager loop (fp32 CPU), which evaluates the rows that need it and stops early."""
    from tcsm.models.transformer import build_denoiser

    V, L, B = 5, 12, 6
    path = MaskedPath(V)
    torch.manual_seed(0)
    model = build_denoiser("tiny", vocab_size=V, num_states=V + 1, max_len=L,
                           time_conditioning=not time_independent).eval()  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    fixed = torch.zeros(B, L, dtype=torch.bool)
    fixed[:, :5] = True  # a prompt that pins the first block and part of the second
    fixed[:2, 9] = True
    values = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(0))
    out = {}
    for engine in ("eager", "graph"):
        out[engine] = decode(model, path, batch_size=B, length=L, num_steps=9, method=method, block_length=4,
                             fixed=fixed, values=values, threshold=0.3, time_independent=time_independent,
                             generator=torch.Generator().manual_seed(1), engine=engine)  # fmt: skip
    (x, st), (xg, sg) = out["eager"], out["graph"]
    assert torch.equal(x, xg)
    assert st.num_steps == sg.num_steps  # threshold: the steps a region took, counted on the device
    assert sg.num_calls >= st.num_calls and (sg.row_calls == sg.num_calls).all()


def _block_model(V, L, time_conditioning):
    from tcsm.models.blocks import build_block_denoiser

    torch.manual_seed(0)
    model = build_block_denoiser("tiny", 4, vocab_size=V, num_states=V + 1, max_len=L, check_inputs=False,
                                 time_conditioning=time_conditioning).eval()  # (its id check reads CPU tensors)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


def _in_blocks(model, V, L, method, engine, prompt, **kw):
    from tcsm.sampling.settings import sample_settings

    settings = sample_settings({"method": method, "steps": 3, "engine": engine, "threshold": 0.3, **kw})
    prompt = torch.tensor([1, 2, 3, 4, 0, 1])[:prompt] if prompt else None
    return draw(model, MaskedPath(V, block_length=4), 3, L, settings, generator=torch.Generator().manual_seed(4),
                prompt=prompt)  # fmt: skip


@pytest.mark.parametrize("method", DECODERS)
@pytest.mark.parametrize("prompt", [0, 6])
@pytest.mark.parametrize("time_independent", [True, False])
def test_the_captured_order_step_in_blocks_draws_the_eager_tokens(method, prompt, time_independent):
    """Inside a block model under the engine, every step of a decoding order (the denoiser call, the draws from
    the rows' streams, the reveal) is one captured step (off CUDA: run on its static buffers), and the tokens are
    the eager loop's (fp32 CPU), with and without a prompt that ends inside a block."""
    V, L = 5, 16
    model = _block_model(V, L, time_conditioning=not time_independent)
    (x, st), (xg, sg) = (_in_blocks(model, V, L, method, e, prompt) for e in ("eager", "graph"))
    assert torch.equal(x, xg)
    assert sg.counts["captured_steps"] == sg.num_calls == 3 * sg.counts["blocks"]
    assert sg.counts["blocks"] == st.counts["blocks"] == (4 if prompt == 0 else 3)
    assert "captured_steps" not in st.counts and st.num_calls <= sg.num_calls


@pytest.mark.parametrize("method", DECODERS)
def test_the_captured_order_step_reads_nothing_on_the_host_and_two_graphs_serve_every_block(monkeypatch, method):
    """What the engine captures on CUDA is a function of static tensors: no host read of a device value happens
    inside a captured order step (counted as `test_common.count_host_reads` counts), and two StepGraphs (the
    inner steps, the last step), each of one shape, serve every step of every block; tempered, nucleus-truncated
    draws and a final argmax included, with the eager tokens."""
    from test_common import count_host_reads

    from tcsm.sampling import engine

    V, L = 5, 16
    model = _block_model(V, L, time_conditioning=True)
    kw = {"temperature": 0.9, "top_p": 0.95, "final_argmax": True}
    x, _ = _in_blocks(model, V, L, method, "eager", 5, **kw)
    reads, inside, graphs = count_host_reads(monkeypatch), {"n": 0}, []
    call = engine.StepGraph.__call__

    def spy(self, *inputs):
        if self not in graphs:
            graphs.append(self)
        before = reads["n"]
        try:
            return call(self, *inputs)
        finally:
            inside["n"] += reads["n"] - before

    monkeypatch.setattr(engine.StepGraph, "__call__", spy)
    xg, sg = _in_blocks(model, V, L, method, "graph", 5, **kw)
    assert torch.equal(x, xg)
    assert sg.counts["captured_steps"] == sg.num_calls == 3 * 3
    assert inside["n"] == 0 and reads["n"] > 0  # (the count sees the reads outside the steps)
    assert len(graphs) == 2 and all(len(g._entries) == 1 for g in graphs)


@pytest.mark.parametrize("chunk_size", [None, 2])
def test_the_steps_taken_are_counted_on_the_device_and_read_once(chunk_size):
    """Threshold's steps follow from the threshold: a whole decode reads their device count once at its end into
    `num_steps`; in a block model's blocks the count stays on the device (`steps_taken`, summed over the blocks and
    the chunks), the same under both engines."""
    from tcsm.models.transformer import build_denoiser
    from tcsm.sampling.settings import sample_settings

    V, L = 5, 16
    model = _block_model(V, L, time_conditioning=True)
    out = {}
    for engine in ("eager", "graph"):
        settings = sample_settings({"method": "threshold", "steps": 3, "engine": engine, "threshold": 0.3})
        out[engine] = draw(model, MaskedPath(V, block_length=4), 3, L, settings, chunk_size=chunk_size,
                           generator=torch.Generator().manual_seed(4))  # fmt: skip
    (x, st), (xg, sg) = out["eager"], out["graph"]
    assert torch.equal(x, xg) and isinstance(sg.steps_taken, torch.Tensor)
    assert int(st.steps_taken) == int(sg.steps_taken) <= st.num_calls < sg.num_calls
    torch.manual_seed(0)
    den = build_denoiser("tiny", vocab_size=V, num_states=V + 1, max_len=L).eval()
    with torch.no_grad():
        for p in den.parameters():
            p.add_(0.5 * torch.randn_like(p))
    for engine in ("eager", "graph"):
        _, s = decode(den, MaskedPath(V), batch_size=3, length=L, num_steps=8, method="threshold", threshold=0.3,
                      generator=torch.Generator().manual_seed(1), engine=engine)  # fmt: skip
        assert s.num_steps == int(s.steps_taken) < 8


def test_threshold_unmasks_more_per_call_as_it_falls():
    V, L = 4, 32
    path = MaskedPath(V)

    def peaked(xt, t):  # every conditional puts 0.993 on token 0
        out = torch.full((xt.shape[0], xt.shape[1], V), -6.0)
        out[..., 0] = 0.0
        return out

    calls = {}
    for thr in (0.9, 0.999):
        _, st = decode(peaked, path, batch_size=2, length=L, num_steps=L, method="threshold", threshold=thr,
                       generator=torch.Generator().manual_seed(0))  # fmt: skip
        calls[thr] = st.num_calls
        assert st.num_steps == st.num_calls  # its steps follow from the threshold, each one call
    # above the threshold nearly all at once (a rare unlikely draw waits a call), else one position per call
    assert calls[0.9] <= 3 and calls[0.999] == L


def test_temperature_and_top_p_reach_the_draws():
    V, L = 4, 16
    path = MaskedPath(V)
    logits = torch.log(torch.tensor([0.6, 0.3, 0.05, 0.05]))
    den = lambda xt, t: logits.expand(xt.shape[0], xt.shape[1], V)
    x, _ = decode(den, path, batch_size=200, length=L, num_steps=4, method="margin", top_p=0.8,
                  generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert set(x.unique().tolist()) <= {0, 1}
    x, _ = decode(den, path, batch_size=200, length=L, num_steps=4, method="random", temperature=0.05,
                  generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert (x == 0).double().mean() > 0.99


def test_draw_routes_decoding_orders_and_blocks(dist):
    path = MaskedPath(dist.vocab_size)
    den = exact_denoiser(dist, path)
    for s, method in (
        (SampleSettings(steps=3, method="entropy"), "entropy"),
        (SampleSettings(steps=3, semi_ar_block=1), "ancestral"),
    ):  # blocks of the path sampler's law
        x, st = draw(den, path, 5, dist.length, s, generator=torch.Generator().manual_seed(0))
        assert x.shape == (5, 3) and st.method == method and st.num_calls == 3
    _, st = draw(
        den, path, 5, dist.length, SampleSettings(steps=3), generator=torch.Generator().manual_seed(0)
    )
    assert st.method == "ancestral" and st.num_steps == 3  # no block, no order: the path sampler itself


@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"method": "bogus"}, "unknown decoding order"),
        ({"block_length": 2}, "does not divide"),
        ({"method": "threshold", "threshold": 0.0}, "threshold must be in (0, 1]"),
        ({"method": "threshold", "threshold": 1.5}, "threshold must be in (0, 1]"),
        ({"num_steps": 4}, "steps must be <= the sample length"),
    ],
)
def test_bad_requests_fail_in_one_line(kw, msg, dist):
    path = MaskedPath(dist.vocab_size)
    args = {"batch_size": 2, "length": 3, "num_steps": 3, "method": "margin"} | kw
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)").replace("]", r"\]")):
        decode(exact_denoiser(dist, path), path, **args)


def test_settings_and_paths_are_checked():
    with pytest.raises(ValueError, match="method must be one of"):
        SampleSettings(method="greedy")
    with pytest.raises(ValueError, match="threshold"):
        SampleSettings(threshold=0.0)
    with pytest.raises(ValueError, match="needs a masked path"):
        decode(lambda x, t: torch.zeros(1, 2, 3), UniformPath(3), batch_size=1, length=2, num_steps=2)
