"""Valid upper bounds on −log p^θ_1(x_1) (negative ELBOs), and BPC / perplexity (MATH.md §2).

Every bound is KL(P^{x_1} ‖ P^θ) for one specific model CTMC (MATH.md §2.1), written as
∫_0^1 w(t) E_{x_t ~ p_{t|1}(·|x_1)}[G(t, x_t)] dt and estimated by Monte Carlo over stratified t (§2.4).
Each path names the bounds it admits (`path.bounds`, the first is the default) and supplies w and G
(`path.bound_integrand`); this module only estimates the integral, so it works for any source. Built in:

* masked source, bound "masked" (§2.2): w = κ_t, G = Σ_{i: x_t^i = M} −log m^i_θ(x_1^i | x_t) (carry-over);
* uniform source, bound "reversal" (§2.3 B, default; the bound of the analytic sampler §6.2): w = c_t =
  α̇_t/(Vα_t), G = Σ_i Σ_{y≠x_t^i} D_GKL(r^i_y ‖ ŝ^i_y);
* uniform source, bound "dfm" (§2.3 A; the bound of the Euler sampler §6.1, looser at the optimum):
  w = κ_t, G = Σ_i g^i_t.

A denoiser is any callable (x_t LongTensor[B, L], t FloatTensor[B]) → logits FloatTensor[B, L, V] over
the V clean tokens. Everything here is model-agnostic and free of module state.

Numerics. The weights κ_t (at t = 1) and c_t (at t = 0) diverge while the expected integrands stay finite,
so the per-sequence scalars and the uniform-source terms are computed in float64 (float32 on devices without
float64), and sampled times are mapped into [tiny, 1 − 2^-24] (float32-representable, so the denoiser sees
exactly the t used for the weights). That moves, never drops, the samples of a set of measure ≲ 6e-8; the
integrands are bounded there, so the change is O(1e-7) nats, far below the Monte Carlo error.

Variance. Near t = 1 a corrupted token is rare (probability ~ 1 − α_t) but weighted by κ_t ~ 1/(1 − α_t),
which gives plain sampling a heavy tail. x_t is therefore drawn split on the event "some token corrupted",
with importance weights that keep every estimate unbiased (`_sample_xt`); stratified t does the rest.

For the uniform source both bounds are finite only if the denoiser's mass on tokens other than x_t^i
vanishes like 1 − α_t as t → 1 (as the exact posterior's does, MATH.md §1.3); a denoiser that stays
diffuse at t → 1 has an infinite bound, and its Monte Carlo estimate then has a heavy tail.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from tcsm.core.progress import WorkProgress
from tcsm.core.results import EvalResult, summarise_nats
from tcsm.models.kinds import denoise
from tcsm.paths import ProbabilityPath
from tcsm.paths.bounds import _work_dtype, nelbo_integrand, prior_term, resolve_bound
from tcsm.paths.timesteps import T_MIN, stratified_times

Denoiser = Callable[[Tensor, Tensor], Tensor]


# Largest float32 below 1: sampled times are kept in [T_LO, T_HI] so that neither end is hit exactly.
_T_HI = 1.0 - 2.0**-24


_T_LO = T_MIN


_LN2 = math.log(2.0)


# Tokens of x_t sampled per vectorised draw in `nelbo_terms` (bounds its memory, fixes its random stream).
_SAMPLE_BLOCK = 1 << 20


def _safe_times(t: Tensor) -> Tensor:
    """Round stratified times to float32 and keep them in [tiny, 1 − 2^-24] (see the module docstring)."""
    return t.to(torch.float32).clamp(_T_LO, _T_HI)


def _sample_xt(
    x1: Tensor, t: Tensor, path: ProbabilityPath, generator: torch.Generator | None, cond_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """x_t from p_{t|1}(·|x_1) split on E = {some token is corrupted (masked / changed)}, with the weight [B]
    that keeps E_{x_t}[w(t) G] unbiased (MATH.md §2.4).

    Near t = 1, E is rare while the weight κ_t (or c_t b_t) is large, so plain sampling has a heavy tail.
    The draw picks E with probability q = max(P(E), 1/2) (q = 1 where G = 0 off E: `integrand_zero_at_x1`)
    and returns weight P(E)/q on E, P(not E)/(1 − q) off it: the tail is capped at 2 P(E) κ_t = O(L α̇_t).
    On E, the first corrupted position is drawn from its truncated geometric law and the later ones
    independently; every token keeps exactly its kernel k_t (MATH.md §1.1). With `cond_mask` [B, L] (a prompt)
    the pinned positions stay x_1 and E, its probability and the geometric draw run over the free positions only,
    in their order; without it the draws are those of the free case to the bit.
    """
    B, L = x1.shape
    wd = t.dtype
    pos = torch.arange(L, device=x1.device)
    if cond_mask is None:
        free, n_free, rank = None, torch.full((B,), float(L), dtype=wd, device=x1.device), pos
    else:  # rank: a free position's index among the free ones
        free = ~cond_mask.to(device=x1.device, dtype=torch.bool)
        n_free, rank = free.sum(-1).to(wd), free.long().cumsum(-1) - 1
    e = path.corrupt_prob(t)  # per-token P(x_t^i ≠ x_1^i)
    log_keep = torch.log1p(-e)  # log(1 − e) ≤ 0
    p_event = -torch.expm1(n_free * log_keep)  # P(E) = 1 − (1 − e)^n, accurate when e is tiny
    q = torch.ones_like(p_event) if path.integrand_zero_at_x1 else p_event.clamp_min(0.5)
    u = torch.rand(2, B, generator=generator, device=x1.device, dtype=wd)
    event = u[0] < q
    # First corrupted free position j: P(j) = (1 − e)^j e / P(E), by inverting its CDF (1 − (1 − e)^{j+1}) / P(E).
    j = torch.floor(torch.log1p(-u[1] * p_event) / log_keep)
    j = torch.minimum(torch.nan_to_num(j, nan=0.0, posinf=float(L)), (n_free - 1).clamp_min(0)).clamp_min(0).long()
    later = torch.rand(B, L, generator=generator, device=x1.device, dtype=wd) < e.unsqueeze(-1)
    corrupt = (rank == j.unsqueeze(-1)) | ((rank > j.unsqueeze(-1)) & later)
    corrupt = corrupt & event.unsqueeze(-1) if free is None else corrupt & event.unsqueeze(-1) & free
    xt = torch.where(corrupt, path.corrupt(x1, t, generator), x1)
    weight = torch.where(event, p_event / q, (1.0 - p_event) / (1.0 - q).clamp_min(torch.finfo(wd).tiny))
    return xt, weight


def nelbo_terms(
    denoiser: Denoiser,
    x1: Tensor,
    path: ProbabilityPath,
    *,
    num_t: int = 8,
    generator: torch.Generator | None = None,
    bound: str | None = None,
    chunk_size: int | None = None,
    cond_mask: Tensor | None = None,
    per_block: bool = False,
    t_max: float | None = None,
) -> Tensor:
    """Per-stratum Monte Carlo terms [num_t, B] of the path-space integral (MATH.md §2.4); their mean over
    dim 0 plus `prior_term` is `nelbo`. On a block path they are sums over the blocks' terms (MATH.md §9);
    `per_block=True` keeps them apart: [num_t, B, n_blocks]. Row k uses t ∈ [k/num_t, (k+1)/num_t), so the row-to-row spread gives
    a conservative standard error for the stratified mean.

    The denoiser is called on at most `chunk_size` (x_t, t) rows at a time (default B: one stratum per call,
    i.e. the memory of one forward pass on the batch); the random draws do not depend on `chunk_size`.

    `cond_mask` [B, L] (a prompt, `Batch.cond_mask`): those positions are clean at every t, so the terms estimate
    the bound on −log p^θ(completion | prompt): the path-space KL of MATH.md §2.1 for the processes that hold the
    prompt fixed, estimated as in §2.4. Exact at the exact posterior for the masked source, whose pinned positions
    score nothing; for the uniform source their rate terms (model rate out of a clean position; the reference
    process has none) stay in G, each ≥ 0, so it stays an upper bound.

    `t_max` < 1: the bound of the sampler that stops the time reversal at t_max and draws every free token from
    m^θ(· | x_{t_max}): the integral over [0, t_max] plus E_{x_{t_max}}[−Σ_{free i} log m^θ(x_1^i | x_{t_max})], one
    draw per stratum row (MATH.md §9, "A time-blind denoiser"); finite for a denoiser that stays diffuse at t → 1.
    """
    bound = resolve_bound(path, bound)
    if x1.dim() != 2:
        raise ValueError(f"x1 must be a LongTensor [B, L], got shape {tuple(x1.shape)}")
    if x1.dtype.is_floating_point or x1.dtype == torch.bool:
        raise ValueError(f"x1 must hold integer token ids, got dtype {x1.dtype}")
    if x1.numel() and (int(x1.min()) < 0 or int(x1.max()) >= path.vocab_size):
        raise ValueError(
            f"x1 must hold clean tokens in [0, {path.vocab_size}); the mask is not a clean token"
        )
    if int(num_t) < 1:
        raise ValueError(f"num_t must be >= 1, got {num_t}")
    if cond_mask is not None and tuple(cond_mask.shape) != tuple(x1.shape):
        raise ValueError(f"cond_mask must have x1's shape {tuple(x1.shape)}, got {tuple(cond_mask.shape)}")
    num_t = int(num_t)
    B, L = x1.shape
    device = x1.device
    wd = _work_dtype(device)
    x1 = x1.long()
    chunk = B if chunk_size is None else int(chunk_size)
    if chunk < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    # A block path's bound is the sum of its blocks' bounds (MATH.md §9): each block is a row of its own, at its own
    # stratified time and split draw; the nb blocks of a sequence stay adjacent, so one denoiser call sees them all.
    nb = path.num_blocks(L)
    rows_x1 = x1.reshape(B * nb, L // nb) if L else x1
    rows_cond = None if cond_mask is None else cond_mask.reshape(rows_x1.shape)
    n_rows = rows_x1.shape[0]

    if t_max is not None and not 0.0 < float(t_max) < 1.0:
        raise ValueError(f"t_max must be in (0, 1), got {t_max}")
    span = 1.0 if t_max is None else float(t_max)  # ∫_0^{t_max} f dt = t_max E_{t ~ U(0, t_max)} f
    t32 = _safe_times(span * stratified_times(num_t, n_rows, generator=generator, device=device, dtype=torch.float64))
    if B == 0:
        return torch.empty(num_t, 0, dtype=wd, device=device)
    out: list[Tensor] = []

    pending: list[Tensor] = []  # sampled x_t rows not yet sent to the denoiser, in stratum order
    row_weight = torch.empty(num_t * n_rows, dtype=wd, device=device)
    n_pending, done = 0, 0

    def flush(rows: Tensor) -> None:
        nonlocal done
        n = rows.shape[0]
        tt = t32.reshape(-1)[done : done + n]
        # Row j of the flattened [num_t, n_rows] grid belongs to block row j mod n_rows.
        z = rows_x1[torch.arange(done, done + n, device=device) % n_rows]
        if nb == 1:
            logits = denoise(denoiser, rows, tt, z)
        else:
            logits = denoise(
                denoiser, rows.reshape(n // nb, L), path.position_times(tt.view(n // nb, nb), L), z.reshape(n // nb, L)
            )
            logits = logits.reshape(n, L // nb, -1) if logits.dim() == 3 and logits.shape[1] == L else logits
        if logits.dim() != 3 or logits.shape[:2] != rows.shape or logits.shape[-1] != path.vocab_size:
            raise ValueError(
                f"denoiser must return logits [N, L, V={path.vocab_size}], got shape {tuple(logits.shape)}"
            )
        out.append(span * row_weight[done : done + n] * nelbo_integrand(logits, z, rows, tt, path, bound))
        done += n

    # x_t is drawn for whole groups of strata (a fixed number of tokens, so the random stream does not depend
    # on chunk_size), at the float32 times the denoiser will see, with float64 kernel arithmetic.
    per_draw = max(1, _SAMPLE_BLOCK // max(1, B * L))
    t_rows = t32.reshape(-1).to(wd)
    chunk *= nb
    for k0 in range(0, num_t, per_draw):
        k1 = min(num_t, k0 + per_draw)
        xt_blk, row_weight[k0 * n_rows : k1 * n_rows] = _sample_xt(
            rows_x1.repeat(k1 - k0, 1), t_rows[k0 * n_rows : k1 * n_rows], path, generator,
            None if rows_cond is None else rows_cond.repeat(k1 - k0, 1),
        )
        pending.append(xt_blk)
        n_pending += xt_blk.shape[0]
        while n_pending >= chunk or (k1 == num_t and n_pending > 0):
            rows = torch.cat(pending) if len(pending) > 1 else pending[0]
            take = min(chunk, n_pending)
            flush(rows[:take])
            rest = rows[take:]
            pending = [rest] if rest.shape[0] else []
            n_pending = rest.shape[0]
    terms = torch.cat(out).reshape(num_t, B, nb)
    if t_max is not None:  # drawn after the integral's draws, so the integral's stream is the same with or without
        terms = terms + _reconstruction(denoiser, rows_x1, rows_cond, path, float(t_max), num_t, nb, chunk,
                                        generator).reshape(num_t, B, nb).to(terms.dtype)  # fmt: skip
    return terms if per_block else terms.sum(-1)


def _reconstruction(denoiser, rows_x1, rows_cond, path, t_max, num_t, nb, chunk, generator) -> Tensor:
    """[num_t · n_rows] draws of −Σ_{free i} log m^θ(x_1^i | x_{t_max}), x_{t_max} ~ p_{t_max|1}(·|x_1) with the
    prompt positions clean: the last step of the sampler `t_max` bounds (MATH.md §9, "A time-blind denoiser")."""
    k = rows_x1.shape[1]
    L = k * nb
    z = rows_x1.repeat(num_t, 1)
    t = torch.full((z.shape[0],), t_max, dtype=torch.float32, device=z.device)
    xt = path.draw_xt(z, t, generator)
    cond = None if rows_cond is None else rows_cond.bool().repeat(num_t, 1)
    scored = path.free(xt) if cond is None else path.free(xt) & ~cond
    if cond is not None:
        xt = torch.where(cond, z, xt)
    out = []
    for a in range(0, z.shape[0], chunk):
        xs, zs, ts = xt[a : a + chunk], z[a : a + chunk], t[a : a + chunk]
        m = xs.shape[0]
        logits = denoise(denoiser, xs.reshape(m // nb, L), path.position_times(ts.view(m // nb, nb), L),
                         zs.reshape(m // nb, L)) if nb > 1 else denoise(denoiser, xs, ts, zs)  # fmt: skip
        logp = torch.log_softmax(logits.reshape(m, k, -1).double(), -1).gather(-1, zs.unsqueeze(-1)).squeeze(-1)
        out.append(-(logp * scored[a : a + chunk]).sum(-1))
    return torch.cat(out)


def nelbo(denoiser: Denoiser, x1: Tensor, path: ProbabilityPath, *, cond_mask: Tensor | None = None, **draws) -> Tensor:
    """Per-sequence upper bound on −log p^θ_1(x_1) in nats, FloatTensor[B] (float64 where available): the mean of
    `nelbo_terms` plus `prior_term`, with `draws` its keywords `num_t` (8), `generator`, `bound`, `chunk_size` and
    `t_max`.

    −log p^θ_1(x_1) ≤ KL(p_{0|1} ‖ p_0) + ∫_0^1 w(t) E_{x_t~p_{t|1}}[G] dt (MATH.md §2.1–2.4), estimated
    unbiasedly with `num_t` stratified times per sequence and one x_t ~ p_{t|1}(·|x_1) per time. `bound`:
    one of `path.bounds`; None → its default ("masked" for the masked source, "reversal" (§2.3 B) for the
    uniform one, whose "dfm" selects §2.3 A).
    All randomness comes from `generator`; `chunk_size` bounds the rows per denoiser call. Differentiable
    (no no_grad here). With `cond_mask` (a prompt, never noised) it bounds −log p^θ_1(completion | prompt)
    (see `nelbo_terms`); the prior term, the same for every position, then counts the free positions only.
    """
    if draws.get("per_block"):
        raise TypeError("nelbo sums the blocks' terms; per-block terms come from nelbo_terms(per_block=True)")
    bound = resolve_bound(path, draws.pop("bound", None))
    prior = prior_term(x1, path)  # raises early for a masked source with a clipped start
    if cond_mask is not None and x1.shape[1] > 0:
        prior = prior * (~cond_mask.bool()).sum(-1).to(prior.dtype) / x1.shape[1]
    return nelbo_terms(denoiser, x1, path, bound=bound, cond_mask=cond_mask, **draws).mean(0) + prior


def evaluate_bound(
    denoiser: Denoiser,
    data: Tensor,
    path: ProbabilityPath,
    *,
    batch_size: int = 32,
    num_t: int = 8,
    generator: torch.Generator | None = None,
    bound: str | None = None,
    progress: bool = False,
    chunk_size: int | None = None,
    device=None,
    t_max: float | None = None,
) -> dict:
    """Dataset-level bound: mean over sequences of `nelbo`/L, as nats and bits per token and perplexity,
    with standard errors across sequences (MATH.md §2.4). No gradients; leaves the model's mode alone.

    Returns {"nats_per_token", "nats_per_token_stderr", "bpc", "bpc_stderr", "perplexity",
    "perplexity_stderr", "nats_per_sequence", "bound", "num_sequences", "num_tokens", "num_t"}.
    The stderr combines data and Monte Carlo spread (it is the stderr of the dataset mean).
    """
    bound = resolve_bound(path, bound)
    data = torch.as_tensor(data)
    if data.dim() != 2:
        raise ValueError(f"data must be a LongTensor [N, L], got shape {tuple(data.shape)}")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    N, L = data.shape
    if N == 0 or L == 0:
        raise ValueError("evaluate_bound needs at least one non-empty sequence")
    device = data.device if device is None else torch.device(device)
    starts = range(0, N, int(batch_size))
    bar = WorkProgress(len(starts), f"nelbo[{bound}]", "batches", enabled=progress)
    per_seq, per_block = [], []
    with torch.no_grad():
        for s in starts:
            x1 = data[s : s + int(batch_size)].to(device=device, dtype=torch.long)
            prior = prior_term(x1, path)  # raises before any network call for a masked source with a clipped start
            terms = nelbo_terms(
                denoiser, x1, path, num_t=num_t, generator=generator, bound=bound, chunk_size=chunk_size,
                per_block=True, t_max=t_max,
            ).mean(0)  # [B, n_blocks]
            per_block.append(terms.double().cpu())
            per_seq.append((terms.sum(-1) + prior).double().cpu())
            bar.update(1)
    bar.close()
    result = EvalResult(summarise_nats(torch.cat(per_seq) / L, L, bound), num_t=int(num_t))
    if t_max is not None:  # a different generative process (the reversal stopped at t_max): said with the number
        result.update(bound=f"{bound}@t_max={float(t_max):g}", t_max=float(t_max))
    if path.block_length is not None:  # where in the sequence the nats are paid: bits per token of each block
        blocks = torch.cat(per_block) / (L // path.num_blocks(L))
        result.update(block_length=path.block_length, block_bpc=[round(v, 6) for v in (blocks.mean(0) / _LN2).tolist()])
    return result
