"""Lossless speculative decoding (MATH.md §6.4): a drafter proposes the next k positions of a reveal order, the
target scores them in one sequential pass, and the speculative rule (accept with min(1, p/q), resample the first
rejection from norm(max(0, p − q)), a bonus position after k acceptances) keeps the output law equal to the target's
one-position-per-step sampler in that order.

The target: a full-sequence masked denoiser (one pass of k+1 rows: row m holds the first m drafts, because a
bidirectional model's pass conditions on every filled-in token), a block model (the same inside each block, the
rows over a cache of the clean blocks before it, repeated per row), or an autoregressive LM (one causal row gives
every conditional). The drafter: the target itself (`SelfDraft`: the conditionals of the row the last pass accepted,
no extra pass), a masked denoiser (`MaskedDraft`: one pass, every draft from it) or an autoregressive LM
(`CausalDraft`: k one-token passes, left to right). Model objects in, nothing read from disk: the builders load a
drafter named by a path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from tcsm.core.errors import ConfigError
from tcsm.models.kinds import kind_of
from tcsm.sampling.common import adjust_log_probs, categorical, pinned_positions
from tcsm.sampling.registry import DrawSettings, Sampler, register_sampler
from tcsm.sampling.rollback_cache import RollbackCache, has_static_cache
from tcsm.sampling.samplers import SamplingStats, _infer_device

__all__ = ["ORDERS", "CausalDraft", "MaskedDraft", "SelfDraft", "Speculative", "SpeculativeSettings", "make_draft",
           "speculative_decode"]

ORDERS = ("random", "left_to_right")


@dataclass
class _Shape:
    """What every part of one decode shares: the vocabulary, the mask id and the conditionals' reshaping."""

    V: int
    mask: int
    temperature: float
    top_p: float

    def log_probs(self, logits: Tensor) -> Tensor:
        return adjust_log_probs(logits[..., : self.V], self.temperature, self.top_p)


def _time(x: Tensor, free_total: Tensor, mask: int, path) -> Tensor:
    """The t at which a row's revealed fraction is clean on the path's schedule (`sampling.decoding`'s rule)."""
    revealed = 1.0 - (x == mask).sum(-1).double() / free_total.double().clamp_min(1)
    t = path.schedule.alpha_inverse(revealed.clamp(0.0, 1.0)).clamp(0.0, 1.0 - 1e-6)
    return t.to(torch.get_default_dtype())


# ------------------------------------------------------------------------------------------------- drafters


class SelfDraft:
    """The target's own conditionals from its last pass, at the row it accepted: given the revealed tokens but the
    last one (which that pass drew). Costs no pass; a region's first round (no memo yet) drafts nothing."""

    needs_memo = True

    def __init__(self):
        self.memo: Tensor | None = None  # [B, n, V] log-probs over the region's positions
        self.has: Tensor | None = None  # [B] rows with a memo

    def reset(self, B: int, device) -> None:
        self.memo, self.has = None, torch.zeros(B, dtype=torch.bool, device=device)

    def propose(self, x, pos, valid, lo, shape, generator, stats):
        B, k = pos.shape
        if self.memo is None:
            return None
        rel = (pos - lo).clamp(0, self.memo.shape[1] - 1)
        lq = self.memo.gather(1, rel.unsqueeze(-1).expand(B, k, self.memo.shape[-1]))
        return categorical(lq, generator), lq, valid & self.has.unsqueeze(1)

    def remember(self, rows: Tensor, lp_all: Tensor) -> None:
        if self.memo is None or self.memo.shape[1] != lp_all.shape[1]:
            self.memo = torch.zeros(self.has.shape[0], *lp_all.shape[1:], dtype=torch.float64, device=lp_all.device)
        self.memo[rows] = lp_all
        self.has[rows] = True


