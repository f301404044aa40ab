"""Autoregressive (causal) transformer over clean tokens: a parametric model p^AR of p_1 (MATH.md §4, §5.4).

log p^AR(x) = Σ_j log p(x^j | x^{<j}); the input at position j is x^{j−1}, with a BOS symbol (id V) at j = 0, so
`forward(x)[:, j]` holds the logits of p(· | x^{<j}) over the V clean tokens. Besides the plain forward the model
offers what the AR score estimators (`tcsm.targets.ar`) need:

* `kv_cache(x)` / `extend(tokens, cache, start)`: run a prefix once and continue it for many suffixes
  (per-layer key/value cache), so that changing x^i only recomputes positions ≥ i, and sample ancestrally
  one token per pass (`extend(..., return_cache=True)`);
* `new_cache(N)` / `decode(ids, cache)`: the decoder's static cache, preallocated once for `max_len` positions and
  written in place (no concatenation per token); `decode` runs a whole prompt in one call (prefill) and then one
  token per call. With `fixed_shape` every call attends over the whole buffer under a position mask, so its shapes
  never change (what a captured CUDA graph, or a kernel that plans per shape, needs);
* `forward_soft(probs)`: inputs given as relaxed one-hots (embedding = probs · W_emb), for the Taylor estimator.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tcsm.models.kinds import CAUSAL
from tcsm.models.layers import TransformerBlock, apply_rotary, batch_invariant, write_in_place
from tcsm.models.lm import LMConfig, LMTransformer

__all__ = ["CausalLM", "KVCache", "StaticKVCache"]

#: One (key, value) pair per layer, each [N, H, S, head_dim] with rotary already applied to the keys.
KVCache = list[tuple[Tensor, Tensor]]


@contextlib.contextmanager
def _gathered(block: nn.Module):
    """The block's whole weights while the cached path runs: it calls the block's layers directly, which skips the
    gather a block sharded by FSDP (train.strategy=fsdp) does in its own forward."""
    if not hasattr(block, "unshard"):  # not sharded
        yield
        return
    block.unshard()
    try:
        yield
    finally:
        block.reshard()


class StaticKVCache:
    """Keys and values of every layer, [layers, N, H, capacity, Dh] each, allocated once per decode in the dtype the
    layers compute in; `length` positions are filled. `write(i, k, v, start)` puts new positions in place."""

    def __init__(self, n_layers: int, batch: int, heads: int, capacity: int, head_dim: int, dtype, device):
        shape = (n_layers, batch, heads, capacity, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity, self.length = int(capacity), 0
        self.positions = torch.arange(capacity, device=device)

    def write(self, i: int, k: Tensor, v: Tensor, start, fixed_shape: bool) -> tuple[Tensor, Tensor]:
        """Store k, v [N, H, n, Dh] at positions start.. of layer i; return the keys/values attention reads: those
        of positions < start + n (a view), or with `fixed_shape` the whole buffer (`start` a 1-element tensor)."""
        keys, values = self.keys[i], self.values[i]
        if fixed_shape and start.numel() > 1:  # a start per row: row r's positions start[r]..
            at = (start.view(-1, 1) + torch.arange(k.shape[2], device=start.device))[:, None, :, None]
            at = at.expand(-1, k.shape[1], -1, k.shape[3])
            keys.scatter_(2, at, k.to(keys.dtype))
            values.scatter_(2, at, v.to(values.dtype))
            return keys, values
        if fixed_shape:
            at = start + torch.arange(k.shape[2], device=start.device)
            keys.index_copy_(2, at, k.to(keys.dtype))
            values.index_copy_(2, at, v.to(values.dtype))
            return keys, values
        return write_in_place(keys, values, k, v, start)


def _block_with_cache(block: TransformerBlock, x: Tensor, rope, past, allowed=None, per_sequence: bool = False):
    """One causal block on new positions x [N, n, d], attending to cached keys/values of earlier positions.

    Same computation as `TransformerBlock.forward` (pre-norm, residuals, no conditioning) in eval mode, but it
    also returns this layer's keys/values: the shared layers expose no cache, and a cache is what makes the
    exact AR marginal cost Σ_i V(L−i) token evaluations instead of V·L² (MATH.md §4). `per_sequence`: the linears
    run per sequence (`_per_sequence`). `allowed` = "all": every key is visible (no mask).
    """
    attn, mlp = block.attn, block.mlp
    lin = _per_sequence if per_sequence else _whole
    qkv = lin(attn.qkv, block.norm1(x))
    b, n = qkv.shape[:2]
    qkv = qkv.view(b, n, 3, attn.n_heads, attn.head_dim)
    # q and k in one call; rope [n, Dh] → [n, 1, 1, Dh], per row [N, n, Dh] → [N, n, 1, 1, Dh]
    qk = apply_rotary(qkv[:, :, :2], *(r.unsqueeze(-2).unsqueeze(-2) for r in rope))
    q, k, v = qk[:, :, 0].transpose(1, 2), qk[:, :, 1].transpose(1, 2), qkv[:, :, 2].transpose(1, 2)
    if callable(past):  # a static cache: written in place, read back up to the new positions
        k, v = past(k, v)
    elif past is not None:
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
    if allowed is None:
        lq, lk = q.shape[2], k.shape[2]
        # Bottom-right-aligned causal mask: new position p sees every cached position and the new ones ≤ p.
        allowed = torch.ones(lq, lk, dtype=torch.bool, device=x.device).tril(lk - lq)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=None if isinstance(allowed, str) else allowed)
    x = x + lin(attn.out, y.transpose(1, 2).reshape(b, n, attn.d_model))
    h = F.gelu(lin(mlp.fc, block.norm2(x)), approximate=mlp.approximate)
    return x + lin(mlp.proj, mlp.drop(h)), (k, v)


def _whole(layer: nn.Linear, x: Tensor) -> Tensor:
    return layer(x)


def _per_sequence(layer: nn.Linear, x: Tensor) -> Tensor:
    """layer(x) for x [N, n, d] as N matrix products of n rows, one per sequence (one batched call). BLAS multiplies
    1-3 rows with other kernels (another summation order) than 4 or more, so a product over all N·n rows would give
    a one-token step's row other bits at batch 1 than at batch 16; per sequence it gets the same bits at any batch,
    at the cost of a matrix-vector product at batch 1 (padding the rows to 4 instead cost 15-30% of a step there), and
    at the cost of speed at large batch, where one product over all rows is faster (docs/benchmarks.md): that product
    runs outside the default `batch_invariance`."""
    if not batch_invariant():
        return layer(x)
    w = layer.weight.t().expand(x.shape[0], -1, -1)
    return torch.bmm(x, w) if layer.bias is None else torch.baddbmm(layer.bias, x, w)


class CausalLM(LMTransformer):
    """x [B, L] clean ids → next-token logits [B, L, V]: logits[:, j] = log p(· | x^{<j}) (+ const), BOS id V."""

    model_kind = CAUSAL
    #: methods besides forward that run the network (a sharded model gathers its weights for them too)
    forward_methods = ("forward_soft", "log_prob", "kv_cache", "extend", "decode")

    def __init__(self, cfg: LMConfig):
        super().__init__(cfg, causal=True)
        self.bos_id = cfg.vocab_size

    # --- plain forward ----------------------------------------------------------------------------------
    def input_ids(self, x: Tensor) -> Tensor:
        """[BOS, x^0, …, x^{L−2}]: the input whose output at j predicts x^j."""
        bos = torch.full_like(x[:, :1], self.bos_id)
        return torch.cat([bos, x[:, :-1]], dim=1)

    def forward(self, x: Tensor) -> Tensor:
        """Next-token logits [B, L, V]: log p(x^j = · | x^{<j}) up to a per-position constant (MATH.md §5.4)."""
        self._check(x)
        return self._trunk(self.embed(self.input_ids(x)))

    def forward_soft(self, probs: Tensor) -> Tensor:
        """Next-token logits for relaxed one-hot inputs probs [B, L, V] (input j = probs[:, j−1] · W_emb); at
        one-hot probs this equals `forward` (MATH.md §5.4, Taylor estimator)."""
        w = self.embed.weight
        bos = w[self.bos_id].expand(probs.shape[0], 1, -1)
        h = torch.cat([bos, probs[:, :-1].to(w.dtype) @ w[: self.vocab_size]], dim=1)
        return self._trunk(h)

    def log_prob(self, x: Tensor) -> Tensor:
        """log p^AR(x) = Σ_j log p(x^j | x^{<j}): [B] (MATH.md §4)."""
        logp = torch.log_softmax(self.forward(x), dim=-1)
        return logp.gather(-1, x.unsqueeze(-1)).squeeze(-1).sum(-1)

    # --- prefix reuse -----------------------------------------------------------------------------------
    @torch.no_grad()
    def kv_cache(self, x: Tensor) -> tuple[Tensor, KVCache]:
        """(next-token logits [B, L, V], per-layer keys/values of all L input positions). Inference only."""
        self._check(x)
        return self._run_cached(self.input_ids(x), None, 0)

    @torch.no_grad()
    def extend(self, tokens: Tensor, cache: KVCache, start: int, return_cache: bool = False):
        """Logits at input positions start..start+n−1 for input ids `tokens` [N, n], given `cache` holding the
        first `start` input positions ([N, H, start, Dh] per layer); with `return_cache`, also the cache of all
        start+n positions (ancestral sampling continues from it). Inference only."""
        if start + tokens.shape[1] > self.cfg.max_len:
            raise ValueError(f"positions up to {start + tokens.shape[1]} exceed max_len={self.cfg.max_len}")
        logits, new_cache = self._run_cached(tokens, cache, start)
        return (logits, new_cache) if return_cache else logits

    def _run_cached(self, ids: Tensor, cache: KVCache | None, start: int) -> tuple[Tensor, KVCache]:
        h = self.embed(ids)
        rope = self.rotary(ids.shape[1], offset=start)
        new_cache: KVCache = []
        for li, block in enumerate(self.blocks):
            with _gathered(block):
                h, kv = _block_with_cache(block, h, rope, None if cache is None else cache[li])
            new_cache.append(kv)
        return self.head(self.final_norm(h)).float(), new_cache

    # --- decoding with a static cache --------------------------------------------------------------------
    def new_cache(self, batch_size: int, device=None, dtype: torch.dtype | None = None,
                  capacity: int | None = None) -> StaticKVCache:  # fmt: skip
        """An empty `StaticKVCache` for `batch_size` rows and `capacity` positions (default `max_len`; more leaves
        room for scratch positions a caller discards, see `decode`), in `dtype` (default: the dtype the layers
        compute in now, the autocast dtype under autocast)."""
        device = torch.device(device) if device is not None else self.embed.weight.device
        if dtype is None:
            on = torch.is_autocast_enabled(device.type)
            dtype = torch.get_autocast_dtype(device.type) if on else self.embed.weight.dtype
        attn = self.blocks[0].attn
        capacity = self.cfg.max_len if capacity is None else int(capacity)
        return StaticKVCache(len(self.blocks), int(batch_size), attn.n_heads, capacity, attn.head_dim, dtype,
                             device)  # fmt: skip

    @torch.no_grad()
    def decode(self, ids: Tensor, cache: StaticKVCache, position: Tensor | None = None) -> Tensor:
        """Next-token logits [N, n, V] of input ids [N, n] (input j is x^{j−1}, BOS first) at positions
        cache.length..+n−1, which enter the cache; `cache.length` advances by n. The same arithmetic as `extend`.
        With `position` (a 1-element long tensor on the device, for n = 1) the call has fixed shapes and reads no
        host value: it writes at `position`, attends over the whole buffer under a mask, and leaves `length` alone
        (the caller counts), so one captured graph serves every position. A `position` of N elements starts each
        row at its own position (n ≥ 1 tokens a row; speculative verification, rows that accepted different
        numbers of drafts): positions past `max_len` take the last rotary angle, for scratch positions whose
        outputs the caller discards."""
        n = ids.shape[1]
        fixed = position is not None
        start = position if fixed else cache.length
        if not fixed and start + n > cache.capacity:
            raise ValueError(f"positions up to {start + n} exceed max_len={cache.capacity}")
        h = self.embed(ids)
        if fixed and position.numel() > 1:
            at = position.view(-1, 1) + torch.arange(n, device=position.device)  # [N, n]
            cos, sin = self.rotary.cos_cached, self.rotary.sin_cached
            angle = at.clamp_max(cos.shape[0] - 1)
            rope = (cos[angle], sin[angle])
            allowed = (cache.positions <= at[:, :, None])[:, None]  # [N, 1, n, capacity]
        elif fixed:
            cos, sin = self.rotary.cos_cached, self.rotary.sin_cached
            rope = (cos.index_select(0, position), sin.index_select(0, position))
            allowed = (cache.positions <= position)[None, :]
        else:
            rope = self.rotary(n, offset=start)
            lk = start + n  # one new position sees every key: no mask
            allowed = "all" if n == 1 else torch.ones(n, lk, dtype=torch.bool, device=ids.device).tril(lk - n)
        for li, block in enumerate(self.blocks):
            def past(k, v, li=li):
                return cache.write(li, k, v, start, fixed)

            with _gathered(block):
                h, _ = _block_with_cache(block, h, rope, past, allowed, per_sequence=True)
        if not fixed:
            cache.length = start + n
        return _per_sequence(self.head, self.final_norm(h)).float()
