"""A block diffusion denoiser started from a pretrained Hugging Face causal LM (MATH.md §9; the AR → block-diffusion
adaptation of Fast-dLLM v2 / SDAR): `model.name=hf_denoiser` on a path with `block_length`.

`HFBlockDenoiser(hf_model, token_ids, block_length=k, ...)(x_t, t, x1=x_1)` returns logits [B, L, V] whose block b
depends only on (x_t^b, t at block b, x_1^{<b}), every block in one pass of the HF model over two streams, both at
the AR model's positions (HF position p holds token p − 1, BOS at 0):

* clean stream [BOS, x_1^0 … x_1^{L−1}] at positions 0..L, block-causal (token p − 1 of block b sees BOS and the
  clean blocks ≤ b; with `bidirectional=False` plain causal);
* noisy stream, per block b: the anchor x_1^{bk−1} (BOS for b = 0) at position bk, then x_t^{bk} … x_t^{bk+k−1}
  at bk+1 … bk+k. It sees itself (bidirectionally; causally with `bidirectional=False`) and the clean keys at
  positions < bk; the anchor stands in for the clean key at bk, so no token is seen twice.

The AR head is reused with its next-token shift, as `HFDenoiser` does for a causal LM: the logits of position bk+j
are the HF output at the noisy token before it (the anchor for j = 0). With `bidirectional=False` and x_t = x_1 the
model is the pretrained AR model exactly (tested). [MASK] is tcsm's id V through the trainable `mask_embed`; with
`time_conditioning` a token's time (noisy: its block's t, clean and BOS: 1) enters through the zero-initialised
path of `HFDenoiser`. Without it the denoiser is time-blind, which the masked source allows (MATH.md §1.3); a
uniform source needs the time input and is refused without it.

Decoding uses the model's own key/value cache (a transformers `DynamicCache`) of the clean stream: `extend_cache`
appends clean tokens exactly as the one pass computes them; `denoise` runs one noisy block against the cache
without changing it.
"""

from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tcsm.models.hf_denoiser import HFDenoiser, HFDenoiserConfig
from tcsm.models.kinds import ModelKind
from tcsm.models.layers import cache_capacity, write_in_place

__all__ = ["HF_BLOCK_DENOISER", "HFBlockCache", "HFBlockDenoiser", "HFBlockDenoiserConfig", "block_allowed", "clean_blocks"]

#: a block denoiser started from a Hugging Face causal LM: decoded block by block with its KV cache
HF_BLOCK_DENOISER = ModelKind(
    "denoiser", "blocks", "hf_denoiser", "a block diffusion denoiser started from a Hugging Face causal LM", blocks=True
)


@dataclass
class HFBlockDenoiserConfig(HFDenoiserConfig):
    """An `HFDenoiserConfig` with the block length k (the path's `block_length`)."""

    block_length: int = 1


def clean_blocks(pos: Tensor, k: int) -> Tensor:
    """The block of each clean-stream position (position p holds token p − 1; BOS, position 0, is block −1)."""
    return (pos - 1).div(k, rounding_mode="floor")


def block_allowed(q: tuple[Tensor, Tensor, Tensor], kv: tuple[Tensor, Tensor, Tensor], k: int,
                  bidirectional: bool) -> Tensor:  # fmt: skip
    """[q, kv] True where a query may attend a key; each token is (HF position, block, noisy?) (module docstring):
    a noisy query of block b (anchor at bk) sees the noisy keys of block b and the clean keys at positions < bk; a
    clean query of block b sees the clean keys of blocks ≤ b (BOS is block −1)."""
    (qp, qb, qn), (kp, kb, kn) = ((a[:, None] for a in q), (a[None, :] for a in kv))
    order = torch.ones_like(qp > kp) if bidirectional else kp <= qp
    noisy_q = qn & ((kn & (kb == qb) & order) | (~kn & (kp < qb * k)))
    clean_q = ~qn & ~kn & ((kb <= qb) if bidirectional else (kp <= qp))
    return noisy_q | clean_q