class MaskedDraft:
    """A masked denoiser (smaller, fewer layers): one pass on the current sequence (unrevealed positions masked),
    every draft from that pass's conditionals."""

    needs_memo = False

    def __init__(self, model, path):
        self.model, self.path = model, path

    def reset(self, B, device):
        pass

    def propose(self, x, pos, valid, lo, shape, generator, stats):
        rows = valid.any(-1).nonzero().squeeze(1)
        B, k = pos.shape
        lq = torch.zeros(B, k, shape.V, dtype=torch.float64, device=x.device)
        if rows.numel():
            xr = x[rows]
            free_total = torch.full((rows.numel(),), x.shape[1], device=x.device)
            out = shape.log_probs(self.model(xr, _time(xr, free_total, shape.mask, self.path)))
            lq[rows] = out.gather(1, pos[rows].unsqueeze(-1).expand(-1, k, out.shape[-1]))
            stats.counts["draft_calls"] += 1
            stats.counts["draft_rows"] += rows.numel()
        return categorical(lq, generator), lq, valid


class CausalDraft:
    """An autoregressive LM: the drafts left to right, one position per pass (the next-token logits of the
    sequence with the earlier drafts filled in; unrevealed positions after it are never read). With `cached` (a
    model with a static cache) each pass feeds only the inputs its `RollbackCache` does not hold: one token a
    draft, after the tokens the last round accepted."""

    needs_memo = False
    left_to_right = True

    def __init__(self, model, cached: bool = False):
        self.model, self.cached = model, bool(cached) and has_static_cache(model)
        self.cache: RollbackCache | None = None

    def reset(self, B, device):
        self.cache = None

    def _logits(self, xr, rows, p, live, B, L):
        """Next-token logits [rows, V'] at positions p [rows] of the rows xr of the batch."""
        at = torch.arange(rows.numel(), device=xr.device)
        if not self.cached:
            return self.model(xr)[at, p]
        if self.cache is None:
            self.cache = RollbackCache(self.model, B, L, xr.device)
        x = torch.zeros(B, L, dtype=torch.long, device=xr.device)
        x[rows] = xr
        first = torch.full((B,), L, dtype=torch.long, device=xr.device)
        first[rows] = torch.where(live, p, torch.full_like(p, L))
        logits, start = self.cache.outputs(x, first, first)  # some row is live: at least one output
        return logits[rows, (p - start[rows]).clamp(0, logits.shape[1] - 1)]

    def propose(self, x, pos, valid, lo, shape, generator, stats):
        L = x.shape[1]
        return draft_left_to_right(
            x, pos, valid, shape, generator, stats,
            lambda xr, rows, p, live: self._logits(xr, rows, p, live, x.shape[0], L),
        )  # fmt: skip


def draft_left_to_right(x, pos, valid, shape, generator, stats, next_logits):
    """Drafts of an autoregressive drafter: position by position, each drawn from `next_logits(xr, rows, p, live)`
    (logits [rows, V'] at positions p of the live rows xr, earlier drafts filled in); (tokens, log q, valid)."""
    B, k = pos.shape
    rows = valid.any(-1).nonzero().squeeze(1)
    y = torch.zeros(B, k, dtype=torch.long, device=x.device)
    lq = torch.zeros(B, k, shape.V, dtype=torch.float64, device=x.device)
    if not rows.numel():
        return y, lq, valid
    xr = torch.where(x[rows] >= shape.V, 0, x[rows])
    at = torch.arange(rows.numel(), device=x.device)
    for m in range(k):
        live = valid[rows, m]
        if not live.any():
            break
        p = pos[rows, m]
        lp = shape.log_probs(next_logits(xr, rows, p, live))
        d = categorical(lp, generator)
        y[rows, m], lq[rows, m] = d, lp
        xr[at, p] = torch.where(live, d, xr[at, p])
        stats.counts["draft_calls"] += 1
        stats.counts["draft_rows"] += int(live.sum())
    return y, lq, valid


