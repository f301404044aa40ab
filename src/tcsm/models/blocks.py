"""The block diffusion denoiser (MATH.md §9): the `Denoiser`'s trunk, autoregressive over blocks of k positions and
bidirectional inside each.

`BlockDenoiser(cfg)(x_t, t, x1=x_1)` returns logits [B, L, V] whose block b depends only on (x_t^b, t at block b,
x_1^{<b}), all blocks in one pass over the 2L tokens [x_t; x_1] (BD3-LM): a noisy query of block b attends to the
noisy keys of block b and the clean keys of blocks < b; a clean query of block b to the clean keys of blocks ≤ b.
Both halves sit at positions 0..L−1; with time conditioning a noisy token is conditioned on its t and a clean token
on t = 1. Decoding uses the exact KV cache of the clean half (`new_cache`, `extend_cache`, `denoise`): the clean
keys / values of block b depend on x_1^{≤b} only, so they are computed once, and a block denoised against them
gets the one-pass logits. The one pass runs under the mask `attention` chooses (`BlockDenoiserConfig`): an explicit
boolean mask for SDPA / the explicit kernel, or FlexAttention block masks (`block_mask_mod`), whose fused kernel on a
GPU skips the masked-out tiles (SDPA with an explicit mask cannot use the flash kernel). The parameters are the
`Denoiser`'s, with the same names: a full-sequence checkpoint's weights initialise a block model (k = L is the
full-sequence denoiser itself).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask

from tcsm.models.kinds import BLOCK_DENOISER, JOINT_STEP_BLOCK_DENOISER
from tcsm.models.layers import KERNELS, cache_capacity, gate, modulate, row_stable
from tcsm.models.step_head import JointStep
from tcsm.models.transformer import (
    Denoiser,
    DenoiserConfig,
    _compute_dtype,
    at_positions,
    attach_step_head,
    denoiser_fields,
)

__all__ = [
    "BLOCK_ATTENTION",
    "BlockCache",
    "BlockDenoiser",
    "BlockDenoiserConfig",
    "JointStepBlockDenoiser",
    "block_attention_mask",
    "block_flops_per_sequence",
    "block_mask_mod",
    "build_block_denoiser",
]

#: `model.attention` of a block model: the dense kernels' choices, and FlexAttention block masks for the one pass
BLOCK_ATTENTION = (*KERNELS, "flex")


@dataclass
class BlockDenoiserConfig(DenoiserConfig):
    """A `DenoiserConfig` with the block length k (the path's `block_length`). Its `attention` takes "flex" too:
    the one pass under FlexAttention block masks (no attention dropout; forward only on a CPU); "auto" is flex on
    a GPU without attention dropout, else the dense kernels' choice. The KV cache's calls always run dense."""

    block_length: int | None = None

    label: ClassVar[str] = "BlockDenoiserConfig"
    attentions: ClassVar[tuple[str, ...]] = BLOCK_ATTENTION

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.attention == "flex" and self.dropout > 0:
            raise ValueError(f"attention=flex takes no attention dropout (dropout={self.dropout}): use sdpa or auto")
        k = self.block_length
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.max_len:
            raise ValueError(f"block_length must be an integer in [1, max_len={self.max_len}], got {k!r}")


def block_attention_mask(length: int, block_length: int, device=None) -> Tensor:
    """The one-pass mask [2L, 2L] over [x_t; x_1] (True: may attend): noisy block b → noisy block b and clean blocks
    < b; clean block b → clean blocks ≤ b (MATH.md §9)."""
    pos = torch.arange(2 * length, device=device)
    block, clean = (pos % length) // block_length, pos >= length
    same = block[:, None] == block[None, :]
    before = block[:, None] > block[None, :]
    noisy_q = ~clean[:, None] & ((~clean[None, :] & same) | (clean[None, :] & before))
    clean_q = clean[:, None] & clean[None, :] & (same | before)
    return noisy_q | clean_q


def block_mask_mod(length: int, block_length: int):
    """`block_attention_mask` as a FlexAttention mask_mod (b, h, q, kv) → may attend, for index tensors into the
    [x_t; x_1] pass (MATH.md §9): q and kv in the same block of the noisy half; a noisy q and a clean kv of an
    earlier block; a clean q and a clean kv of its own or an earlier block."""

    def mask_mod(b, h, q, kv):
        q_clean, kv_clean = q >= length, kv >= length
        q_block, kv_block = (q % length) // block_length, (kv % length) // block_length
        same_half_block = (q_clean == kv_clean) & (q_block == kv_block)
        earlier_clean = kv_clean & (kv_block < q_block)  # for a noisy query and a clean one alike
        return same_half_block | earlier_clean

    return mask_mod


def block_flops_per_sequence(cfg: BlockDenoiserConfig, length: int, attention: str = "unmasked") -> float:
    """Training (forward + backward) model FLOPs of one sequence of `length` through the one pass, counted as
    `flops_per_token` counts them (6 per multiply-add of a weight or an attention product; embeddings and the
    adaLN pathway excluded): 2L − k tokens through every layer but the last, whose queries, outputs and MLP are
    the L noisy tokens', then the head over L. `attention`: "unmasked" counts the query-key pairs the mask allows
    (the work a block-sparse kernel must do), "dense" every pair of the [2L−k, 2L−k] pass (what SDPA with an
    explicit mask computes)."""
    if attention not in ("unmasked", "dense"):
        raise ValueError(f"attention must be 'unmasked' or 'dense', got {attention!r}")
    d, n, k, L = cfg.d_model, cfg.n_layers, int(cfg.block_length), int(length)
    if L % k:
        raise ValueError(f"length {L} is not a multiple of block_length={k}")
    hidden, T, nb = round(cfg.mlp_ratio * d), 2 * L - k, L // k
    per_token = 4 * d * d + 2 * d * hidden  # q, k, v, out projections and the MLP
    last = T * 2 * d * d + L * (2 * d * d + 2 * d * hidden)  # keys / values of all, the rest of the noisy half
    weights = (n - 1) * T * per_token + last + L * d * cfg.vocab_size
    if attention == "dense":
        pairs, noisy_pairs = T * T, L * T
    else:  # noisy block b: its k noisy and b·k clean keys; clean block b < nb − 1: (b + 1)·k clean keys
        noisy_pairs = k * k * (nb + nb * (nb - 1) // 2)
        pairs = noisy_pairs + k * k * (nb * (nb - 1) // 2)
    products = 2 * d * ((n - 1) * pairs + noisy_pairs)  # QKᵀ and the weighted sum of V
    return 6.0 * (weights + products)


class BlockCache:
    """Keys and values of every layer for the clean tokens at positions 0..length−1 (rotated at their positions),
    for one batch of `batch_size` rows in lockstep. Filled by `BlockDenoiser.extend_cache`, read by `denoise`.

    With `fixed_shape` the buffers hold `capacity` positions from the first write, and `position` (a 1-element
    long tensor on the device, kept equal to `length` by the caller) places `denoise`'s block: its calls then have
    one shape for the whole decode and read no host value, so one captured CUDA graph serves them all."""

    def __init__(self, batch_size: int, n_layers: int, capacity: int, fixed_shape: bool = False, device=None):
        self.batch_size, self.capacity = int(batch_size), int(capacity)
        self.length = 0
        self.position = torch.zeros(1, dtype=torch.long, device=device) if fixed_shape else None
        self.keys: list[Tensor | None] = [None] * n_layers
        self.values: list[Tensor | None] = [None] * n_layers

    def layer(self, i: int, fixed: bool = False) -> _LayerCache:
        return _LayerCache(self, i, fixed)


class _LayerCache:
    """One layer's view for `MultiHeadAttention(cache=)`: `update(k, v)` puts the new positions' keys / values after
    the cached ones and returns all of them. They go into the buffer's free slots (a later call
    overwrites them until `length` moves past them); with gradients on they are concatenated instead, so no
    in-place write enters a graph."""

    def __init__(self, cache: BlockCache, i: int, fixed: bool = False):
        self.cache, self.i, self.fixed = cache, i, fixed

    def update(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        c, i, n = self.cache, self.i, k.shape[2]
        start = c.length
        size = 0 if c.keys[i] is None else c.keys[i].shape[2]
        if start + n > size or (c.position is not None and size < c.capacity):
            # grow geometrically up to max_len: a short decode never holds a max_len buffer; a fixed-shape cache
            # holds max_len from its first write, so its calls keep one shape
            size = c.capacity if c.position is not None else min(c.capacity, max(2 * size, start + n, 64))
            grown = [k.new_zeros(k.shape[0], k.shape[1], size, k.shape[3]) for _ in range(2)]
            if c.keys[i] is not None:
                grown[0][:, :, :start], grown[1][:, :, :start] = c.keys[i][:, :, :start], c.values[i][:, :, :start]
            c.keys[i], c.values[i] = grown
        keys, values = c.keys[i], c.values[i]
        if self.fixed:  # `denoise` at `position`: the whole buffer, its later positions masked by the caller
            at = c.position + torch.arange(n, device=k.device)
            keys.index_copy_(2, at, k.to(keys.dtype))
            values.index_copy_(2, at, v.to(values.dtype))
            return keys, values
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
            return torch.cat([keys[:, :, :start], k], 2), torch.cat([values[:, :, :start], v], 2)
        keys[:, :, start : start + n] = k
        values[:, :, start : start + n] = v
        return keys[:, :, : start + n], values[:, :, : start + n]


class BlockDenoiser(Denoiser):
    """x_t [B, L], t [B, L] / [B] / scalar, x_1 [B, L] → logits [B, L, V] (float32), block b read from
    (x_t^b, t_b, x_1^{<b}); plus the exact KV cache for decoding block by block (module docstring)."""

    model_kind = BLOCK_DENOISER
    #: `new_cache(..., fixed_shape=True)`: `denoise` at a device position, one shape per decode (sampling.engine)
    fixed_shape_cache = True

    def __init__(self, cfg: BlockDenoiserConfig):
        super().__init__(cfg)
        self.block_length = int(cfg.block_length)
        self._masks: dict[tuple, tuple] = {}

    # ------------------------------------------------------------------------------------------ one pass

    def uses_flex(self, device) -> bool:
        """Whether the one pass on `device` runs under FlexAttention block masks (`attention`: flex, or auto on a
        GPU without attention dropout)."""
        choice = self.cfg.attention
        return choice == "flex" or (choice == "auto" and torch.device(device).type == "cuda" and not self.cfg.dropout)

    def attention_mask(self, length: int, device) -> tuple[Tensor | BlockMask, Tensor | BlockMask]:
        """The one pass's masks for sequences of `length` without the last clean block (no noisy block reads it):
        (all 2L−k queries × 2L−k keys, the L noisy queries × 2L−k keys), boolean [Lq, Lk] or FlexAttention
        BlockMasks (`uses_flex`), built once per (L, k, device, kind)."""
        flex = self.uses_flex(device)
        key = (int(length), self.block_length, str(device), flex)
        if key not in self._masks:
            self._masks[key] = _build_masks(int(length), self.block_length, device, flex)
        return self._masks[key]

    def forward(self, xt: Tensor, t: Tensor | None = None, x1: Tensor | None = None, *,
                at: Tensor | None = None) -> Tensor:  # fmt: skip
        return at_positions(self.block_features(xt, t, x1), at, self.head).float()

    def block_features(self, xt: Tensor, t: Tensor | None = None, x1: Tensor | None = None) -> Tensor:
        """The one pass's final hidden states [B, L, d_model] of the noisy half, the logits' linear input."""
        if x1 is None:
            raise ValueError("a block model needs the clean sequence: call it as model(x_t, t, x1=x_1)")
        B, L = self._check_ids(xt, "xt", self.num_states)
        if tuple(x1.shape) != (B, L):
            raise ValueError(f"x1 must have the shape of xt {(B, L)}, got {tuple(x1.shape)}")
        self._check_ids(x1, "x1", self.vocab_size)
        if L % self.block_length:
            raise ValueError(
                f"sequence length {L} is not a multiple of the model's block_length={self.block_length}"
            )
        k, nb = self.block_length, L // self.block_length
        # The clean half without its last block: no noisy block reads it (k = L: the noisy half alone).
        h = self.embed(torch.cat([xt, x1[:, : L - k]], 1))
        cos, sin = self.rotary(L, dtype=_compute_dtype(xt.device))
        rope = (torch.cat([cos, cos[: L - k]]), torch.cat([sin, sin[: L - k]]))  # both halves at positions 0..L−1
        cond = self._block_cond(t, B, L, h.device)
        mask, noisy_rows = self.attention_mask(L, xt.device)
        for block in self.blocks[:-1]:
            h = block(h, rope, cond, mask)
        h = _noisy_half(self.blocks[-1], h, rope, cond, noisy_rows, L, nb)
        return self._final(h, None if cond is None else cond[:, :nb])

    def _block_cond(self, t, B: int, L: int, device) -> Tensor | None:
        """Time conditioning per block [B, 2nb−1, cond_dim] (adaLN groups of k positions): each noisy block at its
        t, each clean block at t = 1."""
        if self.time_embed is None:
            return None
        if t is None:
            raise ValueError("this block model is time-conditioned: pass t of shape [batch, length] or [batch]")
        k, nb = self.block_length, L // self.block_length
        t = torch.as_tensor(t, device=device, dtype=torch.float32)
        if t.dim() <= 1 and t.numel() in (1, B):
            tb = t.reshape(-1, 1).expand(B, nb)
        elif tuple(t.shape) == (B, L):
            per_block = t.reshape(B, nb, k)
            tb = per_block[..., 0]
            if self.cfg.check_inputs:  # on a GPU or under compile an asynchronous device assertion
                constant = (per_block == tb[..., None]).all()
                if device.type == "cpu" and not torch.compiler.is_compiling():
                    if not constant:
                        raise ValueError("t [batch, length] must be constant inside each block (one time per block)")
                else:
                    torch._assert_async(constant, "t [batch, length] must be constant inside each block")
        else:
            raise ValueError(f"t must have shape [batch, length]={[B, L]}, [batch]={B} or be a scalar, got {tuple(t.shape)}")
        tb = torch.cat([tb, torch.ones_like(tb[:, 1:])], 1)
        return self.time_embed(tb.reshape(-1)).view(B, 2 * nb - 1, -1)

    def _final(self, h: Tensor, cond: Tensor | None) -> Tensor:
        h = self.final_norm(h)
        if self.final_adaLN is not None:
            shift, scale = row_stable(self.final_adaLN, cond).chunk(2, dim=-1)
            h = modulate(h, shift, scale)
        return h

    def _check_ids(self, x: Tensor, name: str, bound: int) -> tuple[int, int]:
        if x.dim() != 2 or x.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool):
            raise ValueError(f"{name} must be a [batch, length] tensor of token ids, got {tuple(x.shape)} {x.dtype}")
        if x.shape[1] > self.cfg.max_len:
            raise ValueError(
                f"sequence length {x.shape[1]} exceeds the model's max_len={self.cfg.max_len}; "
                "build the model with a larger max_len or use shorter sequences"
            )
        if self.cfg.check_inputs and x.numel() and x.device.type == "cpu" and not torch.compiler.is_compiling():
            lo, hi = int(x.min()), int(x.max())
            if lo < 0 or hi >= bound:
                raise ValueError(f"{name} token ids must lie in [0, {bound}), got range [{lo}, {hi}]")
        return int(x.shape[0]), int(x.shape[1])

    # ------------------------------------------------------------------------------------------ KV cache

    def new_cache(self, batch_size: int, fixed_shape: bool = False, capacity: int | None = None) -> BlockCache:
        """An empty cache for `batch_size` rows decoded in lockstep (`fixed_shape`: see `BlockCache`) of `capacity`
        positions at most (default max_len)."""
        cap = cache_capacity(capacity, self.cfg.max_len)
        return BlockCache(batch_size, len(self.blocks), cap, fixed_shape, self.head.weight.device)

    def _check_step(self, cache: BlockCache, x: Tensor, what: str) -> int:
        if not isinstance(cache, BlockCache):
            raise TypeError(f"{what} needs a cache made by this model's new_cache, got {type(cache).__name__}")
        if x.dim() != 2 or x.shape[0] != cache.batch_size:
            raise ValueError(f"{what}: the cache holds {cache.batch_size} rows, got tokens of shape {tuple(x.shape)}")
        if cache.length % self.block_length:
            raise ValueError(
                f"{what}: the cache ends inside a block (at {cache.length}, block_length={self.block_length}); "
                "only the last block of a sequence may be partial"
            )
        end = cache.length + x.shape[1]
        if end > self.cfg.max_len:
            raise ValueError(f"{what}: positions up to {end} exceed the model's max_len={self.cfg.max_len}")
        return end

    @torch.no_grad()
    def extend_cache(self, cache: BlockCache, x_clean: Tensor) -> None:
        """Append the clean tokens x_clean [B, n] at positions cache.length..+n−1 (whole blocks, or the last
        block's tail): what the clean half of the one pass computes for them, block-causal among themselves."""
        start = cache.length
        end = self._check_step(cache, x_clean, "extend_cache")
        self._check_ids(x_clean, "x_clean", self.vocab_size)
        n = x_clean.shape[1]
        if n == 0:
            return
        h = self.embed(x_clean)
        rope = self.rotary(n, offset=start, dtype=_compute_dtype(x_clean.device))
        cond = self._sequence_cond(torch.ones(()), h)
        mask = None
        if n > self.block_length:  # earlier blocks' keys are all visible; among the new ones, blocks ≤ own
            k = self.block_length
            pos = torch.arange(end, device=h.device)
            mask = pos[None, :] // k <= pos[start:, None] // k
        for i, block in enumerate(self.blocks):
            h = block(h, rope, cond, mask, cache=cache.layer(i))
        cache.length = end
        if cache.position is not None:
            cache.position.fill_(end)  # a device write, no host read

    def denoise(self, xt_block: Tensor, t, cache: BlockCache) -> Tensor:
        """Logits [B, n, V] of one noisy block x_t [B, n ≤ k] at positions cache.length..+n−1 and time t [B] (or a
        scalar), given the cached clean blocks: the one-pass logits of that block. The cache is not changed."""
        return self.head(self.denoise_features(xt_block, t, cache)).float()

    def denoise_features(self, xt_block: Tensor, t, cache: BlockCache) -> Tensor:
        """`denoise`'s final hidden states [B, n, d_model], the logits' linear input."""
        self._check_step(cache, xt_block, "denoise")
        if xt_block.shape[1] > self.block_length:
            raise ValueError(f"denoise takes one block of at most {self.block_length} positions, got {xt_block.shape[1]}")
        self._check_ids(xt_block, "xt_block", self.num_states)
        n = xt_block.shape[1]
        h = self.embed(xt_block)
        fixed, mask = cache.position is not None, None
        if fixed:  # positions from the device: the same shapes and no host value at every block
            at = cache.position + torch.arange(n, device=h.device)
            dtype = _compute_dtype(xt_block.device)
            rope = tuple(r.index_select(0, at).to(dtype) for r in (self.rotary.cos_cached, self.rotary.sin_cached))
            mask = (torch.arange(cache.capacity, device=h.device) < at[-1] + 1)[None, :]
        else:
            rope = self.rotary(n, offset=cache.length, dtype=_compute_dtype(xt_block.device))
        cond = self._sequence_cond(t, h)
        for i, block in enumerate(self.blocks):  # the block sees itself and every cached clean block
            h = block(h, rope, cond, mask, cache=cache.layer(i, fixed))
        return self._final(h, cond)

    def _sequence_cond(self, t, h: Tensor) -> Tensor | None:
        if self.time_embed is None:
            return None
        if t is None:
            raise ValueError("this block model is time-conditioned: pass t of shape [batch] or a scalar")
        t = torch.as_tensor(t, device=h.device, dtype=torch.float32).reshape(-1)
        if t.numel() not in (1, h.shape[0]):
            raise ValueError(f"t must have shape [batch]={h.shape[0]} or be a scalar, got {t.numel()} values")
        return self.time_embed(t.expand(h.shape[0]))


class JointStepBlockDenoiser(BlockDenoiser):
    """The `BlockDenoiser` with a step head (MATH.md §9, §10): `model(x_t, t, x1=x_1)` are its factorised logits,
    `model(x_t, t, x1=x_1, reveal=R, tokens=y)` add the head's correction at R given the tokens y drawn before each
    position in its own block's step (training: every block's step at once, teacher-forced), `open_block_step` the
    cached call and incremental head of one block's sampler step. A sampler step of block b reveals positions of
    block b only, the blocks before it clean context seen through the hidden states, so the head runs on each block
    alone (its causal attention never crosses a block; its positions are the block's 0..k−1)."""

    model_kind = JOINT_STEP_BLOCK_DENOISER

    def __init__(self, cfg: BlockDenoiserConfig):
        super().__init__(cfg)
        attach_step_head(self, cfg)

    def forward(self, xt: Tensor, t: Tensor | None = None, x1: Tensor | None = None, *, reveal: Tensor | None = None,
                tokens: Tensor | None = None, at: Tensor | None = None) -> Tensor:  # fmt: skip
        h = self.block_features(xt, t, x1)
        if reveal is None:
            return at_positions(h, at, self.head).float()
        if tokens is None:
            raise ValueError("a step head reads the tokens drawn at the revealed positions: pass tokens")
        (B, L, D), k = h.shape, self.block_length
        R = (reveal & (xt == self.cfg.vocab_size)).reshape(-1, k)
        corr = self.step_head.correction(h.reshape(-1, k, D), R, tokens.reshape(-1, k), self.embed, self.head.weight)
        return at_positions(self.head(h).float() + corr.reshape(B, L, -1).float(), at)

    def open_blocks_step(self, xt: Tensor, t: Tensor, x1: Tensor, reveal: Tensor) -> JointStep:
        """Every block's joint step at once, each block of each row a row of its own ([B·nb] rows of k positions):
        the one pass's hidden states given the clean prefixes of `x1` (at the times t [B, L]), then the head over
        each block's reveal `reveal` [B·nb, k] (incremental). A rollout of the block sampler in training steps all
        blocks together this way (`posttrain.fewstep.teacher_rollout`)."""
        h = self.block_features(xt, t, x1)
        h = h.reshape(-1, self.block_length, h.shape[-1])
        return JointStep(self.step_head, h, reveal, project=self.head, embed=self.embed, unembed=self.head.weight)

    def open_block_step(self, xt_block: Tensor, t, cache: BlockCache, reveal: Tensor) -> JointStep:
        """One block's joint step: `denoise`'s call on the cache, then the head over `reveal` [B, n] (incremental)."""
        h = self.denoise_features(xt_block, t, cache)
        return JointStep(self.step_head, h, reveal, project=self.head, embed=self.embed, unembed=self.head.weight)


@torch.compiler.disable
def _build_masks(length: int, k: int, device, flex: bool) -> tuple:
    # built outside any compiled graph (once per shape): the graph receives the masks as inputs
    n = 2 * length - k
    if not flex:
        mask = block_attention_mask(length, k, device)[:n, :n].contiguous()
        return mask, mask[:length]
    mod = block_mask_mod(length, k)
    return tuple(create_block_mask(mod, None, None, rows, n, device=device) for rows in (n, length))


def _noisy_half(block, h: Tensor, rope, cond: Tensor | None, mask, L: int, nb: int) -> Tensor:
    """`block(h, rope, cond, mask)[:, :L]` without the clean half's outputs, which no later layer reads (`mask`: the
    noisy query rows'): the clean keys / values come from all of h, the queries, residual and MLP from the noisy half
    alone. The same arithmetic as `TransformerBlock.forward`, which the KV cache runs (the cache tests compare the
    two)."""
    if block.cond_dim is None:
        kv = block.norm1(h)
        x = h[:, :L] + block.drop(block.attn(kv[:, :L], rope, mask, False, kv))
        return x + block.drop(block.mlp(block.norm2(x)))
    shift1, scale1, gate1, shift2, scale2, gate2 = row_stable(block.adaLN, cond).chunk(6, dim=-1)
    kv = modulate(block.norm1(h), shift1, scale1)  # every position: the keys and values
    gate1, shift2, scale2, gate2 = (c[:, :nb] for c in (gate1, shift2, scale2, gate2))  # the noisy blocks
    x = h[:, :L] + gate(gate1, block.drop(block.attn(kv[:, :L], rope, mask, False, kv)))
    return x + gate(gate2, block.drop(block.mlp(modulate(block.norm2(x), shift2, scale2))))


def build_block_denoiser(preset_or_cfg, block_length: int, **overrides) -> BlockDenoiser:
    """A `BlockDenoiser` of blocks of `block_length` (with `step_head_layers` > 0 a `JointStepBlockDenoiser`) from
    what `build_denoiser` takes (a preset name, a dict, a config) and keyword overrides:
    `build_block_denoiser("tiny", 4, vocab_size=27, num_states=28)`."""
    fields = denoiser_fields(preset_or_cfg, **overrides)
    fields["block_length"] = block_length
    cfg = BlockDenoiserConfig.from_dict(fields)
    return JointStepBlockDenoiser(cfg) if cfg.step_head_layers else BlockDenoiser(cfg)
