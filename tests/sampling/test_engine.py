"""The decode engine (`tcsm.sampling.engine`) on the CPU: the static AR cache draws the same tokens as the
concatenating `extend` path it replaces (eager exactly; the fixed-shape graph path on static buffers too), a long
prompt runs in one call and matches the one-pass forward, autocast's weight casts are made once per decode, and
DiffusionGemma's native seed is drawn on its generator's device."""

from __future__ import annotations

import pytest
import torch
from test_common import count_host_reads

from tcsm.models.lm_families import build_lm
from tcsm.sampling.engine import StepGraph, autocast_weight_cache, resolve_engine
from tcsm.targets.ar import sample_ar

pytestmark = pytest.mark.usefixtures("one_thread")


class _ConcatOnly:
    """The causal LM seen through its concatenating cache only (`kv_cache` / `extend`): `sample_ar`'s older path."""

    def __init__(self, model):
        self.model = model

    def parameters(self):
        return self.model.parameters()

    def kv_cache(self, x):
        return self.model.kv_cache(x)

    def extend(self, *args, **kwargs):
        return self.model.extend(*args, **kwargs)

    def __call__(self, x):
        return self.model(x)


def _lm(max_len=64, V=11, seed=0):
    torch.manual_seed(seed)
    model = build_lm("causal", "tiny", vocab_size=V, max_len=max_len).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)  # the zero head would make every conditional uniform
    return model


@pytest.mark.parametrize("engine", ["eager", "graph"])
@pytest.mark.parametrize("prompt", [0, 5])
@pytest.mark.parametrize("shape", [(1.0, 1.0), (0.7, 0.9)])
def test_static_cache_draws_the_tokens_of_the_concatenating_cache(engine, prompt, shape):
    model = _lm()
    prefix = torch.randint(0, 11, (3, prompt), generator=torch.Generator().manual_seed(2)) if prompt else None
    kw = {"prefix": prefix, "temperature": shape[0], "top_p": shape[1]}
    old = sample_ar(_ConcatOnly(model), 3, 40, torch.Generator().manual_seed(1), **kw)
    new = sample_ar(model, 3, 40, torch.Generator().manual_seed(1), engine=engine, **kw)
    assert torch.equal(old, new)
    if prefix is not None:
        assert torch.equal(new[:, :prompt], prefix)


def test_decode_prefills_a_long_prompt_in_one_call_like_the_one_pass_forward():
    """A 100-token prompt at max_len 256: one `decode` call gives the one-pass logits of every prompt position,
    and the next token's logits equal those of the one pass over prompt + token (fp32)."""
    model = _lm(max_len=256, V=13)
    x = torch.randint(0, 13, (2, 101), generator=torch.Generator().manual_seed(3))
    full = model(x)
    cache = model.new_cache(2)
    ids = model.input_ids(x)
    head = model.decode(ids[:, :100], cache)
    assert cache.length == 100 and cache.keys.shape[3] == 256
    torch.testing.assert_close(head, full[:, :100], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.decode(ids[:, 100:], cache), full[:, 100:], atol=1e-5, rtol=1e-5)
    fixed = model.new_cache(2)
    model.decode(ids[:, :100], fixed)
    at = model.decode(ids[:, 100:], fixed, position=torch.tensor([100]))  # the graph path's fixed-shape call
    torch.testing.assert_close(at, full[:, 100:], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="max_len"):
        model.decode(torch.zeros(2, 200, dtype=torch.long), cache)


def test_static_cache_writes_in_place_without_concatenating(monkeypatch):
    model = _lm()
    cache = model.new_cache(2)
    buffer = cache.keys.data_ptr()
    model.decode(torch.zeros(2, 3, dtype=torch.long), cache)
    joined, cat = [], torch.cat

    def spy(tensors, *args, **kwargs):
        joined.extend(tuple(t.shape) for t in tensors)
        return cat(tensors, *args, **kwargs)

    monkeypatch.setattr(torch, "cat", spy)
    for _ in range(4):
        model.decode(torch.zeros(2, 1, dtype=torch.long), cache)
    assert cache.length == 7 and cache.keys.data_ptr() == buffer

    def cache_joins():  # rotary's rotate-half joins one position's halves; a cache join has >= 3 positions
        return [s for s in joined if len(s) == 4 and s[2] >= 3]

    assert joined and not cache_joins()
    model.extend(torch.zeros(2, 1, dtype=torch.long), model.kv_cache(torch.zeros(2, 3, dtype=torch.long))[1], 3)
    assert cache_joins()  # the check sees the concatenating path's joins