def make_draft(drafter, path, cached: bool = False):
    """The drafter of a model object (None: the target itself): a causal LM drafts left to right (against its
    static cache with `cached`), a full-sequence denoiser in one pass, an n-gram table from its context;
    ValueError (one line) for anything else."""
    if drafter is None:
        return SelfDraft()
    if hasattr(drafter, "propose"):  # a drafter object already (`tcsm.sampling.ngram.NGramDraft`)
        return drafter
    kind = kind_of(drafter)
    if kind.is_autoregressive:
        return CausalDraft(drafter, cached)
    if kind.is_denoiser and not kind.blocks and kind.sampler == "path":
        return MaskedDraft(drafter, path)
    raise ValueError(f"a drafter must be an autoregressive LM or a full-sequence masked denoiser, not "
                     f"{kind.description} ({type(drafter).__name__})")  # fmt: skip


# ------------------------------------------------------------------------------------------------- targets


class _MaskedTarget:
    """A full-sequence masked denoiser: row m of a pass holds the first m drafts."""

    causal = False

    def __init__(self, model, path):
        self.model, self.path = model, path

    def begin_region(self, x, lo, hi, rows_per_seq):
        pass

    def __call__(self, X: Tensor, need: Tensor, free_total: Tensor, shape: _Shape, lo: int, hi: int, positions):
        """X [B, R, L] → log-probs [B, R, hi − lo, V] at the needed rows (others zero), rows evaluated; `positions`
        [B, R]: the position each row reveals."""
        B, R, _L = X.shape
        flat = X[need]
        ft = free_total.unsqueeze(1).expand(B, R)[need]
        out = shape.log_probs(self.model(flat, _time(flat, ft, shape.mask, self.path))[:, lo:hi])
        full = torch.zeros(B, R, hi - lo, shape.V, dtype=torch.float64, device=X.device)
        full[need] = out
        return full, need.sum(-1)


class _BlockTarget:
    """A block model inside one block: the rows over a cache of the clean blocks before it, repeated per row (the
    cache is filled through the model's `extend_cache`, so it holds B · R rows; its calls count as rows too)."""

    causal = False

    def __init__(self, model, path, stats):
        self.model, self.path, self.stats = model, path, stats
        self.cache, self.R = None, None

    def begin_region(self, x, lo, hi, rows_per_seq):
        B = x.shape[0]
        if self.cache is None:
            self.R = rows_per_seq
            self.cache = self.model.new_cache(B * self.R)
        if self.cache.length < lo:
            self.model.extend_cache(self.cache, x[:, self.cache.length : lo].repeat_interleave(self.R, 0))
            self.stats.counts["cache_calls"] += 1
            self.stats.counts["cache_rows"] += B * self.R

    def __call__(self, X, need, free_total, shape, lo, hi, positions):
        B, R, _L = X.shape
        block = X[:, :, lo:hi].reshape(B * R, hi - lo)
        t = _time(block, free_total.repeat_interleave(R), shape.mask, self.path)
        out = shape.log_probs(self.model.denoise(block, t, self.cache)).reshape(B, R, hi - lo, -1)
        out = torch.where(need[..., None, None], out, torch.zeros((), dtype=out.dtype, device=out.device))
        return out, torch.full((B,), R, dtype=torch.long, device=X.device)  # every row of the repeated cache runs


