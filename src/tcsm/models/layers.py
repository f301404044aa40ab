"""Transformer building blocks shared by every model family in tcsm.

The bidirectional denoiser (`tcsm.models.transformer`), causal AR models, BERT-style masked LMs and Hollow
transformers are all stacks of the same pieces, so these pieces have a small, stable API:

* `RMSNorm(dim)`, `LayerNorm(dim)` (no bias), `make_norm(kind, dim)` with kind in {"layernorm", "rmsnorm"}.
  Both normalise in float32 and return the input dtype, so bf16 autocast stays stable.
* `RotaryEmbedding(head_dim, max_len, base=10000)`: caches cos/sin tables; `rope(seq_len, offset=0)`
  returns `(cos, sin)` of shape [seq_len, head_dim] for positions offset..offset+seq_len−1.
  `apply_rotary(x, cos, sin)` rotates x[..., L, head_dim] (rotate-half convention).
* `MultiHeadAttention(d_model, n_heads, dropout=0.0, kernel="auto")`:
  `forward(x, rope=None, attn_mask=None, is_causal=False, kv=None, rope_kv=None, cache=None)`. `kernel` picks the attention
  implementation: "sdpa" (`F.scaled_dot_product_attention`), "math" (explicit softmax(QKᵀ/√d)V, softmax in
  float32) or "auto" (`attention_kernel`: the faster of the two as measured for the device and dtype).
  Self-attention by default; pass `kv` [B, Lk, d] for cross-attention (queries from x, keys/values from kv —
  the Hollow transformer's mixing layers need this). `attn_mask` follows
  `torch.nn.functional.scaled_dot_product_attention`: a bool tensor broadcastable to [B, H, Lq, Lk] where True
  means "may attend", or a float tensor added to the scores. `is_causal=True` restricts query i to keys ≤ i
  (combined with `attn_mask` if both are given). A FlexAttention `BlockMask` as `attn_mask` runs
  `flex_attention` under it whatever `kernel` says (`flex_attend`: compiled on a GPU, forward only on a CPU).
  `rope` = (cos, sin) for the query positions; keys use `rope_kv` when given, else `rope` (so both streams share positions 0..L−1). `cache`: an object whose
  `update(k, v)` ([B, H, n, Dh], rotated) returns the keys / values to attend to, earlier positions' first (a KV
  cache; `rope` then holds the tables of the new positions only).
* `MLP(d_model, mlp_ratio=4, dropout=0.0)`: Linear → GELU(tanh) → Linear.
* `TimestepEmbedder(cond_dim, freq_dim=256, scale=1000)`: t ∈ [0, 1] of shape [B] → [B, cond_dim], a
  sinusoidal embedding of scale·t followed by a two-layer MLP (as in DiT / SEDD).
* `TransformerBlock(d_model, n_heads, mlp_ratio=4, dropout=0.0, cond_dim=None, causal=False, norm="layernorm",
  kernel="auto")`:
  pre-norm attention + MLP with residuals; `forward(x, rope=None, cond=None, attn_mask=None, kv=None, cache=None)`.
  With `cond_dim`, a conditioning vector c [B, cond_dim] (or one per group of consecutive positions, [B, G, cond_dim])
  produces per-sequence (per-group) (shift, scale, gate) for both
  sub-layers through SiLU → Linear (adaLN, DiT/SEDD). That linear is zero-initialised, so at initialisation
  every gate is 0 and the block is the identity: a deep stack starts as a shallow one and trains stably.
  Without `cond_dim` the block is a standard pre-norm block (no time pathway at all).
* `modulate(x, shift, scale)` = x·(1 + scale) + shift with per-sequence shift/scale [B, d] or per group of
  consecutive positions [B, G, d]; `gate(g, h)` = g ⊙ h likewise.
* `batch_invariance(enabled)`: a context in which `row_stable` and the AR decode keep a row's bits independent of
  its batch (the default) or run one product over all rows (faster at large batch, batch-dependent last bits).
* `init_weights(module, std=0.02)`: GPT-2-style normal init for Linear/Embedding, used via `model.apply`;
  it skips layers marked `_zero_init = True`, so zero-initialised gates/heads survive it.

Tensors are batch-first: [B, L, d_model]. Nothing here knows about paths, time direction or objectives.
"""

from __future__ import annotations

