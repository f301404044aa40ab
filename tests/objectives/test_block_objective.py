"""TCSM objectives on the block path (MATH.md §9): per-position times, each block at its own t; every loss,
divergence, source and weighting reduces to the sum of the blocks' losses, and the objective's κ-weighted
L_distrib is the block NELBO."""

from __future__ import annotations

import math

import pytest
import torch

from tcsm.evaluation.exact import EnumerableDistribution, ExactBlockDenoiser
from tcsm.models.kinds import ModelKind
from tcsm.objectives import Objective
from tcsm.paths import MaskedPath, UniformPath
from tcsm.targets import ConditionalTarget, TargetBatch

BLOCKS = ModelKind("denoiser", "blocks", None, "a block model (test)", blocks=True)


pytestmark = pytest.mark.usefixtures("one_thread")


def _path(kind, V, k=None):
    return MaskedPath(V, block_length=k) if kind == "masked" else UniformPath(V, block_length=k)


@pytest.mark.parametrize("kind", ["masked", "uniform"])
@pytest.mark.parametrize(
    "loss,divergence,explicit",
    [
        ("distrib", "kl", False), ("distrib", "kl", True), ("distrib", "js", True),
        *(("score", b, e) for b in ("gkl", "lsif", "bce", "is") for e in (False, True)),
    ],
)  # fmt: skip
@pytest.mark.parametrize("weighting", ["kappa", "uniform", "alpha_dot"])
def test_block_loss_is_the_mean_of_its_blocks_losses(kind, loss, divergence, weighting, explicit):
    """[oracle ix.c] A [B, L] batch at per-block times gives exactly the loss of its B·nb blocks as rows of their own, each at its
    block's time, on the full-sequence path: no loss or weighting reads t as one time per sequence."""
    V, B, L, k = 4, 3, 6, 2
    nb = L // k
    g = torch.Generator().manual_seed(0)
    block, rows = _path(kind, V, k), _path(kind, V)
    x1 = torch.randint(0, V, (B, L), generator=g)
    t = block.draw_times(lambda n: torch.rand(n, generator=g, dtype=torch.float64).float(), B, L)
    assert t.shape == (B, L) and (t.view(B, nb, k) == t.view(B, nb, k)[..., :1]).all()
    xt = block.draw_xt(x1, t, g)
    logits = torch.randn(B, L, V, generator=g)
    log_q = torch.log_softmax(torch.randn(B, L, V, generator=g) + block.log_kernel(xt, t), -1) if explicit else None
    tb = TargetBatch(xt=xt, t=t, x1=x1, loss_mask=block.loss_mask(xt), log_q=log_q)
    tr = TargetBatch(
        xt=xt.reshape(B * nb, k), t=t.reshape(B * nb, k)[:, 0], x1=x1.reshape(B * nb, k),
        loss_mask=block.loss_mask(xt).reshape(B * nb, k), log_q=None if log_q is None else log_q.reshape(B * nb, k, V),
    )  # fmt: skip
    a, _ = Objective(block, loss=loss, divergence=divergence, weighting=weighting).loss_from_batch(logits, tb)
    b, _ = Objective(rows, loss=loss, divergence=divergence, weighting=weighting).loss_from_batch(
        logits.reshape(B * nb, k, V), tr
    )
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["masked", "uniform"])
def test_objective_hands_block_models_the_clean_sequence_and_per_block_times(kind):
    V, B, L, k = 3, 4, 6, 3
    seen = {}

    class Spy(torch.nn.Module):
        model_kind = BLOCKS

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(V))

        def forward(self, xt, t, x1=None):
            seen.update(xt=xt, t=t, x1=x1)
            return self.w.expand(*xt.shape, V)

    x1 = torch.randint(0, V, (B, L), generator=torch.Generator().manual_seed(1))
    loss, _ = Objective(_path(kind, V, k))(Spy(), x1, torch.Generator().manual_seed(2))
    assert torch.isfinite(loss) and seen["x1"] is x1 and seen["t"].shape == (B, L)
    t = seen["t"].view(B, L // k, k)
    assert (t == t[..., :1]).all() and t[..., 0].unique().numel() == B * L // k


def test_full_sequence_objective_draws_are_unchanged():
    """path.block_length = None keeps one time per sequence, drawn exactly as before (same random stream)."""
    V, B, L = 3, 5, 4
    path = MaskedPath(V)
    obj = Objective(path)
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    t = path.draw_times(lambda n: obj.sample_t(n, generator=g1), B, L)
    torch.testing.assert_close(t, obj.sample_t(B, generator=g2), rtol=0, atol=0)


def test_kappa_weighted_distrib_loss_at_the_exact_block_posterior_is_the_nll():
    """Masked, L_distrib with ω = κ_t: L · E[loss] = Σ_b E[block NELBO] = −log p_1(x) at the exact block denoiser,
    so the mean over many draws of the whole support matches the mean NLL within 4 standard errors."""
    V, L, k = 2, 4, 2
    d = EnumerableDistribution.random(V, L, seed=6)
    path = MaskedPath(V, block_length=k)
    model = ExactBlockDenoiser(d, path, k)
    obj = Objective(path, loss="distrib", weighting="kappa")
    g = torch.Generator().manual_seed(4)
    x1 = d.states
    vals = torch.stack([obj(model, x1, g)[0] for _ in range(400)]).double() * L
    nll = float((-d.log_prob(x1)).mean())
    se = float(vals.std() / math.sqrt(vals.numel()))
    assert abs(float(vals.mean()) - nll) <= 4 * se, (float(vals.mean()), nll, se)


def test_parametric_target_runs_on_the_block_path():
    """An explicit N^1 target (an LM's single-site conditionals) composes with per-position times."""
    V, L, k = 3, 4, 2
    d = EnumerableDistribution.random(V, L, seed=7)
    path = UniformPath(V, block_length=k)
    obj = Objective(path, target=ConditionalTarget(d.conditionals), loss="score", divergence="gkl")
    loss, _ = obj(ExactBlockDenoiser(d, path, k), d.states[:8], torch.Generator().manual_seed(0))
    assert torch.isfinite(loss)


def test_clipped_times_stay_in_their_range_and_are_checked():
    obj = Objective(MaskedPath(3, block_length=2), t_range=(0.2, 0.7))
    t = obj.path.draw_times(lambda n: obj.sample_t(n, generator=torch.Generator().manual_seed(0)), 64, 4)
    assert t.shape == (64, 4) and float(t.min()) >= 0.2 and float(t.max()) < 0.7
    assert float(t.max()) - float(t.min()) > 0.4  # antithetic draws still cover the range
    with pytest.raises(ValueError, match="t_range"):
        Objective(MaskedPath(3), t_range=(0.5, 0.5))