def test_autocast_weight_cache_casts_each_weight_once_per_decode():
    """A call that opens and closes its own bf16 autocast region re-casts the weights every time; inside
    `autocast_weight_cache` the casts of the first call are reused (aten::_to_copy counted by the profiler)."""
    from torch.profiler import ProfilerActivity, profile

    lin = torch.nn.Linear(16, 16)
    x = torch.randn(2, 16)

    def casts(hold: bool) -> int:
        ctx = autocast_weight_cache() if hold else torch.autocast("cpu", enabled=False)
        with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:  # noqa: SIM117 (the inner one is chosen)
            with ctx if hold else _nothing():
                for _ in range(5):
                    with torch.autocast("cpu", dtype=torch.bfloat16):
                        lin(x)
        return sum(e.count for e in prof.key_averages() if e.key == "aten::_to_copy")

    assert casts(False) == 15  # input, weight, bias in each of 5 calls
    assert casts(True) == 5 + 2  # the inputs, and the weight and bias once


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_step_graph_runs_on_static_buffers_per_shape_off_cuda():
    seen = []

    def fn(a, b):
        seen.append((a.data_ptr(), tuple(a.shape)))
        return a + b

    g = StepGraph(fn, "cpu")
    one = torch.ones(2)
    assert torch.equal(g(one, one), 2 * one)
    assert torch.equal(g(3 * one, one), 4 * one)
    assert seen[0][0] == seen[1][0]  # the same static input buffer
    assert torch.equal(g(torch.ones(3), torch.ones(3)), 2 * torch.ones(3))
    assert len(g._entries) == 2 and g.captures == 0


def test_resolve_engine():
    assert resolve_engine("auto", "cpu") == "eager" and resolve_engine(None, "cpu") == "eager"
    assert resolve_engine("auto", "cuda") == "graph" and resolve_engine("eager", "cuda") == "eager"
    assert resolve_engine("graph", "cpu") == "graph"
    with pytest.raises(ValueError, match="engine"):
        resolve_engine("fast", "cpu")


def test_sample_settings_engine_key():
    from tcsm.core.errors import ConfigError
    from tcsm.sampling.settings import sample_settings

    assert sample_settings({}).engine == "auto"
    assert sample_settings({"engine": "eager"}).engine == "eager"
    with pytest.raises(ConfigError, match="engine"):
        sample_settings({"engine": "fast"})


def test_native_seed_is_drawn_on_the_generators_device(monkeypatch):
    """`native_generate` seeds the model's generate() from the caller's generator: a CUDA generator must draw on
    CUDA (drawing a CPU tensor with it raised "Expected a 'cpu' device type for generator but found 'cuda'")."""
    from tcsm.models.diffusion_gemma import draw_seed

    g = torch.Generator().manual_seed(5)
    assert draw_seed(g) == draw_seed(torch.Generator().manual_seed(5))
    calls = []

    class _Cuda:
        device = torch.device("cuda")

    def spy(*args, generator=None, device=None, **kwargs):
        calls.append(device)
        return torch.zeros(1, dtype=torch.long)

    monkeypatch.setattr(torch, "randint", spy)
    draw_seed(_Cuda())
    assert calls == [torch.device("cuda")]


BLOCK_METHODS = ["ancestral", "analytic", "euler", "random", "confidence", "margin", "entropy", "threshold"]


def _block_model(time_conditioning: bool, **kw):
    from tcsm.models.blocks import build_block_denoiser

    torch.manual_seed(0)
    model = build_block_denoiser("tiny", 4, vocab_size=7, num_states=8, max_len=32,
                                 time_conditioning=time_conditioning, **kw).eval()  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("method", BLOCK_METHODS)
