"""A DiffusionGemma checkpoint (transformers' `DiffusionGemmaForBlockDiffusion`) as a tcsm block denoiser on the
uniform block path (MATH.md §9, "A time-blind denoiser": what its missing time input means for the bound).

The model is a uniform-source block-diffusion model: a causal encoder reads the clean prefix (prompt and finished
canvases) into a KV cache; the same weights, run bidirectionally over one noisy canvas of `config.canvas_length`
tokens, read that cache and give the canvas's logits. The canvas is tcsm's block: `block_length = canvas_length`.

* `forward(x_t, t, x1=x_1)`: every block's logits in one encoder pass over x_1 and one decoder pass over x_t, with an
  attention mask that lets the noisy block b read the clean keys before it exactly as the model's own cache would
  hold them (all of them in full-attention layers, the last `sliding_window − 1` in sliding layers) and its own
  noisy keys; equal to running the model once per canvas (tested).
* `new_cache / extend_cache / denoise`: the model's own encoder KV cache (a transformers `DynamicCache`) and its
  own decoder call, as its `generate()` makes them.
* time: the model has no time input, so `t` is ignored; it infers the noise level from x_t itself.
* self-conditioning: `self_cond=` logits of the previous step (the model's `self_conditioning_logits`), off by
  default and always off in the bound (its first-step denoiser). With `self_conditioning=True` the cached decoder
  call feeds back the previous step's logits of the block being drawn, as `generate()` does.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tcsm.models.config import ModelConfig
from tcsm.models.kinds import ModelKind
from tcsm.models.layers import cache_capacity, write_in_place

__all__ = ["DIFFUSION_GEMMA", "DiffusionGemmaCache", "DiffusionGemmaDenoiser", "DiffusionGemmaDenoiserConfig", "check_canvas_fit",
           "draw_seed"]


@dataclass
class DiffusionGemmaDenoiserConfig(ModelConfig):
    """What the samplers and checks ask a denoiser's `cfg` for."""

    vocab_size: int
    num_states: int
    max_len: int
    block_length: int
    self_conditioning: bool = False
    time_conditioning: bool = False
    hidden_size: int = 0  # the model's width, which sizes a DRE ratio head over it


def check_canvas_fit(length: int, block_length: int, path_block_length: int | None = None) -> None:
    """One-line ValueError when a sequence of `length` is not whole canvases, or the path's blocks are not them."""
    if path_block_length is not None and int(path_block_length) != int(block_length):
        raise ValueError(
            f"path.block_length={path_block_length} but the DiffusionGemma model's canvas_length is {block_length}; "
            f"set path.block_length={block_length} (or leave it unset)"
        )
    if int(length) % int(block_length):
        raise ValueError(
            f"sequence length {length} is not a multiple of the DiffusionGemma canvas_length={block_length}; "
            f"use a data length that is a multiple of {block_length}"
        )


#: its kind (registered under `model.name: diffusion_gemma` by its family module, `builders.diffusion_gemma`)
DIFFUSION_GEMMA = ModelKind(
    "denoiser", "blocks", "diffusion_gemma", "a DiffusionGemma block-diffusion model (uniform source)", blocks=True,
    offers=frozenset({"encoder_lm", "self_conditioning", "router", "decode_from"}),
)


class DiffusionGemmaCache:
    """The model's encoder KV cache of the clean tokens at positions 0..length−1 (shared across the batch), and
    the previous step's logits of the block being drawn (self-conditioning only).

    With `fixed_shape` (`new_cache(..., fixed_shape=True)`, the decode engine's cache) `hf` is a `_PrefixBuffers`:
    every layer's keys and values live in buffers of `capacity` positions allocated once and written in place,
    `position` (a 1-element long tensor on the device, kept equal to `length`) places `denoise`'s block,
    and the self-conditioning logits are a buffer too, switched per row by `has_previous`: every `denoise` call
    then has one shape for the whole decode and reads no host value."""

    def __init__(self, hf_cache, batch_size: int, position: Tensor | None = None):
        self.hf = hf_cache
        self.batch_size = int(batch_size)
        self.length = 0
        self.position = position
        self.previous_logits: Tensor | None = None
        self.has_previous: Tensor | None = None

    @property
    def step_state(self) -> tuple[Tensor, ...]:
        """The fixed-shape cache's tensors that `denoise` updates in place (what a captured call's warm-up must
        leave as it found them)."""
        if self.position is None or self.has_previous is None:
            return ()
        return self.previous_logits, self.has_previous