import functools
import math
import warnings
from contextlib import contextmanager
from contextvars import ContextVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask, flex_attention

__all__ = [
    "ACTIVATIONS",
    "MLP",
    "LayerNorm",
    "MultiHeadAttention",
    "RMSNorm",
    "RotaryEmbedding",
    "TimestepEmbedder",
    "TransformerBlock",
    "apply_rotary",
    "attention_kernel",
    "batch_invariance",
    "batch_invariant",
    "cache_capacity",
    "flex_attend",
    "gate",
    "init_weights",
    "make_norm",
    "modulate",
    "write_in_place",
    "zero_init_",
]


# --- normalisation ---------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x²) + eps) · w, computed in float32 (bf16 mean-of-squares loses too many bits)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


class LayerNorm(nn.Module):
    """LayerNorm with a weight and no bias (the bias is redundant before a linear layer), in float32."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        y = F.layer_norm(x.float(), (x.shape[-1],), self.weight.float(), None, self.eps)
        return y.to(x.dtype)


def make_norm(kind: str, dim: int) -> nn.Module:
    """Build a norm by name: "layernorm" (bias-free) or "rmsnorm"."""
    kind = kind.lower()
    if kind == "layernorm":
        return LayerNorm(dim)
    if kind == "rmsnorm":
        return RMSNorm(dim)
    raise ValueError(f"unknown norm {kind!r}; choose 'layernorm' or 'rmsnorm'")


# --- rotary position embeddings --------------------------------------------------------------------------


class RotaryEmbedding(nn.Module):
    """Rotary position embedding tables, cached for positions 0..max_len−1 (grown on demand)."""

    def __init__(self, head_dim: int, max_len: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head dimension, got {head_dim}")
        self.head_dim, self.base = int(head_dim), float(base)
        inv_freq = 1.0 / (self.base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        # Non-persistent: the tables are a pure function of (head_dim, base), so checkpoints need not hold them.
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._build(int(max_len))

    def _build(self, n: int) -> None:
        pos = torch.arange(n, dtype=torch.float32, device=self.inv_freq.device)
        freqs = torch.outer(pos, self.inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)  # [n, head_dim], matches the rotate-half pairing
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(
        self, seq_len: int, offset: int = 0, dtype: torch.dtype | None = None
    ) -> tuple[Tensor, Tensor]:
        """(cos, sin), each [seq_len, head_dim], for positions offset..offset+seq_len−1, in float32 or `dtype`
        (cast once here instead of in every layer's `apply_rotary`)."""
        end = offset + seq_len
        if end > self.cos_cached.shape[0]:
            self._build(end)
        cos, sin = self.cos_cached[offset:end], self.sin_cached[offset:end]
        if dtype is not None and dtype != cos.dtype:
            cos, sin = cos.to(dtype), sin.to(dtype)
        return cos, sin


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x[..., L, head_dim] by position: x·cos + rotate_half(x)·sin (cos/sin are [L, head_dim], or any
    shape broadcastable to x, e.g. [L, 1, head_dim] for x laid out [B, L, heads, head_dim]).

    Callers that rotate many tensors pass tables already in x's dtype (`RotaryEmbedding(..., dtype=)`), so the
    casts below are no-ops on the hot path. rotate_half(x) = [x2, x1]·(−1 on the first half), so the sign moves
    onto the small table and x passes through three kernels (cat, mul, addcmul) instead of five."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    s1, s2 = sin.chunk(2, dim=-1)
    return torch.addcmul(x * cos, torch.cat([x2, x1], dim=-1), torch.cat([-s1, s2], dim=-1))


# --- attention and MLP -----------------------------------------------------------------------------------


KERNELS = ("auto", "sdpa", "math")


def attention_kernel(device_type: str, dtype: torch.dtype) -> str:
    """The attention implementation that measured faster (forward + backward) for a device and dtype.

    CPU, bf16: PyTorch's fused CPU kernel runs its backward slowly in bf16; the explicit form was 2–4× faster at
    L = 32…256 (B = 16, 4 heads of 64; docs/benchmarks.md "Training speed"). CPU fp32 and GPUs: SDPA (on GPUs the
    flash / memory-efficient kernels)."""
    return "math" if device_type == "cpu" and dtype == torch.bfloat16 else "sdpa"


def _math_attention(
    q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool, dropout: float
):
    """softmax(QKᵀ/√d + mask) V with the softmax in float32 (same semantics as SDPA's masks and is_causal)."""
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if is_causal:
        lq, lk = scores.shape[-2:]
        keep = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril()
        attn_mask = (
            keep
            if attn_mask is None
            else (
                attn_mask & keep
                if attn_mask.dtype == torch.bool
                else attn_mask.masked_fill(~keep, float("-inf"))
            )
        )
    scores = scores.float()
    if attn_mask is not None:
        scores = (
            scores.masked_fill(~attn_mask, float("-inf"))
            if attn_mask.dtype == torch.bool
            else scores + attn_mask
        )
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    if dropout > 0:
        probs = F.dropout(probs, dropout)
    return probs @ v


@functools.cache
def _compiled_flex():
    # flex_attention outside torch.compile materialises the whole score matrix: compile it once (per shape, as
    # dynamo specialises) into the fused kernel that skips the masked-out tiles
    return torch.compile(flex_attention, dynamic=False)


def flex_attend(q: Tensor, k: Tensor, v: Tensor, block_mask: BlockMask) -> Tensor:
    """softmax(QKᵀ/√d) V over the pairs `block_mask` allows, by FlexAttention: the fused kernel on a GPU (compiled
    here unless the caller is already being compiled); on a CPU the unfused forward, which this torch cannot
    differentiate."""
    if q.device.type == "cpu" and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        raise ValueError(
            "attention=flex has no backward pass on the CPU (FlexAttention); "
            "train on a CPU with model.attention=auto, sdpa or math"
        )
    if torch.compiler.is_compiling():  # the caller's graph fuses it
        return flex_attention(q, k, v, block_mask=block_mask)
    if q.device.type != "cpu":
        return _compiled_flex()(q, k, v, block_mask=block_mask)
    with warnings.catch_warnings():  # the CPU path is the unfused one by design (exactness checks, inference)
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, block_mask=block_mask)


