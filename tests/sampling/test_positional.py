"""The sparse step of a denoiser that offers "positions" (`samplers._positional_step`): called on the rows that move,
at their moving positions only, it draws the tokens the cached (or uncached) step draws from the same model."""

from __future__ import annotations

import pytest
import torch

from tcsm.models import build_denoiser
from tcsm.paths import MaskedPath, UniformPath
from tcsm.sampling import sample

V, L = 6, 12


class Declares:
    """The model as a callable that declares nothing: the full call, with the cache where the model allows it."""

    def __init__(self, model):
        self.model, self.cfg = model, model.cfg

    def __call__(self, xt, t):
        return self.model(xt, t)


class Counting(torch.nn.Module):
    """The model, counting the positions it is asked to project (and declaring what the model declares)."""

    model_kind = build_denoiser("tiny", vocab_size=V, num_states=V + 1, max_len=L).model_kind

    def __init__(self, model):
        super().__init__()
        self.model, self.cfg, self.projected = model, model.cfg, []

    def forward(self, xt, t, *, at=None):
        self.projected.append(int(at.sum()) if at is not None else xt.numel())
        return self.model(xt, t, at=at)


def _random(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    return model.eval()


@pytest.mark.parametrize("time_conditioning", [False, True])
@pytest.mark.parametrize("method,steps", [("ancestral", 20), ("euler", 7)])
def test_the_positional_step_draws_what_the_full_call_draws(time_conditioning, method, steps):
    torch.manual_seed(3)
    model = _random(build_denoiser("tiny", vocab_size=V, num_states=V + 1, max_len=L,
                                   time_conditioning=time_conditioning))  # fmt: skip
    path = MaskedPath(V)
    counting = Counting(model)
    kw = {"batch_size": 9, "length": L, "num_steps": steps, "method": method, "seed": 11, "return_stats": True}
    ours, st = sample(counting, path, **kw)
    full, st_full = sample(Declares(model), path, **kw)
    assert torch.equal(ours, full) and (ours < V).all()
    # every call projects only positions that move, and all of them: L per row in all
    assert sum(counting.projected) == 9 * L
    assert st.num_calls == len(counting.projected)
    assert bool((st.row_calls <= st_full.row_calls).all())
    if time_conditioning:  # the full call runs every unfinished row each step; ours only the rows that move
        assert int(st.row_calls.sum()) < int(st_full.row_calls.sum())


def test_the_euler_step_on_the_uniform_path_draws_what_the_full_call_draws():
    torch.manual_seed(4)
    model = _random(build_denoiser("tiny", vocab_size=V, num_states=V, max_len=L, time_conditioning=True))
    path = UniformPath(V)
    kw = {"batch_size": 5, "length": L, "num_steps": 9, "method": "euler", "seed": 2, "return_stats": True}
    ours, st = sample(model, path, **kw)
    full, st_full = sample(Declares(model), path, **kw)
    assert torch.equal(ours, full) and int(st.row_calls.sum()) <= int(st_full.row_calls.sum())