class HFBlockCache:
    """The HF model's key/value cache of the clean stream (BOS and the clean tokens at positions 0..length−1) for
    `batch_size` rows in lockstep, and each row's last clean token: the anchor of the next noisy block.

    With `fixed_shape` (the decode engine's cache) `hf` holds preallocated buffers written in place
    (`_fixed_stream`), and `position` (a 1-element long tensor on the device, kept equal to `length`) places
    `denoise`'s block: its calls have one shape for the whole decode and read no host value."""

    def __init__(self, hf_cache, batch_size: int, anchor: Tensor, position: Tensor | None = None):
        self.hf, self.batch_size = hf_cache, int(batch_size)
        self.length = 0
        self.anchor = anchor  # [B] tcsm ids, −1 for BOS
        self.position = position


def _fixed_stream(config, capacity: int, block: int):
    """A transformers `DynamicCache` whose layers are preallocated buffers of `capacity` clean-stream positions
    (BOS and the tokens) and `block` scratch slots after them: `fill` positions of the clean stream are written in
    place at their own index and attended up to there (a view); with `scratch` the noisy block's keys go to the
    scratch slots and the whole buffer is attended, the unfilled positions masked by the caller."""
    from transformers import DynamicCache

    class FixedStream(DynamicCache):
        def __init__(self):
            super().__init__(config=config)
            self.capacity, self.fill, self.scratch, self.buffers = capacity, 0, False, {}

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            if layer_idx not in self.buffers:
                B, H, _, D = key_states.shape
                self.buffers[layer_idx] = (key_states.new_zeros(B, H, capacity + block, D),
                                           value_states.new_zeros(B, H, capacity + block, value_states.shape[3]))  # fmt: skip
            keys, values = self.buffers[layer_idx]
            n = key_states.shape[2]
            if self.scratch:
                keys[:, :, capacity : capacity + n] = key_states
                values[:, :, capacity : capacity + n] = value_states
                return keys[:, :, : capacity + n], values[:, :, : capacity + n]
            return write_in_place(keys, values, key_states, value_states, self.fill, capacity)

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return self.fill

    return FixedStream()