class MultiHeadAttention(nn.Module):
    """Multi-head attention; `kernel` "sdpa" (flash / memory-efficient kernels when available), "math", or "auto"
    (`attention_kernel` per device and dtype)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, kernel: str = "auto"):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        if kernel not in KERNELS:
            raise ValueError(f"unknown attention kernel {kernel!r}; choose one of {list(KERNELS)}")
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.dropout = float(dropout)
        self.kernel = kernel
        # One fused projection for q, k, v: a single matmul is faster for self-attention; cross-attention
        # uses slices of the same weight, so both modes share parameter names.
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)

    def _heads(self, x: Tensor) -> Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.n_heads, self.head_dim)  # [B, n, H, Dh]

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None = None,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        kv: Tensor | None = None,
        rope_kv: tuple[Tensor, Tensor] | None = None,
        cache=None,
    ) -> Tensor:
        # Rotary embedding in the projections' own [B, n, H, Dh] layout (rows contiguous), q and k of
        # self-attention in one call; the [B, H, n, Dh] view SDPA takes is made afterwards. Rotating after the
        # transpose made the element-wise work strided: on a GPU, 2.5 × the hand-written loop's non-matmul time.
        if kv is None:
            b, n, _ = x.shape
            qkv = self.qkv(x).view(b, n, 3, self.n_heads, self.head_dim)
            qk, v = qkv[:, :, :2], qkv[:, :, 2]
            if rope is not None:
                qk = apply_rotary(qk, *(r[:n, None, None] for r in rope))
            q, k = qk.unbind(2)
        else:
            w_q, w_kv = self.qkv.weight.split([self.d_model, 2 * self.d_model], dim=0)
            q = self._heads(F.linear(x, w_q))
            k, v = (self._heads(h) for h in F.linear(kv, w_kv).split(self.d_model, dim=-1))
            if rope is not None:
                rk = rope_kv if rope_kv is not None else rope
                q = apply_rotary(q, *(r[: q.shape[1], None] for r in rope))
                k = apply_rotary(k, *(r[: k.shape[1], None] for r in rk))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, n, Dh]
        if cache is not None:  # keys / values of earlier positions first (a KV cache: `cache.update`)
            k, v = cache.update(k, v)
        if isinstance(attn_mask, BlockMask):
            if is_causal or (self.dropout and self.training):
                raise ValueError("a FlexAttention block mask takes neither is_causal nor attention dropout")
            y = flex_attend(q, k, v, attn_mask)
        else:
            y = self._dense(q, k, v, attn_mask, is_causal)
        b, _, n, _ = y.shape
        return self.out(y.transpose(1, 2).reshape(b, n, self.d_model))

    def _dense(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, is_causal: bool) -> Tensor:
        """Attention under an explicit (or no) mask by `kernel`: SDPA or the explicit form."""
        lq, lk = q.shape[2], k.shape[2]
        if is_causal and (attn_mask is not None or lq != lk):
            # SDPA rejects is_causal together with a mask, and aligns its causal mask top-left when lq != lk
            # (wrong for a KV cache), so build the bottom-right-aligned constraint explicitly.
            if attn_mask is None:
                attn_mask = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
            causal = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril(lk - lq)
            if attn_mask.dtype == torch.bool:
                attn_mask = attn_mask & causal
            else:
                attn_mask = attn_mask.masked_fill(~causal, float("-inf"))
            is_causal = False
        dropout = self.dropout if self.training else 0.0
        kernel = self.kernel if self.kernel != "auto" else attention_kernel(q.device.type, q.dtype)
        if kernel == "math":
            return _math_attention(q, k, v, attn_mask, is_causal, dropout)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout, is_causal=is_causal)


# MLP nonlinearities by name: "gelu" is exact (erf); "gelu_tanh" its tanh approximation (DiT / SEDD / MDLM), which
# on a CPU in bf16 costs 5× the exact one (PyTorch's kernel: 4.1 vs 0.8 ms forward for 2M elements, one thread).
ACTIVATIONS = ("gelu", "gelu_tanh")


class MLP(nn.Module):
    """Position-wise feed-forward: Linear(d → r·d) → GELU (`activation`, one of ACTIVATIONS) → Linear(r·d → d)."""

    def __init__(self, d_model: int, mlp_ratio: float = 4, dropout: float = 0.0, activation: str = "gelu_tanh"):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; choose one of {list(ACTIVATIONS)}")
        hidden = round(mlp_ratio * d_model)
        self.fc = nn.Linear(d_model, hidden, bias=True)
        self.proj = nn.Linear(hidden, d_model, bias=True)
        self.drop = nn.Dropout(dropout)
        self.approximate = "tanh" if activation == "gelu_tanh" else "none"

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.drop(F.gelu(self.fc(x), approximate=self.approximate)))


# --- conditioning ---------------------------------------------------------------------------------------


#: BLAS (MKL on the CPU) multiplies matrices of 1–3 rows with another kernel, another summation order, than larger
#: ones; at 4 rows and more every row's result is the same whatever the row count (measured: docs/benchmarks.md)
ROW_FLOOR = 4


def cache_capacity(capacity: int | None, max_len: int) -> int:
    """The positions a fixed-shape decode cache holds: `capacity` (default `max_len`), refused past `max_len`."""
    cap = max_len if capacity is None else int(capacity)
    if not 0 < cap <= max_len:
        raise ValueError(f"capacity must be in [1, max_len={max_len}], got {capacity}")
    return cap


def write_in_place(keys: Tensor, values: Tensor, k: Tensor, v: Tensor, start: int, limit: int | None = None):
    """Store k, v [N, H, n, D] in the buffers keys / values [N, H, C, D] at positions start..start+n−1; the keys and
    values of positions < start + n (views). `limit`: the positions the buffers may hold (ValueError past it)."""
    end = start + k.shape[2]
    if limit is not None and end > limit:
        raise ValueError(f"the fixed-shape cache holds {limit} positions; writing up to {end} does not fit")
    keys[:, :, start:end] = k
    values[:, :, start:end] = v
    return keys[:, :, :end], values[:, :, :end]


_BATCH_INVARIANT: ContextVar[bool] = ContextVar("tcsm_batch_invariant", default=True)


@contextmanager
def batch_invariance(enabled: bool = True):
    """Within it, `row_stable` and the AR decode's per-sequence linears keep a row's bits independent of the batch
    it shares (the default), or, `enabled=False`, run one product over all rows: a row's last bits may then depend
    on its batch, and large batches decode faster on the CPU (docs/benchmarks.md)."""
    token = _BATCH_INVARIANT.set(bool(enabled))
    try:
        yield
    finally:
        _BATCH_INVARIANT.reset(token)


def batch_invariant() -> bool:
    """Whether the innermost `batch_invariance` context (default: on) keeps rows batch-invariant."""
    return _BATCH_INVARIANT.get()


def row_stable(fn, c: Tensor) -> Tensor:
    """fn(c) for per-sequence vectors c [..., d] with fewer rows than `ROW_FLOOR` padded up to it (their results
    dropped), so that a sequence's conditioning does not depend on how many sequences share the call (batch
    invariance of the samplers; off outside `batch_invariance`'s default)."""
    rows = c.reshape(-1, c.shape[-1])
    n = rows.shape[0]
    if n >= ROW_FLOOR or n == 0 or not batch_invariant():
        return fn(c)
    out = fn(torch.cat([rows, rows[:1].expand(ROW_FLOOR - n, -1)]))[:n]
    return out.reshape(*c.shape[:-1], out.shape[-1])