class _CausalTarget:
    """An autoregressive LM: one row with every draft filled in gives each draft's conditional (causal). With
    `cached` (a model with a static cache) the pass runs against a `RollbackCache` holding the accepted prefix: it
    feeds the last accepted token and the drafts, the outputs at the positions it reveals and no others."""

    causal = True

    def __init__(self, model, cached: bool = False):
        self.model, self.cached = model, bool(cached) and has_static_cache(model)
        self.cache: RollbackCache | None = None
        self.out: Tensor | None = None

    def begin_region(self, x, lo, hi, rows_per_seq):
        self.lo, self.hi, self.device = lo, hi, x.device
        if self.cached:
            B, L = x.shape
            self.cache = RollbackCache(self.model, B, L, x.device)
            self.out = torch.zeros(B, 2 * L + 1, 0, dtype=torch.float64, device=x.device)

    def __call__(self, X, need, free_total, shape, lo, hi, positions):
        B, R, _L = X.shape
        rows = need.any(-1)
        last = X[:, -1]  # the row with every draft: its position j reads x^{<j} only
        if self.cached:
            return self._cached(last, need, shape, positions, rows), rows.long()
        xr = torch.where(last[rows] >= shape.V, 0, last[rows])
        out = shape.log_probs(self.model(xr)[:, lo:hi])
        full = torch.zeros(B, hi - lo, shape.V, dtype=torch.float64, device=X.device)
        full[rows] = out
        return full.unsqueeze(1).expand(B, R, hi - lo, shape.V), rows.long()

    def one(self, row: list[int], first: int, last: int, shape: _Shape) -> tuple[Tensor, int]:
        """Batch 1 on the host: (log-probs [n, V], offset), row j − offset the conditional at position j, fresh for
        first ≤ j ≤ last (the same arithmetic as `__call__`)."""
        ids = [t if t < shape.V else 0 for t in row]
        if self.cached:
            logits, start = self.cache.outputs_list(ids, first, last)
            return shape.log_probs(logits)[0], start
        xr = torch.tensor([ids], device=self.device)
        return shape.log_probs(self.model(xr)[:, self.lo : self.hi])[0], self.lo

    def _cached(self, last, need, shape, positions, rows):
        B, R = need.shape
        L = last.shape[1]
        first = positions[:, 0]
        upto = positions.gather(1, (need.sum(-1, keepdim=True) - 1).clamp_min(0)).squeeze(1)
        logits, start = self.cache.outputs(torch.where(last >= shape.V, 0, last), first, torch.where(rows, upto, -1))
        if self.out.shape[-1] != shape.V:
            self.out = torch.zeros(B, 2 * L + 1, shape.V, dtype=torch.float64, device=last.device)
        if logits.shape[1]:  # the outputs land at their positions; a padded row's scratch ones past its own
            at = start.unsqueeze(1) + torch.arange(logits.shape[1], device=last.device)
            self.out.scatter_(1, at.unsqueeze(-1).expand(-1, -1, shape.V), shape.log_probs(logits))
        return self.out[:, :L].unsqueeze(1).expand(B, R, L, shape.V)


# ------------------------------------------------------------------------------------------------- the loop


def _orders(free: Tensor, order: str, generator) -> tuple[Tensor, Tensor]:
    """(positions [B, n] in reveal order, free ones first, n_free [B]) of a region's free positions: uniformly
    random or left to right."""
    B, n = free.shape
    key = torch.arange(n, dtype=torch.float64, device=free.device).expand(B, n).clone()
    if order == "random":
        key = torch.rand((B, n), dtype=torch.float64, device=free.device, generator=generator)
    key = key.masked_fill(~free, torch.inf)
    return key.argsort(-1), free.sum(-1)