class HFBlockDenoiser(HFDenoiser):
    """x_t [B, L], t [B, L] / [B] / scalar, x_1 [B, L] → logits [B, L, V] (float32), block b read from
    (x_t^b, t_b, x_1^{<b}); plus the exact KV cache for decoding block by block (module docstring)."""

    model_kind = HF_BLOCK_DENOISER
    #: methods besides forward that run the network (a sharded model gathers its weights for them too)
    forward_methods = ("extend_cache", "denoise")

    def __init__(self, hf_model: nn.Module, token_ids, *, block_length: int, num_states: int, **kwargs):
        kind = kwargs.pop("kind", "causal")
        if kind != "causal":
            raise ValueError("a block denoiser is started from a causal LM (its key/value cache holds the clean "
                             f"blocks); a {kind!r} model cannot be one: drop path.block_length or use a causal LM")  # fmt: skip
        super().__init__(hf_model, token_ids, kind="causal", num_states=num_states, **kwargs)
        if num_states == self.vocab_size and not self.cfg.time_conditioning:
            raise ValueError("a block denoiser on the uniform source needs its time input: set "
                             "model.time_conditioning=true (or use the masked source)")  # fmt: skip
        impl = getattr(getattr(hf_model, "config", None), "_attn_implementation", "eager")
        if impl not in ("sdpa", "eager"):
            raise ValueError(f"attn_implementation {impl!r} cannot take the block mask; load the causal LM with "
                             "attn_implementation='sdpa' or 'eager'")  # fmt: skip
        k = int(block_length)
        if isinstance(block_length, bool) or not 1 <= k <= self.cfg.max_len:
            raise ValueError(f"block_length must be an integer in [1, max_len={self.cfg.max_len}], got {block_length!r}")
        self.block_length = k
        self.cfg = HFBlockDenoiserConfig(**self.cfg.to_dict(), block_length=k)
        params = inspect.signature(hf_model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._masks: dict[tuple, Tensor] = {}

    # ------------------------------------------------------------------------------------------ inputs
    def _embed(self, x: Tensor, t: Tensor | None) -> Tensor:
        """Input embeddings of tcsm ids x [B, n] (V = [MASK], −1 = BOS) at times t [B, n] (None: time-blind)."""
        emb = self.hf.get_input_embeddings()
        V = self.vocab_size
        ids = torch.where(x < 0, self.bos_id, self.token_ids[x.clamp(0, V - 1)])
        h = emb(ids)
        if self.mask_embed is not None:
            h = torch.where((x >= V)[..., None], self.mask_embed.to(h.dtype), h)
        if self.time_embed is not None:
            cond = self.time_proj(self.time_embed(t.reshape(-1))).to(h.dtype)
            h = h + cond.view(*x.shape, -1)
        return h

    def _times(self, t, B: int, n: int, device) -> Tensor | None:
        if self.time_embed is None:
            return None
        if t is None:
            raise ValueError("this block denoiser is time-conditioned: pass t of shape [batch, length] or [batch]")
        t = torch.as_tensor(t, device=device, dtype=torch.float32)
        if t.dim() <= 1 and t.numel() in (1, B):
            return t.reshape(-1, 1).expand(B, n)
        if tuple(t.shape) != (B, n):
            raise ValueError(f"t must have shape [batch, length]={[B, n]}, [batch]={B} or be a scalar, got {tuple(t.shape)}")
        return t

    def _mask(self, allowed: Tensor, dtype) -> Tensor:
        """The 4-D mask [1, 1, q, kv] in the form the attention reads: boolean for sdpa (whatever autocast does to
        the scores), additive for eager."""
        if self.hf.config._attn_implementation == "sdpa":
            return allowed[None, None]
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )[None, None]

    def _check(self, x: Tensor, name: str, bound: int) -> tuple[int, int]:
        if x.dim() != 2 or x.is_floating_point() or x.dtype == torch.bool:
            raise ValueError(f"{name} must be a [batch, length] tensor of token ids, got {tuple(x.shape)} {x.dtype}")
        if x.numel() and x.device.type == "cpu" and (int(x.min()) < 0 or int(x.max()) >= bound):  # no GPU sync
            raise ValueError(f"{name} token ids must lie in [0, {bound}), got range [{int(x.min())}, {int(x.max())}]")
        return int(x.shape[0]), int(x.shape[1])

    def _run(self, h: Tensor, pos: Tensor, allowed: Tensor, cache=None) -> Tensor:
        kwargs = {} if cache is None else {self._cache_kw: cache, "use_cache": True}
        out = self.hf(inputs_embeds=h, attention_mask=self._mask(allowed, h.dtype),
                      position_ids=pos[None].expand(h.shape[0], -1), **kwargs)  # fmt: skip
        return (out.logits if hasattr(out, "logits") else out[0])[..., self.token_ids].float()

    # ------------------------------------------------------------------------------------------ one pass
    def forward(self, xt: Tensor, t: Tensor | None = None, x1: Tensor | None = None) -> Tensor:
        if x1 is None:
            raise ValueError("a block model needs the clean sequence: call it as model(x_t, t, x1=x_1)")
        B, L = self._check(xt, "xt", self.num_states)
        if tuple(x1.shape) != (B, L):
            raise ValueError(f"x1 must have the shape of xt {(B, L)}, got {tuple(x1.shape)}")
        self._check(x1, "x1", self.vocab_size)
        k = self.block_length
        if L % k:
            raise ValueError(f"sequence length {L} is not a multiple of the model's block_length={k}")
        if L > self.cfg.max_len:
            raise ValueError(f"sequence length {L} exceeds the model's max_len={self.cfg.max_len}")
        nb, dev = L // k, xt.device
        bos = torch.full((B, 1), -1, dtype=torch.long, device=dev)
        anchors = torch.cat([bos, x1[:, k - 1 : L - 1 : k]], 1)  # x_1^{bk−1}, BOS for block 0
        noisy = torch.cat([anchors[..., None], xt.view(B, nb, k)], -1).reshape(B, nb * (k + 1))
        clean = torch.cat([bos, x1], 1)
        tt = self._times(t, B, L, dev)
        t_noisy = t_clean = None
        if tt is not None:
            t_noisy = torch.cat([tt[:, ::k, None], tt.view(B, nb, k)], -1).reshape(B, -1)
            t_clean = torch.ones(B, L + 1, device=dev)
            t_all = torch.cat([t_noisy, t_clean], 1)
        h = self._embed(torch.cat([noisy, clean], 1), None if tt is None else t_all)
        pos = torch.cat([torch.arange(nb * (k + 1), device=dev) - torch.arange(nb, device=dev).repeat_interleave(k + 1),
                         torch.arange(L + 1, device=dev)])  # fmt: skip
        logits = self._run(h, pos, self._one_pass_mask(L, pos))
        return logits[:, : nb * (k + 1)].view(B, nb, k + 1, -1)[:, :, :k].reshape(B, L, -1)

    def _one_pass_mask(self, L: int, pos: Tensor) -> Tensor:
        """`block_allowed` over the one pass's tokens (noisy stream, then clean), built once per (L, device)."""
        key = (int(L), str(pos.device))
        if key not in self._masks:
            k, n = self.block_length, (L // self.block_length) * (self.block_length + 1)
            is_noisy = torch.arange(pos.numel(), device=pos.device) < n
            block = torch.cat([torch.arange(L // k, device=pos.device).repeat_interleave(k + 1), clean_blocks(pos[n:], k)])
            tokens = (pos, block, is_noisy)
            self._masks[key] = block_allowed(tokens, tokens, k, self.cfg.bidirectional)
        return self._masks[key]

    # ------------------------------------------------------------------------------------------ KV cache
    #: `new_cache(..., fixed_shape=True)`: `denoise` at a device position, one shape per decode (sampling.engine)
    fixed_shape_cache = True

    def new_cache(self, batch_size: int, fixed_shape: bool = False, capacity: int | None = None) -> HFBlockCache:
        """An empty cache (the HF model's own `DynamicCache`) for `batch_size` rows decoded in lockstep; with
        `fixed_shape`, preallocated buffers for `capacity` tokens (default max_len) written in place."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.hf.config)
        if any(getattr(layer, "is_sliding", False) for layer in getattr(cache, "layers", [])):
            raise ValueError("a causal LM with sliding-window attention cannot hold the block cache here; use a model "
                             "with full attention in every layer")  # fmt: skip
        dev = self.token_ids.device
        anchor = torch.full((int(batch_size),), -1, dtype=torch.long, device=dev)
        if not fixed_shape:
            return HFBlockCache(cache, batch_size, anchor)
        cap = cache_capacity(capacity, self.cfg.max_len)
        stream = _fixed_stream(self.hf.config, cap + 1, self.block_length + 1)  # BOS and the tokens; anchor + block
        return HFBlockCache(stream, batch_size, anchor, torch.zeros(1, dtype=torch.long, device=dev))

    def _check_step(self, cache: HFBlockCache, x: Tensor, what: str) -> int:
        if not isinstance(cache, HFBlockCache):
            raise TypeError(f"{what} needs a cache made by this model's new_cache, got {type(cache).__name__}")
        if x.dim() != 2 or x.shape[0] != cache.batch_size:
            raise ValueError(f"{what}: the cache holds {cache.batch_size} rows, got tokens of shape {tuple(x.shape)}")
        if cache.length % self.block_length:
            raise ValueError(f"{what}: the cache ends inside a block (at {cache.length}, block_length="
                             f"{self.block_length}); only the last block of a sequence may be partial")  # fmt: skip
        end = cache.length + x.shape[1]
        if end > self.cfg.max_len:
            raise ValueError(f"{what}: positions up to {end} exceed the model's max_len={self.cfg.max_len}")
        return end

    @torch.no_grad()
    def extend_cache(self, cache: HFBlockCache, x_clean: Tensor) -> None:
        """Append the clean tokens x_clean [B, n] at positions cache.length..+n−1 (BOS first on the first call):
        what the clean stream of the one pass computes for them."""
        end = self._check_step(cache, x_clean, "extend_cache")
        self._check(x_clean, "x_clean", self.vocab_size)
        n = x_clean.shape[1]
        if n == 0:
            return
        B, dev = x_clean.shape[0], x_clean.device
        first = cache.length == 0
        x = torch.cat([torch.full((B, 1), -1, dtype=torch.long, device=dev), x_clean], 1) if first else x_clean
        pos = torch.arange(end + 1 - x.shape[1], end + 1, device=dev)
        keys = torch.arange(end + 1, device=dev)  # BOS, the cached tokens and the new ones
        clean = torch.zeros_like(keys, dtype=torch.bool)
        k = self.block_length
        allowed = block_allowed((pos, clean_blocks(pos, k), clean[: pos.numel()]), (keys, clean_blocks(keys, k), clean),
                                k, self.cfg.bidirectional)  # fmt: skip
        t = None if self.time_embed is None else torch.ones(x.shape, device=dev)
        self._run(self._embed(x, t), pos, allowed, cache.hf)
        cache.length = end
        last = x_clean[:, -1]  # the next noisy block's anchor
        if cache.position is None:
            cache.anchor = last.clone()
        else:  # in place: the captured calls read these tensors
            cache.hf.fill = end + 1
            cache.anchor.copy_(last)
            cache.position.fill_(end)

    @torch.no_grad()
    def denoise(self, xt_block: Tensor, t, cache: HFBlockCache) -> Tensor:
        """Logits [B, n, V] of one noisy block x_t [B, n ≤ k] at positions cache.length..+n−1 and time t [B] (or a
        scalar), given the cached clean blocks: the one-pass logits of that block. The cache is not changed."""
        self._check_step(cache, xt_block, "denoise")
        B, n = self._check(xt_block, "xt_block", self.num_states)
        if n > self.block_length:
            raise ValueError(f"denoise takes one block of at most {self.block_length} positions, got {n}")
        if cache.position is not None:
            return self._fixed_denoise(xt_block, t, cache)
        s, dev = cache.length, xt_block.device
        x = torch.cat([cache.anchor[:, None], xt_block], 1)
        pos = torch.arange(s, s + n + 1, device=dev)
        k = self.block_length
        past = torch.arange(s + 1 if s else 0, device=dev)  # BOS and the clean tokens, positions 0..s
        keys = torch.cat([past, pos])
        noisy = torch.arange(keys.numel(), device=dev) >= past.numel()
        block = torch.where(noisy, s // k, clean_blocks(keys, k))
        allowed = block_allowed((pos, block[past.numel():], noisy[past.numel():]), (keys, block, noisy), k,
                                self.cfg.bidirectional)  # fmt: skip
        tt = self._times(t, B, n + 1, dev)
        # A shallow copy of each layer: the forward appends to the copy, the cached tensors stay as they are.
        scratch = copy.copy(cache.hf)
        scratch.layers = [copy.copy(layer) for layer in cache.hf.layers]
        return self._run(self._embed(x, tt), pos, allowed, scratch)[:, :n]

    def _fixed_denoise(self, xt_block: Tensor, t, cache: HFBlockCache) -> Tensor:
        """`denoise` on the fixed-shape cache: the anchor and the block at positions s..s+n from the device value
        s = `cache.position`, their keys in the scratch slots after the clean stream's buffer, attending all of it
        under `block_allowed` (which already leaves out the clean positions from s on: unfilled, or the anchor)."""
        B, n = xt_block.shape
        dev, k, C = xt_block.device, self.block_length, cache.hf.capacity
        x = torch.cat([cache.anchor[:, None], xt_block], 1)
        s = cache.position
        idx = torch.arange(C + n + 1, device=dev)
        noisy = idx >= C
        keys = torch.where(noisy, s + idx - C, idx)  # the clean stream's buffer holds position p at index p
        block = torch.where(noisy, s.div(k, rounding_mode="floor"), clean_blocks(keys, k))
        allowed = block_allowed((keys[C:], block[C:], noisy[C:]), (keys, block, noisy), k, self.cfg.bidirectional)
        tt = self._times(t, B, n + 1, dev)
        cache.hf.scratch = True
        try:
            return self._run(self._embed(x, tt), keys[C:], allowed, cache.hf)[:, :n]
        finally:
            cache.hf.scratch = False
