"""The masked joint step (MATH.md §10.1): at initialisation (zero head output) the joint sampler draws the factorised
denoiser's tokens for the same seed, step for step; a step-head model refuses what the joint step does not do."""

from __future__ import annotations

import pytest
import torch

from tcsm.core.errors import ConfigError
from tcsm.models import build_denoiser
from tcsm.models.kinds import kind_of
from tcsm.paths import MaskedPath, UniformPath
from tcsm.sampling.joint_step import sample_joint_steps
from tcsm.sampling.settings import draw, sample_settings

V, L = 5, 12


def _pair(seed=0):
    """A step-head model with a zero head and the plain denoiser of the same weights."""
    torch.manual_seed(seed)
    joint = build_denoiser("tiny", vocab_size=V, num_states=V + 1, step_head_layers=1, time_conditioning=False)
    for name, p in joint.named_parameters():
        if p.dim() > 1 and not name.startswith("step_head."):
            torch.nn.init.normal_(p, std=0.2)
    plain = build_denoiser("tiny", vocab_size=V, num_states=V + 1, time_conditioning=False)
    plain.load_state_dict({k: v for k, v in joint.state_dict().items() if not k.startswith("step_head.")})
    return joint.eval(), plain.eval()


@pytest.mark.parametrize("steps", [1, 4, 8])
def test_at_initialisation_the_joint_sampler_draws_the_factorised_tokens(steps):
    joint, plain = _pair(1)
    assert "joint_step" in kind_of(joint).offers and "joint_step" not in kind_of(plain).offers
    path = MaskedPath(V)
    with torch.no_grad():
        a, sa = draw(joint, path, 16, L, sample_settings({}, steps=steps), generator=torch.Generator().manual_seed(3))
        b, sb = draw(plain, path, 16, L, sample_settings({}, steps=steps), generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    assert sa.num_calls == sb.num_calls and sa.counts["head_calls"] >= steps


def test_the_joint_sampler_draws_the_same_tokens_in_chunks_of_rows():
    joint, _ = _pair(4)
    with torch.no_grad():
        for p in joint.step_head.parameters():  # a head that corrects: its draws depend on the rows' own tokens
            p.add_(0.3 * torch.randn_like(p))
    path = MaskedPath(V)
    with torch.no_grad():
        whole, sw = draw(joint, path, 10, L, sample_settings({}, steps=4), generator=torch.Generator().manual_seed(5))
        parts, sp = draw(joint, path, 10, L, sample_settings({}, steps=4), generator=torch.Generator().manual_seed(5),
                         chunk_size=3)  # fmt: skip
    assert torch.equal(whole, parts) and (whole < V).all()
    assert torch.equal(sw.row_calls, sp.row_calls) and sp.num_rows == sw.num_rows and sp.num_calls > sw.num_calls
    with pytest.raises(ValueError, match="one chunk"):
        sample_joint_steps(joint, path, 10, L, 4, chunk_size=3, callback=lambda k, t, x: None)


def test_the_joint_step_refuses_the_uniform_source_and_blocks():
    joint, _ = _pair()
    with pytest.raises(ValueError, match="masked source"):
        sample_joint_steps(joint, UniformPath(V), 2, L, 4)
    with pytest.raises(ConfigError, match="semi_ar_block"):
        draw(joint, MaskedPath(V), 2, L, sample_settings({}, steps=4, semi_ar_block=4))


@pytest.mark.parametrize("steps", [1, 2, 4])
def test_at_initialisation_a_block_models_joint_sampler_draws_the_factorised_block_tokens(steps):
    """A block model with a zero head draws, block by block through its KV cache, the tokens of the block model
    without a head for the same seed (a prompt pins a block and a half); the in-block steps are joint ones."""
    from tcsm.models.blocks import build_block_denoiser

    k = 4
    torch.manual_seed(2)
    joint = build_block_denoiser("tiny", k, vocab_size=V, num_states=V + 1, max_len=L, step_head_layers=1)
    for name, p in joint.named_parameters():
        if p.dim() > 1 and not name.startswith("step_head."):
            torch.nn.init.normal_(p, std=0.2)
    plain = build_block_denoiser("tiny", k, vocab_size=V, num_states=V + 1, max_len=L)
    plain.load_state_dict({n: v for n, v in joint.state_dict().items() if not n.startswith("step_head.")})
    joint.eval(), plain.eval()
    path = MaskedPath(V, block_length=k)
    fixed = torch.zeros(16, L, dtype=torch.bool)
    fixed[:8, :6] = True
    values = torch.randint(0, V, (16, L), generator=torch.Generator().manual_seed(0))
    out = {}
    with torch.no_grad():
        for name, model in (("joint", joint), ("plain", plain)):
            out[name] = draw(model, path, 16, L, sample_settings({}, steps=steps), fixed=fixed, values=values,
                             generator=torch.Generator().manual_seed(3))  # fmt: skip
    (a, sa), (b, sb) = out["joint"], out["plain"]
    assert torch.equal(a, b) and torch.equal(a[fixed], values[fixed])
    assert sa.counts["head_calls"] >= steps and sa.counts["blocks"] == sb.counts["blocks"] == L // k
