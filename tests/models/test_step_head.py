"""The step head (MATH.md §10, "The joint student"): its incremental form (a sampler's) equals its teacher-forced form
(training's), a position's logits read only the tokens drawn before it in the step, and a warm start from the
teacher's denoiser keeps the new head (the joint sampler at initialisation: tests/sampling/test_joint_step.py)."""

from __future__ import annotations

import torch

from tcsm.models import build_denoiser
from tcsm.models.kinds import denoise
from tcsm.train.checkpointer import fresh_weights

V, L = 5, 12


def _pair(seed=0):
    torch.manual_seed(seed)
    joint = build_denoiser("tiny", vocab_size=V, num_states=V + 1, step_head_layers=1, time_conditioning=False)
    for name, p in joint.named_parameters():  # a trained-looking denoiser (its head is zero at init)
        if p.dim() > 1 and not name.startswith("step_head."):
            torch.nn.init.normal_(p, std=0.2)
    plain = build_denoiser("tiny", vocab_size=V, num_states=V + 1, time_conditioning=False)
    plain.load_state_dict({k: v for k, v in joint.state_dict().items() if not k.startswith("step_head.")})
    return joint.eval(), plain.eval()


def test_the_incremental_head_equals_the_teacher_forced_one_and_reads_only_earlier_tokens():
    joint, _ = _pair()
    for p in joint.step_head.out.parameters():
        torch.nn.init.normal_(p, std=0.5)
    g = torch.Generator().manual_seed(0)
    xt = torch.randint(0, V + 1, (4, L), generator=g)
    xt[:, ::2] = V
    reveal = (xt == V) & (torch.rand(4, L, generator=g) < 0.7)
    tokens = torch.randint(0, V, (4, L), generator=g)
    with torch.no_grad():
        forced = denoise(joint, xt, None, tokens, reveal)
        assert torch.equal(forced[~reveal], joint(xt)[~reveal])
        step = joint.open_step(xt, None, reveal)
        prev = torch.full((4,), V)
        rows = torch.arange(4)
        for k in range(step.size):
            pos, ok = step.positions[:, k], step.valid[:, k]
            assert torch.allclose(step.logits(k, prev)[ok], forced[rows, pos][ok], atol=1e-5)
            prev = tokens[rows, pos]
        # a later token changes nothing before it, and changes the positions after it
        first = step.positions[0, 0]
        changed = tokens.clone()
        changed[0, first] = (tokens[0, first] + 1) % V
        again = denoise(joint, xt, None, changed, reveal)
    after = reveal[0] & (torch.arange(L) > first)
    assert torch.equal(again[0, : first + 1], forced[0, : first + 1])
    assert (again[0, after] - forced[0, after]).abs().max() > 1e-4


def test_a_warm_start_from_the_denoiser_keeps_the_new_head_and_nothing_else():
    joint, plain = _pair()
    fresh = fresh_weights(joint, plain.state_dict())
    assert fresh and all(k.startswith("step_head.") for k in fresh)
    assert set(fresh) | set(plain.state_dict()) == set(joint.state_dict())
    assert fresh_weights(plain, plain.state_dict()) == {}


def test_step_head_only_leaves_the_denoisers_weights_to_no_optimizer():
    import pytest

    model = build_denoiser("tiny", vocab_size=V, num_states=V + 1, max_len=L, step_head_layers=1, step_head_only=True)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(n.startswith("step_head.") for n in trained)
    assert {n for n in model.state_dict() if n.startswith("step_head.")} >= trained
    with pytest.raises(ValueError, match="step_head_layers >= 1"):
        build_denoiser("tiny", vocab_size=V, num_states=V + 1, max_len=L, step_head_only=True)