class TimestepEmbedder(nn.Module):
    """t [B] → [B, cond_dim]: sinusoidal features of scale·t, then Linear → SiLU → Linear (DiT / SEDD)."""

    def __init__(
        self, cond_dim: int, freq_dim: int = 256, scale: float = 1000.0, max_period: float = 10000.0
    ):
        super().__init__()
        if freq_dim % 2:
            raise ValueError(f"freq_dim must be even, got {freq_dim}")
        self.freq_dim, self.scale = freq_dim, float(scale)
        half = freq_dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32) / half)
        self.register_buffer("freqs", freqs, persistent=False)
        self.mlp = nn.Sequential(nn.Linear(freq_dim, cond_dim), nn.SiLU(), nn.Linear(cond_dim, cond_dim))

    def forward(self, t: Tensor) -> Tensor:
        # t lives in [0, 1]; scaling spreads it over the frequency range the table was designed for.
        args = (self.scale * t.float())[:, None] * self.freqs[None, :]
        return row_stable(self.mlp, torch.cat([torch.cos(args), torch.sin(args)], dim=-1))


def modulate(x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
    """x·(1 + scale) + shift, with per-sequence shift/scale [B, d] broadcast over positions, or per group [B, G, d]:
    one for each of G runs of L/G consecutive positions (G = L: per position; a block model: one per block, each
    block at its own time, without repeating the adaLN projection k times).

    Computed in the dtype of shift/scale: under bf16 autocast they come from a linear layer in bf16, and the
    next consumer is a linear layer that would cast to bf16 anyway, so float32 elementwise work here is waste."""
    if shift.dim() == 2:
        return x.to(shift.dtype) * (1 + scale[:, None, :]) + shift[:, None, :]
    B, L, d = x.shape
    G = shift.shape[1]
    y = x.to(shift.dtype).reshape(B, G, L // G, d) * (1 + scale[:, :, None, :]) + shift[:, :, None, :]
    return y.reshape(B, L, d)


def gate(g: Tensor, h: Tensor) -> Tensor:
    """g ⊙ h with the gate per sequence [B, d] or per group of positions [B, G, d] (as in `modulate`)."""
    if g.dim() == 2:
        return g[:, None, :] * h
    B, L, d = h.shape
    return (g[:, :, None, :] * h.reshape(B, g.shape[1], L // g.shape[1], d)).reshape(B, L, d)


def zero_init_(layer: nn.Linear) -> nn.Linear:
    """Zero a linear layer and mark it so `init_weights` leaves it at zero."""
    nn.init.zeros_(layer.weight)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
    layer._zero_init = True
    return layer


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """GPT-2-style init (normal(0, std), zero biases) for Linear/Embedding; skips `_zero_init` layers."""
    if getattr(module, "_zero_init", False):
        return
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=std)


# --- the block ------------------------------------------------------------------------------------------


class TransformerBlock(nn.Module):
    """Pre-norm transformer block; optional adaLN(-Zero) conditioning and causal attention.

    x ← x + g₁ · Attn(modulate(norm(x), s₁, a₁));  x ← x + g₂ · MLP(modulate(norm(x), s₂, a₂)),
    with (s, a, g) = SiLU(c) W (zero-initialised) when `cond_dim` is set, else s = a = 0, g = 1.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        mlp_ratio: float = 4,
        dropout: float = 0.0,
        cond_dim: int | None = None,
        causal: bool = False,
        norm: str = "layernorm",
        kernel: str = "auto",
        activation: str = "gelu_tanh",
    ):
        super().__init__()
        self.causal = bool(causal)
        self.norm1 = make_norm(norm, d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, dropout, kernel)
        self.norm2 = make_norm(norm, d_model)
        self.mlp = MLP(d_model, mlp_ratio, dropout, activation)
        self.drop = nn.Dropout(dropout)
        self.cond_dim = cond_dim
        if cond_dim is not None:
            self.adaLN = nn.Sequential(nn.SiLU(), zero_init_(nn.Linear(cond_dim, 6 * d_model, bias=True)))

    def forward(
        self,
        x: Tensor,
        rope: tuple[Tensor, Tensor] | None = None,
        cond: Tensor | None = None,
        attn_mask: Tensor | None = None,
        kv: Tensor | None = None,
        cache=None,
    ) -> Tensor:
        if self.cond_dim is None:
            if cond is not None:
                raise ValueError("this block was built without cond_dim, so it takes no conditioning vector")
            x = x + self.drop(self.attn(self.norm1(x), rope, attn_mask, self.causal, kv, cache=cache))
            return x + self.drop(self.mlp(self.norm2(x)))
        if cond is None:
            raise ValueError("this block was built with cond_dim, so it needs a conditioning vector `cond`")
        shift1, scale1, gate1, shift2, scale2, gate2 = row_stable(self.adaLN, cond).chunk(6, dim=-1)
        h = self.attn(modulate(self.norm1(x), shift1, scale1), rope, attn_mask, self.causal, kv, cache=cache)
        x = x + gate(gate1, self.drop(h))
        h = self.mlp(modulate(self.norm2(x), shift2, scale2))
        return x + gate(gate2, self.drop(h))


def build_trunk(net: nn.Module, cfg, **embeddings: int) -> None:
    """Give `net` the modules `run_trunk` runs, from a `TrunkConfig`: `embed` (input states → d_model), one more
    input embedding per keyword (name → rows, registered after `embed` in that order), `rotary`, `time_embed`,
    `blocks`, `final_norm` and the zero-initialised `final_adaLN`. Configs without `attention` / `activation`
    get the block's defaults."""
    net.embed = nn.Embedding(cfg.num_states, cfg.d_model)
    for name, rows in embeddings.items():
        setattr(net, name, nn.Embedding(rows, cfg.d_model))
    net.rotary = RotaryEmbedding(cfg.d_model // cfg.n_heads, cfg.max_len, cfg.rope_base)
    cond_dim = cfg.cond_dim if cfg.time_conditioning else None
    net.time_embed = TimestepEmbedder(cfg.cond_dim) if cfg.time_conditioning else None
    kernel, activation = getattr(cfg, "attention", "auto"), getattr(cfg, "activation", "gelu_tanh")
    if kernel not in KERNELS:  # "flex": a block model's one pass hands the layers a BlockMask; its other calls
        kernel = "auto"  # (the KV cache's) take the dense kernels' measured choice
    net.blocks = nn.ModuleList(
        TransformerBlock(
            cfg.d_model, cfg.n_heads, cfg.mlp_ratio, cfg.dropout, cond_dim, False, cfg.norm, kernel, activation
        )
        for _ in range(cfg.n_layers)
    )
    net.final_norm = make_norm(cfg.norm, cfg.d_model)
    net.final_adaLN = (
        nn.Sequential(nn.SiLU(), zero_init_(nn.Linear(cfg.cond_dim, 2 * cfg.d_model))) if cfg.time_conditioning else None
    )


def run_trunk(net: nn.Module, h: Tensor, rope, t: Tensor | None) -> Tensor:
    """The shared trunk of the `Denoiser` and the DRE `RatioHead` over input embeddings h [B, L, D]: adaLN time
    conditioning from `net.time_embed(t)` (when time-conditioned), `net.blocks`, `net.final_norm` and the final
    adaLN modulation. Returns the final hidden states [B, L, D]."""
    cond = None
    if net.time_embed is not None:
        t = torch.as_tensor(t, device=h.device).reshape(-1).expand(h.shape[0])
        cond = net.time_embed(t)
    for block in net.blocks:
        h = block(h, rope, cond)
    h = net.final_norm(h)
    if net.final_adaLN is not None:
        shift, scale = row_stable(net.final_adaLN, cond).chunk(2, dim=-1)
        h = modulate(h, shift, scale)
    return h
