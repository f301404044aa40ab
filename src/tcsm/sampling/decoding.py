"""Decoding orders for masked models (MATH.md §6): which masked positions a step unmasks, and how many.

The path samplers (`tcsm.sampling.samplers`) reveal every masked position independently with probability λ. The
samplers here choose the positions instead, from the denoiser's conditionals m^i = softmax(logits^i / T) (top-p
truncated) at the masked positions, and draw the revealed tokens x̂^i ~ m^i:

* ``"random"``: a uniformly random subset (MaskGIT's order with random scores).
* ``"confidence"``: the positions whose drawn token is most probable, m^i(x̂^i) (LLaDA's low-confidence remasking).
* ``"margin"``: the largest gap m^i(top 1) − m^i(top 2).
* ``"entropy"``: the lowest entropy H(m^i).
* ``"threshold"`` (Fast-dLLM): every position with m^i(x̂^i) > `threshold`, and at least the most confident one;
  the number of steps follows from the threshold, capped at `num_steps` (the capped last step of a region reveals
  every position still masked, as the last step of the counted orders does).
* ``"ancestral"``: the path sampler's law (each masked position revealed with probability λ_{t→s}) — useful
  inside blocks, where it is BD3-LM's sampler.

The count schedule: a region with M masked positions at its start unmasks c_{k+1} − c_k positions at step k, with
c_k = round(M·a_k) and a_k = (α(t_k) − α(t_0)) / (α(1) − α(t_0)) on the time grid (uniform grid, linear α: an even
split, LLaDA's schedule); a step with nothing to unmask makes no network call.

Ties in the scores (equal to `TIE_DECIMALS` decimals: e.g. every position of an all-mask input whose
conditionals agree) are broken uniformly at random, not toward the left: a leftmost rule would reveal positions
0, 1, … at the first step of every sequence and then proceed in adjacent, mutually dependent pairs.

The denoiser's time: a row with a fraction r of its free positions revealed is evaluated at t = α^{-1}(r), the
time at which that fraction is clean in expectation on the path's schedule (the fraction itself is that time only
for linear α; a time-conditioned model on a cosine schedule would otherwise see the wrong t).

Which are exact: with the exact denoiser and one position per step (K = L, T = 1, top-p = 1), "random", "margin"
and "entropy" draw exactly from p_1: the position chosen at each step is a function of the tokens revealed so far
(or of independent noise), so the draw is the chain rule of p_1 in an adaptive order. "confidence" and "threshold"
choose the position after seeing the draws, which favours likely tokens: they are heuristics even then (the tests
measure the bias). Several positions per step add the usual factorization error to every order.

Semi-autoregressive blocks (`block_length`, LLaDA / BD3-LM): the sequence is cut into L / block_length blocks
decoded left to right, each with its share of the steps and any of the orders above; later blocks stay masked
while earlier ones are clean. A full-sequence denoiser attends bidirectionally, so a clean prefix's activations
depend on the masks after it: there is no exact per-block key/value cache to reuse, and none is approximated (a block
model has one and is decoded by `tcsm.sampling.blocks`). A time-independent denoiser's output is reused while a row does not change (the MDLM cache), which
only saves calls for "ancestral" steps that reveal nothing.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from tcsm.paths import ProbabilityPath
from tcsm.sampling.common import (
    RowStreams,
    adjust_log_probs,
    as_grid,
    denoise_rows,
    inverse_cdf,
    pinned_positions,
    row_streams,
)
from tcsm.sampling.engine import resolve_engine
from tcsm.sampling.samplers import SamplingStats, _infer_device

__all__ = ["COUNTED", "DECODERS", "TIE_DECIMALS", "check_decoding", "count_schedule", "decode"]

DECODERS = ("random", "confidence", "margin", "entropy", "threshold")
#: orders whose per-step count comes from the schedule (at least one position per step)
COUNTED = ("random", "confidence", "margin", "entropy")
#: scores equal to this many decimals are ties (float32 logits carry about 7 significant digits)
TIE_DECIMALS = 6


def check_decoding(
    method: str, length: int, num_steps: int, block_length: int | None, threshold: float
) -> int:
    """Validate a decoding request; returns the number of blocks. Raises ValueError with a one-line message."""
    if method not in DECODERS + ("ancestral",):
        raise ValueError(
            f"unknown decoding order {method!r}; choose one of {list(DECODERS + ('ancestral',))}"
        )
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    block = length if block_length is None else int(block_length)
    if block < 1 or length % block:
        raise ValueError(f"the semi-autoregressive block length {block_length} does not divide the sample length {length}")
    blocks = length // block
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if method in COUNTED and num_steps > length:
        raise ValueError(
            f"{num_steps} steps for {length} positions: the {method!r} order unmasks at least one position per "
            "step, so steps must be <= the sample length"
        )
    return blocks


def count_schedule(masked: Tensor, grid: Tensor, path: ProbabilityPath) -> Tensor:
    """[B, K] positions to unmask per step: c_{k+1} − c_k with c_k = round(M·a_k), a_k the normalised α on `grid`."""
    alpha = path.schedule.alpha(grid.double())
    a = (alpha - alpha[0]) / (alpha[-1] - alpha[0])
    c = torch.round(masked.double().unsqueeze(1) * a.to(masked.device).unsqueeze(0)).long()
    c[:, -1] = masked
    return c[:, 1:] - c[:, :-1]


def _scores(method: str, lp: Tensor, drawn: Tensor, uniform) -> Tensor:
    """Each position's score; `uniform()` gives the random order's uniforms [B, positions]."""
    if method == "random":
        return uniform()
    if method in ("confidence", "threshold"):
        return lp.gather(-1, drawn.unsqueeze(-1)).squeeze(-1).exp()
    p = lp.exp()
    if method == "margin":
        top = p.topk(min(2, p.shape[-1]), dim=-1).values
        return top[..., 0] - (top[..., 1] if top.shape[-1] > 1 else 0.0)
    if method == "entropy":
        return (p * lp.clamp_min(-1e30)).sum(-1)  # −H(m^i): 0 · log 0 counts as 0
    raise ValueError(f"no score for {method!r}")


def _top_n(scores: Tensor, eligible: Tensor, n: Tensor, u: Tensor) -> Tensor:
    """Per row, the n[row] eligible positions of highest score; scores equal to `TIE_DECIMALS` decimals are
    ties, broken uniformly at random (the rounded score is an integer, the uniform u in (0, 1) orders within it)."""
    key = torch.round(scores.double() * 10.0**TIE_DECIMALS)
    key = key + u
    s = key.masked_fill(~eligible, -torch.inf)
    order = s.argsort(dim=-1, descending=True)
    rank = torch.empty_like(order).scatter_(
        -1, order, torch.arange(s.shape[-1], device=s.device).expand_as(order)
    )
    return eligible & (rank < n.unsqueeze(-1))


def _times(path: ProbabilityPath, x: Tensor, free_total: Tensor) -> Tensor:
    """The denoiser's time of each row of x: t = α^{-1}(r), r the fraction of the row's free positions revealed."""
    revealed = 1.0 - (x == path.mask_id).sum(-1).double() / free_total
    t = path.schedule.alpha_inverse(revealed.clamp(0.0, 1.0))  # the t at which that fraction is clean
    return t.clamp(0.0, 1.0 - 1e-6).to(torch.get_default_dtype())


def _pick(method: str, lp: Tensor, drawn: Tensor, eligible: Tensor, u: Tensor, n, move, last: bool,
          threshold: float) -> Tensor:  # fmt: skip
    """The eligible positions of a region that a step reveals, from the conditionals lp, the drawn tokens and the
    step's uniforms u [B, 4, region] (2: the random order's, 3: the ties'); n [B] the counted orders' counts, move
    the ancestral reveal."""

    def order():
        return u[:, 2]

    if method in COUNTED:
        return _top_n(_scores(method, lp, drawn, order), eligible, n, u[:, 3])
    if method == "ancestral":
        return move & eligible
    if last:  # the step cap: what is still masked is revealed now
        return eligible
    conf = _scores(method, lp, drawn, order).masked_fill(~eligible, -1.0)
    pick = (conf > threshold) & eligible
    return pick | _top_n(conf, eligible, eligible.any(-1).long(), u[:, 3])


def _dense_order_step(denoiser, path, x, free_total, u, n, lam, taken, *, lo: int, hi: int, method: str,
                      temperature: float, top_p: float, threshold: float, final_argmax: bool,
                      last: bool) -> tuple[Tensor, Tensor]:  # fmt: skip
    """One step of the region [lo, hi) on every row of x [B, L]: the denoiser on every row, the tokens drawn at
    the uniforms u [B, 4, L] (the reveal's, the token's, the random order's, the ties'), the reveal by dense
    selects; n [B] the counted orders' counts of this step, lam [1] the ancestral reveal probability. Returns
    (x after the step, `taken` + 1 when a position of the region was still masked). A function of tensors only,
    with no host read: the engine captures it whole (`capture_step`)."""
    B, L = x.shape
    open_ = x[:, lo:hi] == path.mask_id
    rows = open_.any(-1) & (n > 0) if method in COUNTED else open_.any(-1)
    out = denoiser(x, _times(path, x, free_total))
    if out.shape != (B, L, path.vocab_size):
        raise ValueError(f"denoiser returned shape {tuple(out.shape)}, expected {(B, L, path.vocab_size)}")
    lp = adjust_log_probs(out[:, lo:hi], temperature, top_p)
    u = u[..., lo:hi]
    drawn = lp.argmax(-1) if (last and final_argmax) else inverse_cdf(lp, u[:, 1])
    move = open_ & (u[:, 0] < lam) if method == "ancestral" else None
    pick = _pick(method, lp, drawn, open_ & rows.unsqueeze(-1), u, n, move, last, threshold)
    x = x.clone()
    x[:, lo:hi] = torch.where(pick, drawn, x[:, lo:hi])
    return x, taken + open_.any()


def decode(
    denoiser,
    path: ProbabilityPath,
    *,
    batch_size: int,
    length: int,
    num_steps: int,
    method: str = "confidence",
    grid="uniform",
    temperature: float = 1.0,
    top_p: float = 1.0,
    threshold: float = 0.1,
    block_length: int | None = None,
    final_argmax: bool = False,
    time_independent: bool = False,
    fixed: Tensor | None = None,
    values: Tensor | None = None,
    generator: torch.Generator | None = None,
    device=None,
    callback=None,
    engine: str | None = None,
) -> tuple[Tensor, SamplingStats]:
    """Draw `batch_size` sequences of `length` tokens from a masked model by unmasking positions in the order
    `method` (module docstring), `num_steps` steps in all, block by block when `block_length` is given.
    `fixed` / `values` [B, L] pin positions (prompts, infilling) from the start. Returns (tokens, stats) with
    `stats.num_calls` the batched denoiser calls, `stats.row_calls` [B] the evaluations of each sequence,
    `stats.steps_taken` the steps that had a position to reveal (a device count; threshold's `stats.num_steps` is
    it, read once at the end, except in a block decoder's blocks: `caller_checks`).

    With the decode engine (`engine` resolving to "graph", or a denoiser with `static_rows`: the engine's block
    calls) the step loop reads no device value on the host: every step calls the denoiser on every row and updates
    by dense selects, a region runs all its steps (a step with nothing left to reveal changes nothing), and the
    steps a region really took are counted on the device. Inside a block decoder (a denoiser with `caller_checks`)
    neither the pins nor the output are checked again, so a block reads nothing on the host. The draws are keyed by
    (block, step, position), so the tokens are those of the eager loop, which evaluates only the rows that need it
    and stops a region early. A denoiser that captures whole steps (`capture_step`: the engine's block calls)
    replays each dense step — the call, the draws, the reveal (`_dense_order_step`) — as one captured graph, one per
    step kind (inner, last); `stats.counts["captured_steps"]` counts them."""
    if path.mask_id is None or not path.absorbing:
        raise ValueError(
            f"decoding order {method!r} unmasks positions: it needs a masked path, not {path.kind!r}"
        )
    B, L, K = int(batch_size), int(length), int(num_steps)
    nb = check_decoding(method, L, K, block_length, threshold)
    if not temperature > 0 or not 0.0 < top_p <= 1.0:
        raise ValueError(f"temperature must be > 0 and top_p in (0, 1], got {temperature}, {top_p}")
    device = torch.device(device if device is not None else _infer_device(denoiser, values))
    V, mask = path.vocab_size, path.mask_id
    # the block decoder checks the pins it hands an in-block sampler, and its output, once per decode
    caller_checks = bool(getattr(denoiser, "caller_checks", False))
    fixed, values = pinned_positions(fixed, values, B, L, V, device, checked=caller_checks)
    streams = row_streams(generator, B, device)
    x = torch.where(fixed, values, torch.full((B, L), mask, dtype=torch.long, device=device))
    bl = L // nb
    dense = bool(getattr(denoiser, "static_rows", False)) or resolve_engine(engine, device) == "graph"
    if dense and nb == 1:  # one region runs all its steps without a host read: wholly pinned, they change nothing
        todo = [0]
    else:  # blocks that are wholly pinned (a prompt) need no steps; the others share the K steps (one host read)
        free_blocks = (~fixed).view(B, nb, bl).any(-1).any(0).tolist()
        todo = [b for b in range(nb) if free_blocks[b]]
    if K < len(todo):
        raise ValueError(f"{K} steps for {len(todo)} blocks to decode: every block needs at least one step")
    steps_per_block = {b: K // len(todo) + (j < K % len(todo)) for j, b in enumerate(todo)}
    stats = SamplingStats(method=method, num_steps=K, cached=time_independent, times=as_grid(grid, K, device))
    stats.row_calls = torch.zeros(B, dtype=torch.long, device=device)
    cache = torch.empty(0)
    valid = torch.zeros(B, dtype=torch.bool, device=device)
    free_total = (~fixed).sum(-1).clamp_min(1)
    step = 0
    taken = torch.zeros((), dtype=torch.long, device=device)  # the steps that had a position to reveal
    # the engine's block denoiser replays the whole dense step (its call, the draws, the update) as one captured graph
    capture = getattr(denoiser, "capture_step", None) if dense else None
    if dense:  # the captured step's inputs of the orders without counts, or without a reveal probability
        no_count, no_lam = torch.zeros(B, dtype=torch.long, device=device), torch.ones(1, dtype=torch.float64, device=device)
    if callback is not None:
        callback(0, 0.0, x)

    def call(rows: Tensor):
        nonlocal cache
        need = rows & ~valid if time_independent else rows
        if need.any():
            idx = need.nonzero().squeeze(1)
            out = denoise_rows(denoiser, x, idx, _times(path, x[idx], free_total[idx]))
            if out.shape != (idx.numel(), L, V):
                raise ValueError(
                    f"denoiser returned shape {tuple(out.shape)}, expected {(idx.numel(), L, V)}"
                )
            if cache.shape != (B, L, V):
                cache = torch.zeros(B, L, V, dtype=out.dtype, device=device)
            cache[idx] = out
            valid[idx] = True
            stats.num_calls += 1
            stats.num_rows += idx.numel()
            stats.row_calls[idx] += 1

    with torch.no_grad():
        for b in todo:
            lo, hi = b * bl, (b + 1) * bl
            region = torch.zeros(B, L, dtype=torch.bool, device=device)
            region[:, lo:hi] = True
            Kb = steps_per_block[b]
            g = as_grid(grid, max(Kb, 1), device)
            counts = count_schedule(((x == mask) & region).sum(-1), g, path) if method in COUNTED else None
            gb = streams.fork(b)  # step k of block b: uniforms of the reveal, the tokens, the random order, the ties
            if method == "ancestral":  # λ of every step (1 at the last: it reveals every position still masked)
                lams = torch.cat([path.jump_prob(g[j].reshape(1), g[j + 1].reshape(1)) for j in range(Kb - 1)]
                                 + [torch.ones(1, dtype=torch.float64, device=device)]).double()  # fmt: skip
                if not dense:
                    lams = lams.tolist()  # read on the host once per block
            elif dense:
                lams = no_lam.expand(Kb)
            keys = torch.arange(4 * Kb, device=device).view(Kb, 4) if dense else None
            k = 0
            while True:
                open_ = None if dense else (x == mask) & region
                if k >= Kb or not (dense or open_.any()):
                    break
                last = k == Kb - 1
                n = counts[:, k] if method in COUNTED else (no_count if dense else None)
                if dense:
                    fn = functools.partial(_dense_order_step, lo=lo, hi=hi, method=method, temperature=temperature,
                                           top_p=top_p, threshold=threshold, final_argmax=final_argmax, last=last)
                    graph = None if capture is None else capture(
                        ("order", id(path), method, temperature, top_p, threshold, final_argmax, lo, hi, last),
                        lambda x, free_total, key, n, lam, taken, base, fn=fn: fn(
                            denoiser.raw, path, x, free_total, RowStreams.of_base(base).uniform(key, L), n, lam, taken))  # fmt: skip
                    if graph is not None:  # its outputs are static: read before the next step, cloned at the end
                        x, taken = graph(x, free_total, keys[k], n, lams[k : k + 1], taken, gb.base)
                        stats.counts["captured_steps"] = stats.counts.get("captured_steps", 0) + 1
                    else:
                        x, taken = fn(denoiser, path, x, free_total, gb.uniform(keys[k], L), n, lams[k : k + 1], taken)
                    stats.num_calls += 1
                    stats.num_rows += B
                    stats.row_calls += 1
                else:
                    u = gb.uniform(range(4 * k, 4 * k + 4), L)
                    rows = open_.any(-1) & (n > 0) if method in COUNTED else open_.any(-1)
                    if rows.any():
                        call(rows)
                        lp = adjust_log_probs(cache[:, lo:hi], temperature, top_p)
                        ur = u if lo == 0 and hi == L else u[..., lo:hi]
                        drawn = lp.argmax(-1) if (last and final_argmax) else inverse_cdf(lp, ur[:, 1])
                        move = open_[:, lo:hi] & (ur[:, 0] < lams[k]) if method == "ancestral" else None
                        eligible = open_[:, lo:hi] & rows.unsqueeze(-1)
                        pick = _pick(method, lp, drawn, eligible, ur, n, move, last, threshold)
                        x[:, lo:hi] = torch.where(pick, drawn, x[:, lo:hi])
                        valid &= ~pick.any(-1)
                k += 1
                step += 1
                if callback is not None:
                    callback(step, min(1.0, step / max(K, 1)), x)
    if not caller_checks and (x >= V).any():
        raise RuntimeError("decoding left masks in the output")
    stats.steps_taken = taken if dense else torch.tensor(step, device=device)
    if method == "threshold" and not caller_checks:  # its steps follow from the threshold (at most num_steps)
        stats.num_steps = int(taken) if dense else step
    return (x.clone() if "captured_steps" in stats.counts else x), stats