def _region_one(x, lo, hi, ordr, n_free, target, draft, k, shape, free_total, generator, stats, seq_passes):
    """`_region` for one sequence of a causal target, its bookkeeping on the host: the same rule, the same draws
    from the generator in the same order and the same float operations on the same shapes, so the same tokens
    (`host_loop`). The sequence lives in a host list; a round's tensor work is the drafter's, the target's pass,
    the acceptance test of the k drafts and the draw of the next token."""
    dev = x.device
    row, order_list, n, ptr = x[0].tolist(), ordr[0].tolist(), int(n_free[0]), 0
    passes = drafted = accepted = 0
    while ptr < n:
        r = n - ptr
        at = [order_list[min(ptr + m, hi - lo - 1)] for m in range(k + 1)]
        ke = min(k, r)
        y, lq_rows, lqy = _host_draft(draft, x, row, at, ke, k, lo, shape, generator, stats) if k else ([], None, [])
        ke = len(y)
        probe = list(row)  # the row with every draft: position j of the causal pass reads x^{<j} only
        for m in range(ke):
            probe[at[m]] = y[m]
        lp, off = target.one(probe, at[0], at[min(ke, r - 1)], shape)  # fresh rows: positions at[0..min(ke, r−1)]
        passes += 1
        rows_at = [min(max(at[m] - off, 0), lp.shape[0] - 1) for m in range(k + 1)]
        if rows_at == list(range(rows_at[0], rows_at[0] + k + 1)):  # no pinned position in between: a view
            lp = lp[rows_at[0] : rows_at[0] + k + 1]
        else:  # [k+1, V]; rows past the fresh ones are never read
            lp = lp.index_select(0, torch.tensor(rows_at, device=dev))
        a = 0
        if k:
            yt = torch.tensor(y + [0] * (k - ke), device=dev)
            lpy = lp[:k].gather(-1, yt.unsqueeze(-1)).squeeze(-1)
            lqy_t = torch.tensor(lqy + [0.0] * (k - ke), dtype=torch.float64, device=dev)
            u = torch.rand((1, k), dtype=torch.float64, device=dev, generator=generator)
            ok = (u[0] < torch.exp(torch.clamp(lpy - lqy_t, max=0.0))).tolist()
            while a < ke and ok[a]:
                a += 1
        drafted += ke
        accepted += a
        for m in range(a):
            row[at[m]] = y[m]
        if a < r:
            p = lp[a].exp()
            res = p
            if a < ke:  # after a rejection: the residual (p itself where it vanishes)
                res = (p - lq_rows[a].exp()).clamp_min(0.0)
                if float(res.sum()) <= 1e-12:
                    res = p
            row[at[a]] = int(categorical(res.log().unsqueeze(0), generator)[0])
        else:  # every position filled: the draw the tensor loop makes and discards
            torch.rand((1, shape.V), dtype=torch.float64, device=dev, generator=generator)
        ptr += a + (a < r)
    x[0] = torch.tensor(row, device=dev)
    stats.num_calls += passes
    stats.num_rows += passes
    stats.row_calls += passes
    seq_passes += passes
    stats.counts["drafted"] += drafted
    stats.counts["accepted"] += accepted


def _host_draft(draft, x, row, at, ke, k, lo, shape, generator, stats):
    """(drafts y [ke'] as ints, log q rows (row m: [V] of draft m), log q(y_m) as floats) of one round at batch 1:
    from the drafter's host path (`draft_one`) where it has one, else from `propose` on x holding the row."""
    if hasattr(draft, "draft_one"):
        return draft.draft_one(row, at[:ke], k, shape, generator, stats, x.device)
    dev = x.device
    x[0] = torch.tensor(row, device=dev)
    valid = torch.tensor([[m < ke for m in range(k)]], device=dev)
    proposal = draft.propose(x, torch.tensor([at[:k]], device=dev), valid, lo, shape, generator, stats)
    if proposal is None:
        return [], None, []
    y, lq, valid = proposal
    ke = int(valid.sum())
    ys = y[0, :ke].tolist()
    return ys, lq[0], lq[0, torch.arange(ke, device=dev), y[0, :ke]].tolist()