@pytest.mark.parametrize("uniform", [False, True])
def test_block_decoding_fixed_shape_cache_draws_the_eager_tokens(method, uniform):
    """The graph engine's fixed-shape calls (position on the device, whole buffer under a mask; on the CPU run on
    static buffers) draw the tokens of the eager cache, for every in-block sampler, masked and uniform paths,
    with a prompt that ends inside a block."""
    from tcsm.paths import MaskedPath, UniformPath
    from tcsm.sampling.settings import draw, sample_settings

    if uniform and method not in ("ancestral", "analytic", "euler"):
        pytest.skip("decoding orders reveal masks: masked path only")
    path = (UniformPath if uniform else MaskedPath)(vocab_size=7, block_length=4)
    model = _block_model(time_conditioning=uniform)
    prompt = torch.tensor([1, 2, 3, 4, 5, 6])
    out = {}
    for engine in ("eager", "graph"):
        kw = {"threshold": 0.5} if method == "threshold" else {}
        settings = sample_settings({"method": method, "steps": 3, "engine": engine, **kw})
        out[engine] = draw(model, path, 3, 16, settings, generator=torch.Generator().manual_seed(4), prompt=prompt)
    assert torch.equal(out["eager"][0], out["graph"][0])
    # the engine calls the model at every step of every drawn block (the eager cache may skip a step that changed
    # nothing): no host read decides whether to call
    blocks = out["graph"][1].counts["blocks"]
    assert out["eager"][1].num_calls <= out["graph"][1].num_calls
    assert out["graph"][1].num_calls == 3 * blocks
    # every step ran as one captured step: the call, the draws and the update of the block (path samplers and
    # decoding orders alike)
    assert out["graph"][1].counts["captured_steps"] == out["graph"][1].num_calls
    assert "captured_steps" not in out["eager"][1].counts


def test_fixed_shape_denoise_is_the_one_pass_logits():
    model = _block_model(time_conditioning=True)
    x1 = torch.randint(0, 7, (2, 12), generator=torch.Generator().manual_seed(1))
    xt = torch.randint(0, 8, (2, 12), generator=torch.Generator().manual_seed(2))
    t = torch.tensor([0.3, 0.6])
    with torch.no_grad():
        full = model(xt, t, x1=x1)
        cache, eager = model.new_cache(2, fixed_shape=True), model.new_cache(2)
        for lo in range(0, 12, 4):
            got = model.denoise(xt[:, lo : lo + 4], t, cache)
            torch.testing.assert_close(got, full[:, lo : lo + 4], atol=1e-3, rtol=1e-4)  # logits of size ~10
            torch.testing.assert_close(got, model.denoise(xt[:, lo : lo + 4], t, eager), atol=1e-4, rtol=1e-5)
            model.extend_cache(cache, x1[:, lo : lo + 4])
            model.extend_cache(eager, x1[:, lo : lo + 4])
            assert int(cache.position) == cache.length == lo + 4
    assert cache.keys[0].shape[2] == 32  # the whole capacity