class _PrefixLayer:
    """One layer's preallocated keys / values [B, kv_heads, capacity, head_dim], as the decoder reads a static
    cache layer (`cumulative_length` = capacity: its canvas keys go right after the whole buffer)."""

    def __init__(self, capacity: int):  # (keys / values: set by `_PrefixBuffers`)
        self.keys: Tensor | None = None
        self.values: Tensor | None = None
        self.cumulative_length = int(capacity)

    @property
    def device(self):
        return self.keys.device


class _PrefixBuffers:
    """The clean prefix in preallocated buffers, in the cache interface the model's attention layers call: the
    encoder's `update` writes its new keys in place at positions `length`.. and attends over the buffer up to
    them (a view, no concatenation); the decoder sees a static cache (`is_compileable`) and attends over the whole
    buffer and its canvas, the positions past the prefix masked by `DiffusionGemmaDenoiser._fixed_masks`."""

    is_compileable = True

    def __init__(self, layouts: list[tuple[Tensor, Tensor]], batch_size: int, capacity: int, device):
        self.capacity = int(capacity)
        self.layers = [_PrefixLayer(capacity) for _ in layouts]
        for layer, (k, v) in zip(self.layers, layouts):
            layer.keys, layer.values = (torch.zeros(batch_size, a.shape[1], self.capacity, a.shape[3], dtype=a.dtype,
                                                    device=device) for a in (k, v))  # fmt: skip
        self.length = 0  # where the encoder's next update writes (host int: extend_cache runs outside the graph)

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs):
        layer = self.layers[layer_idx]
        return write_in_place(layer.keys, layer.values, key_states, value_states, self.length, self.capacity)