def _region(x, lo, hi, free, target, draft, k, order, shape, free_total, generator, stats, seq_passes,
            host_loop=True):  # fmt: skip
    """Fill the free positions of x[:, lo:hi] speculatively (module docstring)."""
    B, L = x.shape
    dev = x.device
    ordr, n_free = _orders(free[:, lo:hi], order, generator)
    ordr = ordr + lo
    if host_loop and B == 1 and target.causal and not draft.needs_memo:
        draft.reset(B, dev)
        target.begin_region(x, lo, hi, k + 1)
        return _region_one(x, lo, hi, ordr, n_free, target, draft, k, shape, free_total, generator, stats,
                           seq_passes)  # fmt: skip
    ptr = torch.zeros(B, dtype=torch.long, device=dev)
    ar = torch.arange(k + 1, device=dev)
    bidx = torch.arange(B, device=dev)
    draft.reset(B, dev)
    target.begin_region(x, lo, hi, k + 1)
    while True:
        r = n_free - ptr  # positions left per row
        active = r > 0
        if not active.any():
            break
        idx = (ptr.unsqueeze(1) + ar).clamp_max(hi - lo - 1)
        tpos = ordr.gather(1, idx)  # [B, k+1]: the position revealed if row m is the last used
        ke = torch.minimum(torch.full_like(r, k), r).clamp_min(0)
        valid = (ar[:k].unsqueeze(0) < ke.unsqueeze(1)) & active.unsqueeze(1)
        proposal = draft.propose(x, tpos[:, :k], valid, lo, shape, generator, stats) if k else None
        if proposal is None:  # no draft this round: a plain one-position step
            y = torch.zeros(B, k, dtype=torch.long, device=dev)
            lq = torch.zeros(B, k, shape.V, dtype=torch.float64, device=dev)
            valid = torch.zeros_like(valid)
        else:
            y, lq, valid = proposal
        ke = valid.sum(-1)  # drafts are a prefix of the k slots
        need = active.unsqueeze(1) & (ar.unsqueeze(0) <= ke.unsqueeze(1)) & (ar.unsqueeze(0) < r.unsqueeze(1))
        if target.causal:  # one row with every draft (at distinct positions) serves every m
            X = x.clone()
            X[bidx.unsqueeze(1).expand(B, k)[valid], tpos[:, :k][valid]] = y[valid]
            X = X.unsqueeze(1).expand(B, k + 1, L)
        else:
            X = x.unsqueeze(1).repeat(1, k + 1, 1)
            for m in range(1, k + 1):  # row m: the first m drafts filled in
                fill = valid[:, :m]
                cols = tpos[:, :m]
                cur = X[:, m].gather(1, cols)
                X[:, m].scatter_(1, cols, torch.where(fill, y[:, :m], cur))
        lp_all, rows = target(X, need, free_total, shape, lo, hi, tpos)
        stats.num_calls += 1
        stats.num_rows += int(rows.sum())
        stats.row_calls += rows
        seq_passes += active.long()
        rel = (tpos - lo).clamp(0, hi - lo - 1)
        lp = lp_all.gather(2, rel[:, :, None, None].expand(B, k + 1, 1, shape.V)).squeeze(2)  # [B, k+1, V]
        # accept draft m with probability min(1, p/q)
        if k:
            lpy = lp[:, :k].gather(-1, y.unsqueeze(-1)).squeeze(-1)
            lqy = lq.gather(-1, y.unsqueeze(-1)).squeeze(-1)
            u = torch.rand((B, k), dtype=torch.float64, device=dev, generator=generator)
            ok = (u < torch.exp(torch.clamp(lpy - lqy, max=0.0))) & valid
            a = ok.long().cumprod(-1).sum(-1)
        else:
            a = torch.zeros(B, dtype=torch.long, device=dev)
        a = torch.where(active, a, torch.zeros_like(a))
        stats.counts["drafted"] += int(ke.sum())
        stats.counts["accepted"] += int(a.sum())
        # the next token at slot a: the residual norm(max(0, p − q)) after a rejection, row a's p after k acceptances
        p = lp[bidx, a].exp()
        q = torch.zeros_like(p)
        if k:
            q = torch.where((a < ke).unsqueeze(1), lq[bidx, a.clamp_max(k - 1)].exp(), q)
        res = (p - q).clamp_min(0.0)
        res = torch.where(res.sum(-1, keepdim=True) > 1e-12, res, p)
        z = categorical(res.log(), generator)
        extra = active & (a < r)
        if k:  # the accepted drafts: slots m < a, at distinct positions
            take = (ar[:k].unsqueeze(0) < a.unsqueeze(1)) & active.unsqueeze(1)
            x[bidx.unsqueeze(1).expand(B, k)[take], tpos[:, :k][take]] = y[take]
        x[bidx[extra], tpos[extra, a[extra]]] = z[extra]
        ptr = ptr + torch.where(active, a + extra.long(), torch.zeros_like(a))
        if draft.needs_memo:
            keep = extra & (ptr < n_free)
            if keep.any():
                draft.remember(keep, lp_all[bidx[keep], a[keep]])