def test_a_fresh_head_learns_a_within_step_copy_in_a_few_dozen_updates():
    # the tokens a step reveals at adjacent positions are equal; the denoiser (frozen, as under step_head_only)
    # cannot see that, so every nat below the factorised NLL is the head reading its predecessor's token
    joint, _ = _pair()
    joint.train()
    params = [p for n, p in joint.named_parameters() if n.startswith("step_head.")]
    opt = torch.optim.Adam(params, lr=3e-3)
    g = torch.Generator().manual_seed(1)

    def batch(n=64):
        xt = torch.full((n, L), V)
        reveal = torch.zeros(n, L, dtype=torch.bool)
        reveal[:, 4:6] = True
        tokens = torch.randint(0, V, (n, L), generator=g)
        tokens[:, 5] = tokens[:, 4]
        return xt, reveal, tokens

    def nll(xt, reveal, tokens):
        lp = denoise(joint, xt, None, tokens, reveal).log_softmax(-1)
        return -lp.gather(-1, tokens[..., None])[..., 0][:, 5].mean()

    held = batch(256)
    with torch.no_grad():
        before = float(nll(*held))
    for _ in range(25):
        opt.zero_grad()
        nll(*batch()).backward()
        opt.step()
    with torch.no_grad():
        after = float(nll(*held))
    # the factorised step reads none of the copy; a head whose token input starts far below the hidden state's
    # scale is still near it after 25 updates (0.7 of its NLL, against 0.03 at unit scale)
    assert after < 0.25 * before, (before, after)


def test_a_block_models_head_reads_its_own_block_only_and_its_cached_step_equals_the_one_pass():
    """On a block model (MATH.md §9) a step reveals positions of one block: the head's correction at block b reads
    the tokens drawn before it in block b only, the clean prefix through the denoiser (from x1, not from the drawn
    tokens), and the cached incremental step of block b equals the one pass at b."""
    from tcsm.models.blocks import build_block_denoiser

    k = 4
    torch.manual_seed(0)
    model = build_block_denoiser("tiny", k, vocab_size=V, num_states=V + 1, max_len=L, step_head_layers=1,
                                 time_conditioning=False)  # fmt: skip
    for name, p in model.named_parameters():
        if p.dim() > 1 or name.startswith("step_head.out"):
            torch.nn.init.normal_(p, std=0.3)
    model.eval()
    g = torch.Generator().manual_seed(1)
    x1 = torch.randint(0, V, (3, L), generator=g)
    xt = torch.where(torch.rand(3, L, generator=g) < 0.6, torch.full_like(x1, V), x1)
    reveal = (xt == V) & (torch.rand(3, L, generator=g) < 0.8)
    tokens = torch.where(reveal, torch.randint(0, V, (3, L), generator=g), x1)
    with torch.no_grad():
        forced = denoise(model, xt, None, tokens, reveal, clean=x1)
        assert torch.equal(forced[~reveal], model(xt, None, x1=x1)[~reveal])
        # other blocks' drawn tokens change nothing in block 1; its own earlier ones do
        other = tokens.clone()
        other[:, :k] = torch.where(reveal[:, :k], (tokens[:, :k] + 1) % V, tokens[:, :k])
        other[:, 2 * k :] = torch.where(reveal[:, 2 * k :], (tokens[:, 2 * k :] + 1) % V, tokens[:, 2 * k :])
        again = denoise(model, xt, None, other, reveal, clean=x1)
        assert torch.allclose(again[:, k : 2 * k], forced[:, k : 2 * k], atol=1e-6)
        first = reveal[:, k : 2 * k].float().argmax(-1)
        row = int((reveal[:, k : 2 * k].sum(-1) >= 2).nonzero()[0])
        own = tokens.clone()
        own[row, k + first[row]] = (tokens[row, k + first[row]] + 1) % V
        changed = denoise(model, xt, None, own, reveal, clean=x1)
        after = reveal[row, k : 2 * k] & (torch.arange(k) > first[row])
        assert (changed[row, k : 2 * k][after] - forced[row, k : 2 * k][after]).abs().max() > 1e-4
        # the cached step of block 1 (the clean block 0 in the cache) is the one pass at block 1
        cache = model.new_cache(3)
        model.extend_cache(cache, x1[:, :k])
        R = reveal[:, k : 2 * k]
        step = model.open_block_step(xt[:, k : 2 * k], None, cache, R)
        prev, rows = torch.full((3,), V), torch.arange(3)
        for i in range(step.size):
            pos, ok = step.positions[:, i], step.valid[:, i]
            assert torch.allclose(step.logits(i, prev)[ok], forced[rows, k + pos][ok], atol=1e-4)
            prev = tokens[rows, k + pos]