class DiffusionGemmaDenoiser(nn.Module):
    """x_t [B, L], per-position t [B, L] (ignored), x_1 [B, L] → logits [B, L, V] of a DiffusionGemma model."""

    model_kind = DIFFUSION_GEMMA

    def __init__(self, hf_model: nn.Module, *, self_conditioning: bool = False):
        super().__init__()
        config = hf_model.config
        text = config.get_text_config()
        if getattr(text, "use_bidirectional_attention", None) == "all":
            raise ValueError("this DiffusionGemma encoder attends both ways (use_bidirectional_attention='all'), so "
                             "its prefix cache is not causal; tcsm needs the causal encoder of the released models")  # fmt: skip
        if config._attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"attn_implementation {config._attn_implementation!r} is not supported here; load the "
                             "model with attn_implementation='sdpa' or 'eager'")  # fmt: skip
        self.hf = hf_model
        self.block_length = int(config.canvas_length)
        self.vocab_size = int(text.vocab_size)
        self.sliding_window = int(text.sliding_window)
        self.layer_types = tuple(text.layer_types)
        self.cfg = DiffusionGemmaDenoiserConfig(
            self.vocab_size, self.vocab_size, int(text.max_position_embeddings), self.block_length,
            bool(self_conditioning), hidden_size=int(text.hidden_size),
        )  # fmt: skip
        # tcsm checkpoints hold the Hugging Face state dict as the model saves it (tied copies once, its own names),
        # so a checkpoint's model.safetensors and `save_pretrained`'s are the same file.
        self._register_state_dict_hook(_to_hf_names)
        self._register_load_state_dict_pre_hook(_from_hf_names, with_module=True)

    # ------------------------------------------------------------------------------------------ one pass
    def forward(self, xt: Tensor, t: Tensor | None = None, x1: Tensor | None = None, *, self_cond=None,
                self_cond_mask: Tensor | None = None, encoder_logits: bool = False, decode_from: int = 0,
                self_cond_first_pass: bool = False):  # fmt: skip
        """Logits of every block b given (x_t^b, x_1^{<b}), in one encoder and one decoder pass (MATH.md §9).
        `self_cond_mask` [B] switches the self-conditioning input per sequence (the model's own mask); with
        `encoder_logits=True` also the causal encoder's next-token logits over x_1 (position i predicts x_1^{i+1}),
        which the same encoder pass gives: (logits, encoder logits). `decode_from` (a multiple of the block length):
        only the blocks from that position on are decoded (their logits [B, L − decode_from, V]; `self_cond` of that
        shape), for a loss that scores nothing before it. `self_cond_first_pass=True`: the decoder first runs without
        self-conditioning (no gradient) and its detached logits are the `self_cond` of the second, returned, pass
        (the training recipe's self-conditioning), both reading the one encoder cache."""
        if x1 is None:
            raise ValueError("a block denoiser needs the clean sequence: call model(xt, t, x1=x1)")
        if xt.dim() != 2 or tuple(x1.shape) != tuple(xt.shape):
            raise ValueError(f"xt and x1 must be [batch, length] token ids of one shape, got {tuple(xt.shape)} and "
                             f"{tuple(x1.shape)}")  # fmt: skip
        L = xt.shape[1]
        check_canvas_fit(L, self.block_length)
        if L > self.cfg.max_len:
            raise ValueError(f"sequence length {L} exceeds the model's max_position_embeddings={self.cfg.max_len}")
        from transformers import DynamicCache  # the model itself needs transformers

        pos = torch.arange(L, device=xt.device)
        cache = DynamicCache()  # full layers: every clean key stays, the masks below choose what each query reads
        encoded = self.hf.model.encoder(
            input_ids=x1, cache=cache, position_ids=pos[None], attention_mask=self._encoder_masks(pos)
        )
        lo = int(decode_from)
        if lo % self.block_length or not 0 <= lo < L:
            raise ValueError(f"decode_from={lo} must be a multiple of the block length {self.block_length} below {L}")
        cache.crop(-self.block_length)  # no block reads the last block's clean keys: the decoder need not hold them
        masks = self._decoder_masks(pos, lo)

        def decode(sc):
            return self.hf(
                cache=cache, decoder_input_ids=xt[:, lo:], decoder_position_ids=pos[None, lo:],
                decoder_attention_mask=masks, self_conditioning_logits=sc,
                self_conditioning_mask=None if sc is None else self_cond_mask,
            )  # fmt: skip

        if self_cond_first_pass:
            if self_cond is not None:
                raise ValueError("give self_cond or self_cond_first_pass=True, not both")
            with torch.no_grad():  # the decoder only reads the cache: the second pass reuses it
                self_cond = decode(None).logits.detach()
        out = decode(self_cond)
        if not encoder_logits:
            return out.logits.float()
        return out.logits.float(), self._head(encoded.last_hidden_state)

    def _head(self, hidden: Tensor) -> Tensor:
        """The model's LM head with its final logit soft-capping (what its forward applies to the decoder)."""
        cap = self.hf.final_logit_softcapping
        logits = self.hf.lm_head(hidden).float()
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def router_parameters(self) -> list[nn.Parameter]:
        """The MoE routers' parameters (each layer's expert-choice projection and scales), shared by encoder and
        decoder: what a fine-tune that keeps the routing fixed freezes."""
        return [p for n, p in self.hf.named_parameters() if ".router." in n]

    def _mask(self, allowed: Tensor) -> Tensor:
        """A [1, 1, q, kv] mask in the form the attention implementation reads (boolean for sdpa, additive else)."""
        if self.hf.config._attn_implementation == "sdpa":
            return allowed[None, None]
        dtype = self.hf.dtype
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )[None, None]

    def _encoder_masks(self, pos: Tensor) -> dict:
        """The encoder's own masks: causal; sliding layers see the last `sliding_window` positions."""
        return self._causal_masks(pos[:, None], pos[None, :])

    def _causal_masks(self, q: Tensor, k: Tensor) -> dict:
        """Masks of queries q [n, 1] over keys k [1, m]: causal; sliding layers see the last `sliding_window`."""
        causal = k <= q
        return {"full_attention": self._mask(causal),
                "sliding_attention": self._mask(causal & (k > q - self.sliding_window))}  # fmt: skip

    def _decoder_masks(self, pos: Tensor, lo: int = 0) -> dict:
        """Noisy block b reads the clean keys the model's cache holds after encoding x_1^{<b} — all of them in full
        layers, the last `sliding_window − 1` in sliding ones (a `DynamicSlidingWindowLayer`) — and its own block;
        queries and noisy keys are the positions from `lo` on, the clean keys all of them."""
        q = pos[lo:]
        start = (q // self.block_length * self.block_length)[:, None]  # first position of each query's block
        k, kn = pos[None, : len(pos) - self.block_length], q[None, :]  # the cache without the last block's keys
        prefix = k < start
        own = (kn >= start) & (kn < start + self.block_length)
        recent = prefix & (k >= start - (self.sliding_window - 1))
        return {"full_attention": self._mask(torch.cat([prefix, own], 1)),
                "sliding_attention": self._mask(torch.cat([recent, own], 1))}  # fmt: skip

    # ------------------------------------------------------------------------------------------ KV cache
    #: `new_cache(..., fixed_shape=True)`: `denoise` at a device position, one shape per decode (sampling.engine)
    fixed_shape_cache = True

    def new_cache(self, batch_size: int, fixed_shape: bool = False, capacity: int | None = None) -> DiffusionGemmaCache:
        """An empty encoder cache, ready for `denoise` at position 0: the model's own `DynamicCache` layers, or with
        `fixed_shape` preallocated buffers of `capacity` positions (default max_position_embeddings) written in
        place (`DiffusionGemmaCache`)."""
        p = next(self.hf.parameters())
        if fixed_shape:
            cap = cache_capacity(capacity, self.cfg.max_len)
            buffers = _PrefixBuffers(self._key_layouts(p.device), int(batch_size), cap, p.device)
            cache = DiffusionGemmaCache(buffers, batch_size, torch.zeros(1, dtype=torch.long, device=p.device))
            if self.cfg.self_conditioning:
                cache.previous_logits = torch.zeros(int(batch_size), self.block_length, self.vocab_size,
                                                    dtype=p.dtype, device=p.device)  # fmt: skip
                cache.has_previous = torch.zeros(int(batch_size), dtype=torch.bool, device=p.device)
            return cache
        from transformers import DynamicCache

        cache = DynamicCache(config=self.hf.config.get_text_config())
        empty = torch.empty(int(batch_size), 1, 0, 1, dtype=p.dtype, device=p.device)
        for layer in cache.layers:
            layer.lazy_initialization(empty, empty)  # an empty prefix: the decoder reads zero cached keys
        return DiffusionGemmaCache(cache, batch_size)

    def extend_cache(self, cache: DiffusionGemmaCache, x_clean: Tensor) -> None:
        """Encode clean tokens at positions cache.length.. into the cache (the model's causal encoder)."""
        n = int(x_clean.shape[1])
        if n == 0:
            return
        pos = torch.arange(cache.length, cache.length + n, device=x_clean.device)
        if cache.position is None:
            self.hf.model.encoder(input_ids=x_clean, cache=cache.hf, position_ids=pos[None])
            cache.previous_logits = None
        else:  # the buffers written in place, under the masks the model's own cache would give these queries
            masks = self._prefix_masks(cache.length, cache.length + n, x_clean.device)
            self.hf.model.encoder(input_ids=x_clean, cache=cache.hf, position_ids=pos[None], attention_mask=masks)
            cache.hf.length += n
            cache.position.fill_(cache.length + n)  # a device write, no host read
            if cache.has_previous is not None:
                cache.has_previous.fill_(False)
        cache.length += n

    def _native_cache(self, engine: str, device, total: int) -> dict:
        """generate()'s cache arguments for `native_generate` (its docstring)."""
        if engine != "graph" or not _static_fits(total, self.sliding_window):
            return {}
        return {"cache_implementation": "static", "disable_compile": torch.device(device).type != "cuda"}

    def _key_layouts(self, device) -> list[tuple[Tensor, Tensor]]:
        """One position's keys and values [1, heads, 1, dim] of every encoder layer, as the encoder makes them here
        (full and sliding layers may differ in heads and dim, and keys and values in dtype under autocast): one
        token's encoder call on a throwaway cache."""
        from transformers import DynamicCache

        probe = DynamicCache(config=self.hf.config.get_text_config())
        one = torch.zeros(1, 1, dtype=torch.long, device=device)
        self.hf.model.encoder(input_ids=one, cache=probe, position_ids=one, attention_mask=self._prefix_masks(0, 1, device))
        return [(layer.keys, layer.values) for layer in probe.layers]

    def _prefix_masks(self, start: int, end: int, device) -> dict:
        """The encoder's masks for queries start..end−1 over keys 0..end−1: causal; sliding layers see the last
        `sliding_window` positions."""
        return self._causal_masks(torch.arange(start, end, device=device)[:, None], torch.arange(end, device=device)[None, :])

    def _fixed_masks(self, position: Tensor, n: int, capacity: int) -> dict:
        """The decoder's masks for a block of n at the device `position` over the whole buffer and the block: the
        cached prefix (all of it in full layers, its last `sliding_window − 1` keys in sliding ones, as the model's
        own cache holds them) and the block itself; the buffer past the prefix is masked."""
        k = torch.arange(capacity + n, device=position.device)
        own = k >= capacity
        prefix = k < position
        recent = prefix & (k >= position - (self.sliding_window - 1))
        return {"full_attention": self._mask((prefix | own).expand(n, -1)),
                "sliding_attention": self._mask((recent | own).expand(n, -1))}  # fmt: skip

    def denoise(self, xt_block: Tensor, t, cache: DiffusionGemmaCache, *, self_cond: Tensor | None = None) -> Tensor:
        """Logits [B, n, V] of the block at positions cache.length.. given the cached prefix (t ignored)."""
        n = int(xt_block.shape[1])
        if cache.position is not None:
            return self._fixed_denoise(xt_block, cache, self_cond)
        if self_cond is None and self.cfg.self_conditioning:
            self_cond = cache.previous_logits
        pos = torch.arange(cache.length, cache.length + n, device=xt_block.device)
        logits = self.hf(cache=cache.hf, decoder_input_ids=xt_block, decoder_position_ids=pos[None],
                         self_conditioning_logits=self_cond).logits.float()  # fmt: skip
        if self.cfg.self_conditioning:
            cache.previous_logits = logits.detach()
        return logits

    def _fixed_denoise(self, xt_block: Tensor, cache: DiffusionGemmaCache, self_cond: Tensor | None) -> Tensor:
        """`denoise` on the fixed-shape cache: positions and masks from `cache.position` (device values), the
        previous logits fed through the buffer and switched off per row by `has_previous` (the model's
        self-conditioning mask zeroes the signal, as no logits would)."""
        n = int(xt_block.shape[1])
        pos = cache.position + torch.arange(n, device=xt_block.device)
        sc_mask = None
        if self_cond is None and self.cfg.self_conditioning:
            self_cond, sc_mask = cache.previous_logits[:, :n], cache.has_previous
        logits = self.hf(cache=cache.hf, decoder_input_ids=xt_block, decoder_position_ids=pos[None],
                         decoder_attention_mask=self._fixed_masks(cache.position, n, cache.hf.capacity),
                         self_conditioning_logits=self_cond, self_conditioning_mask=sc_mask).logits.float()  # fmt: skip
        if self.cfg.self_conditioning:
            cache.previous_logits[:, :n].copy_(logits)
            cache.has_previous.fill_(True)
        return logits

    # ------------------------------------------------------------------------------------------ its own sampler
    @torch.no_grad()
    def native_generate(self, prompt: Tensor | None, length: int, *, steps: int, generator=None,
                        device=None, engine: str = "eager") -> tuple[Tensor, int]:  # fmt: skip
        """(tokens [B, length], decoder calls) from the model's own `generate()` (its entropy-bound sampler with
        self-conditioning, at most `steps` denoising steps per canvas), continuing `prompt` [B, P]. Its encoder
        cannot read an empty prefix, so without a prompt it starts from the model's BOS, which is not returned.

        With `engine="graph"` (the decode engine, resolved by the caller) generate() runs on the model's own static cache
        (`cache_implementation="static"`, its functions compiled on CUDA) where that is exact: when the whole
        sequence fits the sliding window. Past it transformers' static sliding layers hold one key more than its
        dynamic ones (the samples differ), so the DynamicCache path runs."""
        text = self.hf.config.get_text_config()
        device = device if device is not None else next(self.hf.parameters()).device
        lead = prompt is None or prompt.shape[1] == 0
        if lead:
            if text.bos_token_id is None:
                raise ValueError("this DiffusionGemma config has no bos_token_id to start from: give a prompt")
            num = 1 if prompt is None else prompt.shape[0]
            prompt = torch.full((num, 1), int(text.bos_token_id), dtype=torch.long, device=device)
        new = int(length) - (0 if lead else prompt.shape[1])
        # generate() draws from torch's global stream: seed it from `generator`, leaving the caller's stream as it was
        seed = draw_seed(generator)
        devices = [device] if torch.device(device).type == "cuda" else []
        with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
            # generate() imports torch's compiler stack, whose import warns of torch.jit's deprecation: not the user's
            warnings.filterwarnings("ignore", message=r".*torch\.jit", category=DeprecationWarning)
            torch.manual_seed(seed)
            kw = self._native_cache(engine, device, prompt.shape[1] + new)
            out = self.hf.generate(prompt.to(device), max_new_tokens=new, max_denoising_steps=int(steps), **kw)
        seqs = out.sequences[:, 1:] if lead else out.sequences
        calls = math.ceil(new / self.block_length) * int(steps)  # an upper bound: canvases may stop early
        return seqs[:, : int(length)], calls


def _static_fits(total: int, sliding_window: int) -> bool:
    """Whether a sequence of `total` tokens never fills a sliding layer's cache (transformers' static and dynamic
    sliding layers then hold the same keys)."""
    return total <= sliding_window - 1


def draw_seed(generator: torch.Generator | None) -> int:
    """A seed for a stream of its own, drawn from `generator` on the generator's device (a CUDA generator cannot
    draw a CPU tensor), or from torch's global CPU stream without one."""
    device = generator.device if generator is not None else "cpu"
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=device))


