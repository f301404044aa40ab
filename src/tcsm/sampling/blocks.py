"""Decoding a block model block by block with its exact KV cache (BD3-LM's sampler; the block path, MATH.md §9).

A block model (`kind_of(model).blocks`) denoises block b from x_t^b and the clean blocks before it. `decode_blocks`
cuts a sequence into blocks of k = `model.block_length` positions and draws them left to right, in lockstep over the
batch: block b is drawn by any registered in-block sampler (`inner`: ancestral, analytic, euler, or a decoding order)
run on the k positions alone, with the denoiser x_t^b ↦ `model.denoise(x_t^b, t, cache)`, the cache holding the clean
blocks before b; a drawn block then joins the cache (`model.extend_cache`). The cache computes exactly what the
one-pass forward computes for the clean prefix, so block b follows the in-block sampler's law given its prefix, and an
in-block sampler that is exact per block (one position per step in a revealed-only order, exact conditionals) draws
from p_1 by the chain rule over blocks. `sample.steps` is the number of steps per block.

Pinned positions (`fixed` / `values`: prompts, infilling) are clean tokens. A block pinned for every row is not
denoised, and consecutive finished or pinned blocks enter the cache in one call, right before the next block that
is drawn; a block pinned only for some rows or positions is drawn with those positions pinned inside it. Prompts of
different lengths share positions 0, 1, … (left-aligned, no padding), so a row's conditional reads its own prefix
only, whatever the other rows' prompt lengths.

Variable length: with `eos_id`, a row stops after the block in which it generated `eos_id` — every free position
after its first generated `eos_id` becomes `eos_id` — and decoding ends when every row has stopped.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor

from tcsm.models.kinds import JOINT_STEP_DENOISER, kind_of
from tcsm.sampling.common import as_grid, pinned_positions, row_streams
from tcsm.sampling.engine import StepGraph, autocast_weight_cache, resolve_engine
from tcsm.sampling.samplers import SamplingStats, _infer_device, may_cache

__all__ = ["BlockDecodeSettings", "CachedBlockDenoiser", "CachedJointBlockDenoiser", "check_block_model",
           "decode_blocks"]


@dataclass(frozen=True)
class BlockDecodeSettings:
    """The `sample:` keys of block decoding itself (the in-block sampler brings its own)."""

    eos_id: int | None = field(
        default=None,
        metadata={"help": "block models: stop a sequence after the block where it generates this token id, every "
                          "later free position set to it (null: always the full length)"},
    )  # fmt: skip

    def __post_init__(self):
        e = self.eos_id
        if e is not None and (isinstance(e, bool) or int(e) != e or int(e) < 0):
            raise ValueError(f"eos_id must be a token id >= 0 or null, got {e!r}")


def check_block_model(model, inner=None) -> int:
    """The block length k of a block model that `inner` may decode; ValueError (one line) for a model without a
    block-causal KV cache or an in-block sampler that does not fit one block."""
    if not kind_of(model).blocks:
        raise ValueError(
            f"block decoding reads a block-causal KV cache, and a {type(model).__name__} is a full-sequence model: "
            "sample it with a path sampler or decoding order (no cache)"
        )
    k = int(model.block_length)
    if inner is None:
        return k
    if getattr(inner, "own", False) or inner.name == "joint":
        raise ValueError(
            f"a block model is decoded block by block with its KV cache; the {inner.name!r} sampler draws whole "
            "sequences: choose sample.method among ancestral, analytic, euler, random, confidence, margin, entropy, "
            "threshold"
        )
    s = inner.settings
    if getattr(s, "semi_ar_block", None) is not None:
        raise ValueError(
            f"sample.semi_ar_block={s.semi_ar_block} is the uncached block decoding of full-sequence models; a block "
            f"model decodes its own blocks of {k} with its KV cache: leave sample.semi_ar_block null"
        )
    if inner.steps_at_most_positions and int(s.steps) > k:
        raise ValueError(
            f"sample.steps={s.steps} is the number of steps per block, and the {inner.name!r} order reveals at least "
            f"one position per step: choose steps <= the model's block length {k}"
        )
    return k


class CachedBlockDenoiser:
    """The in-block denoiser of one block over the batch's cache: (x_t^b, t) ↦ `model.denoise(x_t^b, t, cache)`.
    The cache is shared by the whole batch, so an in-block sampler that evaluates some rows only gets them through
    `batch_rows` (`tcsm.sampling.common.denoise_rows`): the model runs on the whole batch, the rows are returned."""

    #: read by the in-block samplers: `decode_blocks` checks the pinned values it hands them once before the first
    #: block and the output once after the last, so they read nothing on the host to check them
    caller_checks = True

    def __init__(self, model, cache, time_independent: bool, graph=None, steps: dict | None = None):
        self.model, self.cache = model, cache
        #: read by `may_cache`: the in-block sampler may reuse a row's output while its block is unchanged
        self.time_independent = bool(time_independent)
        #: the engine's captured `denoise` (`sampling.engine.StepGraph`) when the cache has fixed shapes
        self.graph = graph
        #: read by the path samplers: every call evaluates the whole batch at one shape, so they call it on every
        #: row at every step and update densely, without reading device values on the host
        self.static_rows = graph is not None
        self._steps = steps  # the decode's captured whole steps, shared by its blocks: {key: StepGraph}

    def raw(self, xt: Tensor, t: Tensor) -> Tensor:
        """`model.denoise` on the cache, uncaptured: what a captured step calls inside its graph."""
        return self.model.denoise(xt, t, self.cache)

    def capture_step(self, key, fn):
        """The engine's `StepGraph` of a sampler's whole step `fn` (its `raw` call, its draws, its update: a
        function of static tensors, the same for every block of the decode), one per `key`, captured once per
        decode and shape; None without the engine. The in-block samplers call it instead of `__call__`."""
        if self.graph is None or self._steps is None:
            return None
        graph = self._steps.get(key)
        if graph is None:
            graph = self._steps[key] = StepGraph(fn, self.graph.device, strict=self.graph.strict,
                                                 preserve=self.graph.preserve)  # fmt: skip
        return graph

    def _denoise(self, xt: Tensor, t) -> Tensor:
        if self.graph is None:
            return self.model.denoise(xt, t, self.cache)
        t = torch.as_tensor(t, dtype=torch.float32, device=xt.device).reshape(-1).expand(xt.shape[0])
        return self.graph(xt, t)  # static output: the callers index or copy it before the next call

    def __call__(self, xt: Tensor, t: Tensor) -> Tensor:
        out = self._denoise(xt, t)
        return out if self.graph is None else out.clone()

    def batch_rows(self, x: Tensor, rows: Tensor, t: Tensor) -> Tensor:
        """Logits [len(rows), k, V] of the rows `rows` of the block batch x [B, k] at their times t [len(rows)]."""
        t = torch.as_tensor(t, device=x.device).reshape(-1).expand(rows.numel())
        t_all = t[:1].expand(x.shape[0]).clone()  # the other rows' outputs are discarded: any valid time will do
        t_all[rows] = t
        return self._denoise(x, t_all)[rows]


class CachedJointBlockDenoiser(CachedBlockDenoiser):
    """The in-block denoiser of a block model with a step head (MATH.md §9, §10): to the in-block sampler one block of
    one sequence is a full-sequence model with a step head, so its masked ancestral steps draw their revealed tokens
    jointly (`sampling.joint_step`), each step one `denoise` call on the cache and the head over the block. Its calls
    run eagerly on the whole batch (the joint step reads each step's reveal count on the host)."""

    model_kind = replace(JOINT_STEP_DENOISER, offers=frozenset({"joint_step"}))  # its calls take no `at`

    def __init__(self, model, cache, time_independent: bool):
        super().__init__(model, cache, time_independent)
        self.cfg = model.cfg

    def open_step(self, xt: Tensor, t: Tensor, reveal: Tensor):
        return self.model.open_block_step(xt, t, self.cache, reveal)


def decode_blocks(model, path, inner, num: int, length: int, *, fixed: Tensor | None = None,
                  values: Tensor | None = None, generator: torch.Generator | None = None, device=None,
                  eos_id: int | None = None, callback=None) -> tuple[Tensor, SamplingStats]:  # fmt: skip
    """(tokens [num, length], stats) drawn block by block (module docstring) with the in-block sampler `inner`.
    `fixed` / `values` [num, length] pin positions; `callback(step, t, x)` sees x [num, length] after every in-block
    step (undrawn positions hold the path's mask id, or 0 without one). `stats.num_calls` counts `denoise` calls,
    `stats.counts["cache_calls"]` the `extend_cache` calls, `stats.counts["blocks"]` the blocks drawn,
    `stats.counts["captured_steps"]` (engine only) the in-block steps run as one captured step (call, draws, update),
    `stats.counts["head_calls"]` (a step head) the head's batched calls,
    `stats.steps_taken` (decoding orders) the in-block steps that had a position to reveal, a device count. Under the
    engine the host reads a device value before the first block and after the last only. A model with a step head
    (`offers` "joint_step") is decoded eagerly, its in-block steps joint (`CachedJointBlockDenoiser`)."""
    k = check_block_model(model, inner)
    B, L = int(num), int(length)
    if B < 1 or L < 1 or L % k:
        raise ValueError(f"block decoding needs a length that is a positive multiple of the model's block length {k}, "
                         f"got {L} (and {B} sequences)")  # fmt: skip
    if path.block_length is not None and int(path.block_length) != k:
        raise ValueError(
            f"path.block_length={path.block_length} but the model's blocks have {k} positions: make them equal"
        )
    V = path.vocab_size
    if eos_id is not None and not 0 <= int(eos_id) < V:
        raise ValueError(f"eos_id {eos_id} is not a token id of the {V}-token vocabulary")
    device = torch.device(device if device is not None else _infer_device(model, values))
    fixed, values = pinned_positions(fixed, values, B, L, V, device)
    streams = row_streams(generator, B, device)  # block b of a row is drawn from its stream forked by b

    block_path = copy.copy(path)  # the in-block sampler sees one block of one sequence: no block structure inside
    block_path.block_length = None
    time_independent = may_cache(model, path)
    filler = path.mask_id if path.mask_id is not None else 0
    x = torch.where(fixed, values, torch.full((B, L), filler, dtype=torch.long, device=device))
    stopped = torch.zeros(B, dtype=torch.bool, device=device)
    eos = torch.full((B, k), filler if eos_id is None else int(eos_id), dtype=torch.long, device=device)
    K = int(inner.settings.steps)
    joint = "joint_step" in kind_of(model).offers  # a step head: the joint in-block step, eager
    stats = SamplingStats(method=f"blocks+{inner.name}" + (" (joint step)" if joint else ""), num_steps=K,
                          cached=time_independent and not joint,
                          times=as_grid(inner.settings.grid, K, device))  # fmt: skip
    stats.counts.update(blocks=0, cache_calls=0)
    step = 0
    if callback is not None:
        callback(0, 0.0, x)
    engine = resolve_engine(getattr(inner.settings, "engine", "auto"), device)
    graph = None
    with torch.no_grad(), autocast_weight_cache():
        if engine == "graph" and getattr(model, "fixed_shape_cache", False) and not joint:
            cache = model.new_cache(B, fixed_shape=True, capacity=L)  # one buffer of the decode's length
            graph = StepGraph(lambda xt, t: model.denoise(xt, t, cache), device,
                              strict=getattr(inner.settings, "engine", "auto") == "graph",
                              preserve=getattr(cache, "step_state", ()))  # fmt: skip
        else:
            cache = model.new_cache(B)
        # the engine reads no device value inside the loop: which blocks the prompts pin for every row is read once,
        # and a stopped row is masked (pinned to eos_id) instead of ending the decode when every row has stopped
        static = graph is not None
        if static:  # the rows' seeds held on the host: a block's prior seeded from them reads nothing then
            streams = streams.on_host()
        steps: dict = {}
        pinned_blocks = fixed.view(B, L // k, k).all(-1).all(0).tolist() if static else None
        for lo in range(0, L, k):
            hi = lo + k
            pinned = fixed[:, lo:hi] | stopped.unsqueeze(1)  # a stopped row is pinned to eos_id from here on
            block_values = torch.where(fixed[:, lo:hi], values[:, lo:hi], eos)
            if pinned_blocks[lo // k] if static else pinned.all():  # nothing to draw: the block is its pinned tokens
                x[:, lo:hi] = block_values
                continue
            if cache.length < lo:  # the finished and pinned blocks since the last draw, in one call
                model.extend_cache(cache, x[:, cache.length : lo])
                stats.counts["cache_calls"] += 1

            def on_step(j, t, xb, lo=lo, hi=hi):
                nonlocal step
                if j > 0:
                    step += 1
                    x[:, lo:hi] = xb
                    callback(step, t, x)

            if joint:
                denoiser = CachedJointBlockDenoiser(model, cache, time_independent)
            else:
                denoiser = CachedBlockDenoiser(model, cache, time_independent, graph, steps)
            xb, st = inner(denoiser, block_path, B, k, generator=streams.fork(lo // k), device=device, fixed=pinned,
                           values=block_values, callback=None if callback is None else on_step)  # fmt: skip
            x[:, lo:hi] = xb
            stats.num_calls += st.num_calls
            if st.steps_taken is not None:  # summed on the device
                stats.steps_taken = st.steps_taken if stats.steps_taken is None else stats.steps_taken + st.steps_taken
            for key in ("captured_steps", "head_calls"):  # the engine's captured steps; a step head's calls
                if key in st.counts:
                    stats.counts[key] = stats.counts.get(key, 0) + st.counts[key]
            stats.num_rows += B * st.num_calls  # the model evaluates the whole batch at every call
            stats.counts["blocks"] += 1
            if eos_id is not None:
                stopped |= ((xb == eos_id) & ~fixed[:, lo:hi]).any(-1)
                if not static and stopped.all():
                    break
    if eos_id is not None:
        x = _fill_after_eos(x, fixed, int(eos_id))
    if (x >= V).any():
        raise RuntimeError("block decoding left masks in the output")
    stats.row_calls = torch.full((B,), stats.num_calls, dtype=torch.long, device=device)
    return x, stats


def _fill_after_eos(x: Tensor, fixed: Tensor, eos_id: int) -> Tensor:
    """Every free position after a row's first generated `eos_id` set to `eos_id` (pinned positions kept)."""
    L = x.shape[1]
    pos = torch.arange(L, device=x.device).expand_as(x)
    generated = (x == eos_id) & ~fixed
    first = torch.where(generated, pos, torch.full_like(pos, L)).min(-1, keepdim=True).values
    return torch.where((pos > first) & ~fixed, torch.full_like(x, eos_id), x)