def speculative_decode(target, path, num: int, length: int, *, drafter=None, draft_length: int = 4,
                       order: str | None = None, temperature: float = 1.0, top_p: float = 1.0,
                       fixed: Tensor | None = None, values: Tensor | None = None, generator=None,
                       device=None, cached: bool = True, host_loop: bool = True) -> tuple[Tensor, SamplingStats]:  # fmt: skip
    """(tokens [num, length], stats) whose law is the target's one-position-per-step sampler's in `order` (random:
    a uniform permutation of the free positions, the law of the `random` decoding order with one position per step;
    left_to_right; None: left to right for an AR target, random otherwise), block by block for a block model
    (MATH.md §6.4). `drafter`: None (the target itself), a masked denoiser, an AR LM, or a drafter object with
    `propose` (`tcsm.sampling.ngram.NGramDraft`), which drafts as it is. `stats.num_calls` counts the sequential
    target passes, `stats.num_rows` the target rows they evaluated, `stats.counts` the drafts proposed and
    accepted, the drafter's calls and rows, and `sequence_passes` (Σ over sequences of the passes each took part in).
    `cached`: an AR target and an AR drafter with a static cache (`new_cache` / `decode`) run against their KV
    caches, rolled back after a rejection (`RollbackCache`), instead of recomputing the prefix on every pass; the
    same draws and the same tokens up to float rounding. `host_loop`: one sequence of an AR target keeps a round's
    bookkeeping on the host (fewer tensor calls per round; the same draws and tokens as the tensor loop)."""
    kind = kind_of(target)
    k = int(draft_length)
    if k < 0:
        raise ValueError(f"draft_length must be >= 0, got {draft_length}")
    V = int(path.vocab_size)
    B, L = int(num), int(length)
    if kind.is_autoregressive:
        order = order or "left_to_right"
        if order != "left_to_right":
            raise ValueError(f"an autoregressive target reveals left to right, not in the {order!r} order")
        if drafter is None:
            raise ValueError("an autoregressive target has no conditionals of later positions to draft from: name a "
                             "drafter (sample.drafter: a small AR run or a masked diffusion run)")  # fmt: skip
    elif not kind.is_denoiser or kind.sampler not in ("path", "blocks") or path.mask_id is None or not path.absorbing:
        raise ValueError(f"speculative decoding verifies masked denoisers and AR LMs, not {kind.description} "
                         f"on a {path.kind} path")  # fmt: skip
    order = order or "random"
    if order not in ORDERS:
        raise ValueError(f"reveal order must be one of {list(ORDERS)}, got {order!r}")
    draft = make_draft(drafter, path, cached)
    if getattr(draft, "left_to_right", False) and order != "left_to_right":
        raise ValueError("an autoregressive drafter proposes left to right: use the left_to_right reveal order")
    device = torch.device(device if device is not None else _infer_device(target, values))
    mask = V if path.mask_id is None else int(path.mask_id)
    fixed, values = pinned_positions(fixed, values, B, L, V, device)
    shape = _Shape(V, mask, float(temperature), float(top_p))
    x = torch.where(fixed, values, torch.full((B, L), mask, dtype=torch.long, device=device))
    stats = SamplingStats(method="speculative", num_steps=k, cached=False, times=torch.empty(0))
    stats.row_calls = torch.zeros(B, dtype=torch.long, device=device)
    stats.counts.update(drafted=0, accepted=0, draft_calls=0, draft_rows=0, cache_calls=0, cache_rows=0)
    seq_passes = torch.zeros(B, dtype=torch.long, device=device)
    if kind.blocks:
        bl = int(target.block_length)
        if L % bl:
            raise ValueError(f"a block model decodes lengths that are multiples of its block length {bl}, got {L}")
        tgt, regions = _BlockTarget(target, path, stats), [(lo, lo + bl) for lo in range(0, L, bl)]
    elif kind.is_autoregressive:
        tgt, regions = _CausalTarget(target, cached), [(0, L)]
    else:
        tgt, regions = _MaskedTarget(target, path), [(0, L)]
    free = ~fixed
    with torch.no_grad():
        for lo, hi in regions:
            if not free[:, lo:hi].any():
                continue
            free_total = free[:, lo:hi].sum(-1) if kind.blocks else free.sum(-1)
            _region(x, lo, hi, free, tgt, draft, k, order, shape, free_total, generator, stats, seq_passes, host_loop)
    if (x >= V).any():
        raise RuntimeError("speculative decoding left masks in the output")
    stats.counts["sequence_passes"] = int(seq_passes.sum())
    return x, stats


