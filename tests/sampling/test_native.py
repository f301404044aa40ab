"""`sample.method=native`: a model's own sampler through tcsm's one sampling call (DiffusionGemma's generate())."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "DiffusionGemmaForBlockDiffusion"):
    pytest.skip("this transformers has no DiffusionGemma", allow_module_level=True)

from diffusion_gemma_helpers import tiny_hf

from tcsm.core.errors import ConfigError
from tcsm.models.diffusion_gemma import DiffusionGemmaDenoiser
from tcsm.paths import UniformPath
from tcsm.sampling.common import prefix_condition
from tcsm.sampling.registry import SamplerSettings, sampler_class

pytestmark = pytest.mark.usefixtures("one_thread")
V, K = 8, 4


def _draw(model, num, length, seed, **kw):
    native = sampler_class("native")(SamplerSettings(steps=3))
    return native(model, UniformPath(V, block_length=K), num, length, generator=torch.Generator().manual_seed(seed),
                  **kw)  # fmt: skip


def test_native_is_the_models_generate_continuing_the_prompt_with_its_own_seed():
    hf = tiny_hf(V=V, k=K)
    model = DiffusionGemmaDenoiser(hf)
    prompt = torch.tensor([[3, 4, 5], [6, 7, 3]])
    fixed, values = prefix_condition(prompt, 2, 11)
    before = torch.random.get_rng_state()
    tokens, stats = _draw(model, 2, 11, 0, fixed=fixed, values=values)
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's stream is untouched
    assert tokens.shape == (2, 11) and torch.equal(tokens[:, :3], prompt) and stats.method == "native"
    assert stats.num_calls == 2 * 3  # two canvases of K = 4 cover the 8 new tokens, 3 steps each at most
    again, _ = _draw(model, 2, 11, 0, fixed=fixed, values=values)
    assert torch.equal(again, tokens)
    seed = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(0)))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        own = hf.generate(prompt, max_new_tokens=8, max_denoising_steps=3).sequences
    assert torch.equal(tokens, own)


def test_without_a_prompt_it_starts_from_bos_which_is_not_returned():
    model = DiffusionGemmaDenoiser(tiny_hf(V=V, k=K))
    tokens, _ = _draw(model, 3, 8, 1)
    assert tokens.shape == (3, 8) and int(tokens.max()) < V


def test_one_line_errors():
    model = DiffusionGemmaDenoiser(tiny_hf(V=V, k=K))
    fixed = torch.zeros(2, 8, dtype=torch.bool)
    fixed[:, 2] = True
    with pytest.raises(ConfigError, match="infilling needs one of tcsm's samplers"):
        _draw(model, 2, 8, 0, fixed=fixed, values=torch.zeros(2, 8, dtype=torch.long))
    with pytest.raises(ConfigError, match="needs a model with its own sampler"):
        _draw(lambda xt, t: xt, 2, 8, 0)


def test_a_prompt_that_fills_the_length_says_nothing_is_left_to_draw():
    """Not the model's own "max_new_tokens must be a positive integer, but got 0"."""
    model = DiffusionGemmaDenoiser(tiny_hf(V=V, k=K))
    fixed, values = prefix_condition(torch.tensor([[3, 4, 5, 6]]), 1, 4)
    with pytest.raises(ConfigError, match=r"prompt \(4 tokens\) fills the whole sample length 4.*--max-new-tokens"):
        _draw(model, 1, 4, 0, fixed=fixed, values=values)


def test_a_native_sample_prints_no_torch_jit_deprecation(tmp_path):
    """generate() imports torch's compiler stack, whose import warns that torch.jit is deprecated: in a fresh
    process, with every warning shown, none of those lines reaches the user."""
    import subprocess
    import sys

    code = ("import torch, warnings; warnings.simplefilter('default'); from diffusion_gemma_helpers import tiny_hf; "
            "from tcsm.models.diffusion_gemma import DiffusionGemmaDenoiser; "
            f"DiffusionGemmaDenoiser(tiny_hf(V={V}, k={K})).native_generate(torch.tensor([[3, 4]]), 6, steps=2)")
    import os
    from pathlib import Path

    tests = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert "torch.jit" not in r.stderr


@pytest.mark.parametrize("window", [20, 3])
def test_the_engine_runs_generate_on_its_static_cache_where_that_is_exact(window, monkeypatch):
    """sample.engine=graph: generate() on the model's own static cache when the sequence fits the sliding window
    (the same tokens as its DynamicCache path); past the window (where transformers' static sliding layers hold
    one key more) the DynamicCache path runs, so the tokens are the eager ones there too."""
    model = DiffusionGemmaDenoiser(tiny_hf(V=V, k=K, window=window))
    prompt = torch.tensor([[3, 4, 5], [6, 7, 3]])
    fixed, values = prefix_condition(prompt, 2, 11)
    seen, generate = [], model.hf.generate

    def spy(*args, **kwargs):
        seen.append(kwargs.get("cache_implementation"))
        return generate(*args, **kwargs)

    monkeypatch.setattr(model.hf, "generate", spy)
    out = {}
    for engine in ("eager", "graph"):
        native = sampler_class("native")(SamplerSettings(steps=3, engine=engine))
        out[engine], _ = native(model, UniformPath(V, block_length=K), 2, 11, fixed=fixed, values=values,
                                generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert torch.equal(out["eager"], out["graph"])
    assert seen == [None, "static" if window == 20 else None]