def test_decode_gpu_benchmark_smoke_on_the_cpu():
    """benchmarks/decode_gpu.py --device cpu --smoke: every decoder and engine runs, and on the CPU the engine's
    samples are the eager ones (unigram TV 0)."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "decode_gpu.py"
    spec = importlib.util.spec_from_file_location("decode_gpu", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main(["--device", "cpu", "--smoke", "--batches", "2"])
    seen = {(w["decoder"], w["engine"]) for w in rows}
    assert {("full", "eager"), ("block", "graph"), ("block-confidence", "graph"), ("ar", "graph"),
            ("ar-whole", "graph")} <= seen
    # the confidence order inside blocks runs every step as one captured step under the engine
    assert [w["captured_steps"] for w in rows if w["decoder"] == "block-confidence"] == [0.0, 1.0] * 2
    if ("dg", "eager") in seen:  # (where transformers has DiffusionGemma)
        assert [w["captured_steps"] for w in rows if w["decoder"] == "dg"] == [0.0, 1.0] * 2
    for w in rows:
        assert w["tokens_per_s"] > 0 and w["calls_per_seq"] > 0 and w["tokens_per_cpu_s"] > 0
        if w["tv_unigram_vs_eager"] is not None:
            assert w["tv_unigram_vs_eager"] == 0.0


def _dgemma(self_conditioning=False, attn="sdpa"):
    pytest.importorskip("transformers")
    import transformers

    if not hasattr(transformers, "DiffusionGemmaForBlockDiffusion"):
        pytest.skip("this transformers has no DiffusionGemma")
    from diffusion_gemma_helpers import tiny_hf

    from tcsm.models.diffusion_gemma import DiffusionGemmaDenoiser

    return DiffusionGemmaDenoiser(tiny_hf(V=16, k=4, window=3, attn=attn), self_conditioning=self_conditioning)


def _eager_and_graph(model, path, method: str) -> dict:
    """Three 16-token draws after a 6-token prompt under each engine (same seed); asserts that they are the same
    tokens; {engine: (x, stats)}."""
    from tcsm.sampling.settings import draw, sample_settings

    out = {}
    for engine in ("eager", "graph"):
        settings = sample_settings({"method": method, "steps": 3, "engine": engine})
        out[engine] = draw(model, path, 3, 16, settings, generator=torch.Generator().manual_seed(4),
                           prompt=torch.tensor([1, 2, 3, 4, 5, 6]))  # fmt: skip
    assert torch.equal(out["eager"][0], out["graph"][0])
    return out


@pytest.mark.parametrize("method", ["ancestral", "euler"])
@pytest.mark.parametrize("self_conditioning", [False, True])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_diffusion_gemma_through_the_engine_draws_the_eager_tokens(method, self_conditioning, attn):
    """tcsm-sampled DiffusionGemma on its fixed-shape cache (buffers written in place, block position on the
    device, self-conditioning through a buffer and the model's per-row mask) draws the tokens of its own
    DynamicCache path (fp32), with a prompt that ends inside a canvas and a sliding window shorter than it."""
    from tcsm.paths import UniformPath

    model = _dgemma(self_conditioning, attn)
    path = UniformPath(16, block_length=4)
    out = _eager_and_graph(model, path, method)
    assert out["graph"][1].num_calls == 3 * out["graph"][1].counts["blocks"] == 9
    assert out["graph"][1].counts["captured_steps"] == 9


def test_diffusion_gemma_fixed_shape_cache_is_written_in_place_without_concatenating(monkeypatch):
    """The fixed-shape cache's buffers are allocated once at the decode's length and the encoder writes them in
    place; `denoise` concatenates no cached keys (the model's own DynamicCache path does: the check sees it)."""
    model = _dgemma()
    cache = model.new_cache(2, fixed_shape=True, capacity=24)
    buffers = [layer.keys.data_ptr() for layer in cache.hf.layers]
    x = torch.randint(0, 16, (2, 12), generator=torch.Generator().manual_seed(0))
    joined, cat = [], torch.cat

    def spy(tensors, *args, **kwargs):
        joined.extend(tuple(t.shape) for t in tensors)
        return cat(tensors, *args, **kwargs)

    with torch.no_grad():
        model.extend_cache(cache, x[:, :8])
        monkeypatch.setattr(torch, "cat", spy)
        for _ in range(3):
            model.denoise(x[:, 8:], None, cache)
        assert int(cache.position) == cache.length == 8
        assert [layer.keys.data_ptr() for layer in cache.hf.layers] == buffers
        assert [tuple(layer.keys.shape)[2] for layer in cache.hf.layers] == [24, 24]

        def cache_joins():  # rotary joins a canvas position's halves; a cache join has the 8 cached positions
            return [s for s in joined if len(s) == 4 and s[2] >= 5]

        assert joined and not cache_joins()
        eager = model.new_cache(2)
        model.extend_cache(eager, x[:, :8])
        model.denoise(x[:, 8:], None, eager)
        assert cache_joins()


def test_diffusion_gemma_engine_steps_read_nothing_on_the_host(monkeypatch):
    """Host reads of device values counted over a whole block decode of DiffusionGemma: with the engine they do
    not grow with the steps per block, eagerly they do (the check the block engine's test makes)."""
    from tcsm.paths import UniformPath
    from tcsm.sampling.blocks import decode_blocks
    from tcsm.sampling.registry import sampler_class

    model = _dgemma(self_conditioning=True)
    path = UniformPath(16, block_length=4)
    reads = count_host_reads(monkeypatch)

    def count(engine, steps):
        cls = sampler_class("ancestral")
        reads["n"] = 0
        decode_blocks(model, path, cls(cls.settings_type(steps=steps, engine=engine)), 2, 12,
                      generator=torch.Generator().manual_seed(0))  # fmt: skip
        return reads["n"]

    assert count("graph", 2) == count("graph", 5)
    assert count("eager", 2) < count("eager", 5)


@pytest.mark.parametrize("model_kind", ["block", "block-masked", "diffusion_gemma"])
def test_the_captured_step_reads_nothing_on_the_host_and_is_captured_once_per_shape(monkeypatch, model_kind):
    """What the engine would capture on CUDA (the whole in-block step: denoiser call, the draws from the rows'
    streams, the update) is one function of static tensors: no host read of a device value happens inside it,
    and one StepGraph per step kind (inner steps, last step) serves every block of the decode."""
    from tcsm.paths import MaskedPath, UniformPath
    from tcsm.sampling import engine
    from tcsm.sampling.blocks import decode_blocks
    from tcsm.sampling.registry import sampler_class

    if model_kind.startswith("block"):  # (its id check reads CPU tensors only, and is skipped on a GPU)
        masked = model_kind == "block-masked"
        model = _block_model(time_conditioning=not masked, check_inputs=False)
        path = (MaskedPath if masked else UniformPath)(7, block_length=4)
    else:
        model, path = _dgemma(self_conditioning=True), UniformPath(16, block_length=4)
    inside, reads, graphs = {"on": 0}, {"in": 0, "out": 0}, []
    for name in ("__bool__", "item", "tolist", "nonzero", "__int__", "__float__"):
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _original=original, **kw):
            reads["in" if inside["on"] else "out"] += 1
            return _original(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, counted)
    call = engine.StepGraph.__call__

    def spy(self, *inputs):
        if self not in graphs:
            graphs.append(self)
        inside["on"] += 1
        try:
            return call(self, *inputs)
        finally:
            inside["on"] -= 1

    monkeypatch.setattr(engine.StepGraph, "__call__", spy)
    cls = sampler_class("ancestral")
    _, stats = decode_blocks(model, path, cls(cls.settings_type(steps=3, engine="graph")), 2, 16,
                             generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert stats.counts["captured_steps"] == stats.num_calls == 3 * 4
    assert reads["in"] == 0 and reads["out"] > 0  # (the check sees reads outside)
    assert len(graphs) == 2 and all(len(g._entries) == 1 for g in graphs)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("method", ["ancestral", "confidence"])
def test_hugging_face_block_models_through_the_engine_draw_the_eager_tokens(arch, method):
    """A block denoiser started from a Hugging Face causal LM, on its fixed-shape cache (the clean stream's buffers
    written in place, the noisy block's keys in scratch slots, its position on the device), draws the tokens of
    its DynamicCache path (fp32, time-conditioned, a prompt that ends inside a block); a path sampler's every step
    runs as one captured step."""
    tf = pytest.importorskip("transformers")
    from tcsm.models.hf_block import HFBlockDenoiser
    from tcsm.paths import MaskedPath

    if arch == "gpt2":
        config = tf.GPT2Config(vocab_size=40, n_positions=40, n_embd=32, n_layer=2, n_head=2, bos_token_id=1)
    else:
        config = tf.LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=40,
                                bos_token_id=1)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        hf = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
        model = HFBlockDenoiser(hf, list(range(10, 18)), block_length=4, num_states=9, time_conditioning=True,
                                cond_dim=16).eval()  # fmt: skip
        with torch.no_grad():  # the time path starts at zero: give it weight so that the time input matters
            model.time_proj.weight.normal_(0, 0.5)
    path = MaskedPath(8, block_length=4)
    out = _eager_and_graph(model, path, method)
    if method == "ancestral":
        assert out["graph"][1].counts["captured_steps"] == out["graph"][1].num_calls == 9
    with torch.no_grad():  # the fixed-shape cache holds the decode's length, allocated once, written in place
        cache = model.new_cache(2, fixed_shape=True, capacity=16)
        model.extend_cache(cache, torch.zeros(2, 4, dtype=torch.long))
        buffers = [b[0].data_ptr() for b in cache.hf.buffers.values()]
        model.denoise(torch.full((2, 4), 8), 0.5, cache)
        model.extend_cache(cache, torch.ones(2, 4, dtype=torch.long))
        assert [b[0].data_ptr() for b in cache.hf.buffers.values()] == buffers
        assert int(cache.position) == cache.length == 8 and cache.hf.fill == 9
        assert all(b[0].shape[2] == 17 + 5 for b in cache.hf.buffers.values())


def _uncounted(method, reads):
    def run(*a, **k):
        before = reads["n"]
        try:
            return method(*a, **k)
        finally:
            reads["n"] = before

    return run


def _reads_around_the_blocks(monkeypatch, model, path, method, L, *, prompt=0, eos_id=None, steps=2, cpu_only=(),
                             **kw):  # fmt: skip
    """(host reads over a whole block decode under the engine, those from the first in-block sampler call's start
    to the last one's end: the extends of the cache between blocks included); the reads inside the model's methods
    named in `cpu_only` (checks that read CPU tensors only, skipped on a GPU) are not counted."""
    from tcsm.sampling.blocks import decode_blocks
    from tcsm.sampling.registry import sampler_class

    cls = sampler_class(method)
    reads, marks, call = count_host_reads(monkeypatch), [], cls.__call__

    def spy(self, *a, **k):
        marks.append(reads["n"])
        try:
            return call(self, *a, **k)
        finally:
            marks.append(reads["n"])

    monkeypatch.setattr(cls, "__call__", spy)
    for name in cpu_only:
        monkeypatch.setattr(model, name, _uncounted(getattr(model, name), reads))
    fixed = values = None
    if prompt:
        fixed = torch.zeros(2, L, dtype=torch.bool)
        fixed[:, :prompt] = True
        values = torch.zeros(2, L, dtype=torch.long)
        values[:, :prompt] = torch.arange(prompt) % path.vocab_size
    _, stats = decode_blocks(model, path, cls(cls.settings_type(steps=steps, engine="graph", **kw)), 2, L,
                             fixed=fixed, values=values, generator=torch.Generator().manual_seed(0),
                             eos_id=eos_id)  # fmt: skip
    monkeypatch.undo()
    assert stats.counts["captured_steps"] == stats.num_calls > 0 and marks
    return reads["n"], marks[-1] - marks[0]


@pytest.mark.parametrize("method", ["random", "confidence", "margin", "entropy", "threshold", "ancestral", "analytic"])
@pytest.mark.parametrize("prompt", [0, 6])
@pytest.mark.parametrize("eos_id", [None, 2])
def test_a_block_decode_reads_the_host_before_the_first_block_and_after_the_last_only(monkeypatch, method, prompt,
                                                                                      eos_id):  # fmt: skip
    """Under the engine nothing reads a device value on the host between the blocks either (the pins are checked
    once up front, a stopped row is masked, the output checked once at the end): the reads of a whole decode are
    the same for 2 and 6 blocks, and none happens from the first block's in-block sampler call to the last's."""
    from tcsm.paths import MaskedPath, UniformPath

    uniform = method == "analytic"  # (a uniform path's prior is drawn per block from the rows' seeds)
    model = _block_model(time_conditioning=uniform, check_inputs=False)  # (its id check reads CPU tensors only)
    path = (UniformPath if uniform else MaskedPath)(7, block_length=4)
    kw = {"threshold": 0.5} if method == "threshold" else {}
    short, _ = _reads_around_the_blocks(monkeypatch, model, path, method, 8, prompt=prompt, eos_id=eos_id, **kw)
    long, between = _reads_around_the_blocks(monkeypatch, model, path, method, 24, prompt=prompt, eos_id=eos_id, **kw)
    assert short == long and between == 0


@pytest.mark.parametrize("model_kind", ["diffusion_gemma", "gpt2"])
def test_hugging_face_block_decodes_read_the_host_before_the_first_block_and_after_the_last_only(monkeypatch,
                                                                                                 model_kind):  # fmt: skip
    """The same for DiffusionGemma (uniform path, self-conditioning) and a Hugging Face causal LM as a block
    denoiser (masked path, a decoding order), with a prompt and eos_id."""
    from tcsm.paths import MaskedPath, UniformPath

    if model_kind == "diffusion_gemma":
        model, path, method = _dgemma(self_conditioning=True), UniformPath(16, block_length=4), "ancestral"
        cpu_only = ()
    else:
        tf = pytest.importorskip("transformers")
        from tcsm.models.hf_block import HFBlockDenoiser

        config = tf.GPT2Config(vocab_size=40, n_positions=40, n_embd=32, n_layer=2, n_head=2, bos_token_id=1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            hf = tf.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
            model = HFBlockDenoiser(hf, list(range(10, 18)), block_length=4, num_states=9).eval()
        path, method, cpu_only = MaskedPath(8, block_length=4), "confidence", ("_check",)  # (its CPU-only id check)
    short, _ = _reads_around_the_blocks(monkeypatch, model, path, method, 8, prompt=3, eos_id=2, cpu_only=cpu_only)
    long, between = _reads_around_the_blocks(monkeypatch, model, path, method, 24, prompt=3, eos_id=2,
                                             cpu_only=cpu_only)  # fmt: skip
    assert short == long and between == 0