# ------------------------------------------------------------------------------------------------- the sampler


@dataclass(frozen=True)
class SpeculativeSettings(DrawSettings):
    drafter: str | None = field(
        default=None,
        metadata={"help": "method=speculative: the drafter, a run / checkpoint directory of an AR LM or a masked "
                          "denoiser, or `ngram` (a table counted for the run: ngram_order, ngram_draws; null: the "
                          "model itself, drafting from its last pass at no extra pass)"},
    )  # fmt: skip
    ngram_order: int = field(
        default=4, metadata={"help": "method=speculative, drafter=ngram: the n-gram's order (order-1 tokens of context)"}
    )
    ngram_draws: int = field(
        default=0,
        metadata={"help": "method=speculative, drafter=ngram: count the n-gram on this many seeded draws of the "
                          "model (an AR run) instead of its training split (0)"},
    )  # fmt: skip
    draft_length: int = field(default=4, metadata={"help": "method=speculative: positions drafted per target pass"})
    kv_cache: bool = field(
        default=True,
        metadata={"help": "method=speculative: verify (and draft with) an AR model against its KV cache, rolled back "
                          "to the accepted prefix after a rejection (false: recompute the prefix on every pass)"},
    )  # fmt: skip
    reveal_order: str | None = field(
        default=None,
        metadata={"help": "method=speculative: random | left_to_right, the order whose one-position-per-step law "
                          "the output has (null: left_to_right for AR models, random otherwise; MATH.md §6.4)"},
    )  # fmt: skip

    def checks(self):
        return [
            *super().checks(),
            (int(self.draft_length) >= 1, f"draft_length must be >= 1, got {self.draft_length}"),
            (int(self.ngram_order) >= 1, f"ngram_order must be >= 1, got {self.ngram_order}"),
            (int(self.ngram_draws) >= 0, f"ngram_draws must be >= 0, got {self.ngram_draws}"),
            (self.reveal_order is None or self.reveal_order in ORDERS,
             f"reveal_order must be one of {list(ORDERS)} or null, got {self.reveal_order!r}"),
        ]  # fmt: skip


@register_sampler
class Speculative(Sampler):
    """Lossless speculative decoding (MATH.md §6.4). A drafter named by `sample.drafter` is loaded by the caller
    (`tcsm.builders.loading.load_drafter`) and handed over as `drafter_model`."""

    name = "speculative"
    help = "lossless speculative decoding: a drafter proposes, the model verifies; the law of one position per step"
    settings_type = SpeculativeSettings
    whole_sequence = True  # decodes a block model's blocks itself, with its cache
    cut_at_eos = True
    replaces_own = True  # an AR run: verifies its AR model instead of the objective's left-to-right sampler

    def __init__(self, settings=None, drafter_model=None):
        super().__init__(settings)
        self.drafter_model = drafter_model

    def __call__(self, model, path, num, length, *, objective=None, generator=None, device=None, fixed=None,
                 values=None, callback=None, chunk_size=None, record_steps=None):  # fmt: skip
        s = self.settings
        if s.final_argmax:
            raise ConfigError("sample.final_argmax changes the law speculative decoding keeps: leave it false")
        if record_steps is not None:
            raise ConfigError("method=speculative keeps no trajectory: leave out record_steps")
        if s.drafter and self.drafter_model is None:
            raise ConfigError(f"sample.drafter={s.drafter} is a directory the caller loads (tcsm sample, tcsm eval "
                              "--genppl); this caller passed no drafter model")  # fmt: skip
        try:
            return speculative_decode(
                model, path, num, length, drafter=self.drafter_model, draft_length=s.draft_length,
                order=s.reveal_order, temperature=s.temperature, top_p=s.top_p, fixed=fixed, values=values,
                generator=generator, device=device, cached=s.kv_cache,
            )  # fmt: skip
        except ValueError as e:
            raise ConfigError(f"method=speculative: {e}") from None
