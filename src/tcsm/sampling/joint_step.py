"""The masked ancestral sampler's joint step, for a model with a step head (`ModelKind.offers` "joint_step";
MATH.md §10, "The joint student"): the reveal set R of a step t → s is drawn as the factorised sampler draws it
(each masked position independently with λ_{t→s}, every one at s = 1), and its tokens jointly, left to right over
R, from the model's step conditionals: one denoiser call per step, then one head call per revealed position index
(`JointStep`, keys and values cached). With the uniforms keyed as `samplers.sample` keys them (step k: 2k reveal,
2k + 1 token) a head whose correction is 0 draws the factorised sampler's tokens exactly."""

from __future__ import annotations

import torch
from torch import Tensor

from tcsm.sampling.common import adjust_log_probs, as_grid, inverse_cdf, pinned_positions, row_streams
from tcsm.sampling.samplers import SamplingStats, _prior, in_row_chunks

__all__ = ["joint_reveal", "sample_joint_steps"]


def joint_reveal(model, x: Tensor, t: Tensor, reveal: Tensor, u: Tensor, *, temperature: float = 1.0,
                 top_p: float = 1.0, argmax: bool = False, keep_log_probs: bool = False):  # fmt: skip
    """(x with the positions `reveal` [B, L] set to tokens drawn jointly, head calls, log conditionals [B, L, V]
    float64 at the revealed positions, 0 elsewhere (None unless `keep_log_probs`)). The k-th revealed position of a
    row takes its token by inversion at its uniform u [B, L] (or the argmax) of p(· | x_t, R, tokens drawn before it)."""
    x = x.clone()
    B, L = x.shape
    step = model.open_step(x, t, reveal)
    rows = torch.arange(B, device=x.device)
    V = model.cfg.vocab_size
    prev = torch.full((B,), V, dtype=torch.long, device=x.device)
    kept = torch.zeros(B, L, V, dtype=torch.float64, device=x.device) if keep_log_probs else None
    for k in range(step.size):
        pos, valid = step.positions[:, k], step.valid[:, k]
        lp = adjust_log_probs(step.logits(k, prev), temperature, top_p)
        y = lp.argmax(-1) if argmax else inverse_cdf(lp, u[rows, pos])
        x[rows, pos] = torch.where(valid, y, x[rows, pos])
        if keep_log_probs:
            kept[rows[valid], pos[valid]] = lp[valid]
        prev = y
    return x, step.calls, kept


@torch.no_grad()
def sample_joint_steps(model, path, num: int, length: int, num_steps: int, *, grid="uniform", temperature: float = 1.0,
                       top_p: float = 1.0, final_argmax: bool = False, fixed=None, values=None, generator=None,
                       device=None, callback=None, chunk_size: int | None = None):  # fmt: skip
    """(tokens [num, length], SamplingStats) of the joint K-step sampler of a step-head model on a masked path:
    per step one denoiser call on every row with a masked position, then the joint draw of R (`joint_reveal`).
    `stats.counts["head_calls"]` counts the head's batched calls (one per revealed position index of a step). A
    model whose rows share state with the whole batch (a block model's in-block denoiser over its KV cache, which
    says so by a `batch_rows` method, `sampling.common.denoise_rows`) is called on every row of a step in which any
    row reveals. `chunk_size`: at most this many rows a call, the chunks drawn one after another (each row's draws
    come from its own stream, so the tokens do not change; `callback` is then not taken)."""
    if path.mask_id is None:
        raise ValueError("the joint step reveals masked positions: it needs the masked source")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    B, L = int(num), int(length)
    fixed, values = pinned_positions(fixed, values, B, L, path.vocab_size, device)
    streams = row_streams(generator, B, device)
    host = as_grid(grid.cpu() if isinstance(grid, Tensor) else grid, int(num_steps), "cpu")
    times = host.to(device)
    K = times.numel() - 1
    if chunk_size is not None and int(chunk_size) < B:
        if callback is not None:
            raise ValueError("a callback sees every row at every step: sample in one chunk (chunk_size null)")
        return in_row_chunks(lambda n, rows, pins: sample_joint_steps(
            model, path, n, L, num_steps, grid=grid, temperature=temperature, top_p=top_p, final_argmax=final_argmax,
            generator=rows, device=device, **pins), B, L, chunk_size, streams, fixed, values)  # fmt: skip
    x = torch.where(fixed, values, _prior(path, streams, L))
    stats = SamplingStats(method="ancestral (joint step)", num_steps=K, cached=False, times=times,
                          row_calls=torch.zeros(B, dtype=torch.long, device=device))  # fmt: skip
    stats.counts["head_calls"] = 0
    dtype = torch.get_default_dtype()
    if callback is not None:
        callback(0, float(host[0]), x)
    for k in range(K):
        free = ~fixed & path.free(x)
        u = streams.uniform([2 * k, 2 * k + 1], L)
        last = k == K - 1
        move = free if last else free & (u[:, 0] < path.jump_prob(times[k : k + 1], times[k + 1 : k + 2]))
        rows = move.any(-1).nonzero().squeeze(1)
        if rows.numel() and callable(getattr(model, "batch_rows", None)):  # a shared cache: it runs on every row
            rows = torch.arange(B, device=device)
        if rows.numel():
            t = times[k].to(dtype).expand(rows.numel())
            new, calls, _ = joint_reveal(model, x[rows], t, move[rows], u[rows, 1], temperature=temperature,
                                         top_p=top_p, argmax=last and final_argmax)  # fmt: skip
            x[rows] = new
            stats.num_calls += 1
            stats.num_rows += rows.numel()
            stats.row_calls[rows] += 1
            stats.counts["head_calls"] += calls
        if callback is not None:
            callback(k + 1, float(host[k + 1]), x)
    if (x >= path.vocab_size).any():
        raise RuntimeError("sampler left masks in the output; the time grid must end at t = 1")
    return x, stats