def _to_hf_names(module: DiffusionGemmaDenoiser, state: dict, prefix: str, local_metadata) -> dict:
    """state_dict hook: `hf.<name>` → `<name>`, the tied copies dropped (what `save_pretrained` writes)."""
    tied = _tied_now(module.hf)
    own = prefix + "hf."
    for key in list(state):
        if key.startswith(own):
            value = state.pop(key)
            name = key[len(own):]
            if name not in tied:
                state[prefix + name] = value
    return state


def _from_hf_names(module: DiffusionGemmaDenoiser, state: dict, prefix: str, *args) -> None:
    """load_state_dict pre-hook: `<name>` → `hf.<name>`, each tied copy filled from the weight it is tied to."""
    tied = _tied_now(module.hf)
    for key in [k for k in state if k.startswith(prefix) and not k.startswith(prefix + "hf.")]:
        state[prefix + "hf." + key[len(prefix):]] = state.pop(key)
    for copy, source in tied.items():
        if prefix + "hf." + source in state:
            state.setdefault(prefix + "hf." + copy, state[prefix + "hf." + source])


def _tied_now(hf) -> dict[str, str]:
    """The model's tied copies {copy: source} under its current parameter names: a LoRA-adapted layer's weight is
    `<layer>.base_layer.weight`, still one tensor shared by the encoder and the decoder."""
    now = {n.replace(".base_layer.", "."): n for n in hf.state_dict(keep_vars=True)}
    return {now.get(c, c): now.get(src, src) for c, src in hf.all_tied_weights_keys.items()}
