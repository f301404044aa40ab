"""The step head of a joint few-step student (MATH.md §10, "The joint student"): a small causal transformer over the
positions a sampler step reveals, on top of the denoiser's final hidden states.

A masked ancestral step reveals a set R = {r_1 < … < r_n} of masked positions. The factorised denoiser draws their
tokens independently from m^{r_k}(· | x_t); the joint student draws them left to right over R,

    y_{r_k} ~ p_θ(· | x_t, R, y_{r_1..r_{k−1}}),   log p_θ = logits of the denoiser at r_k + the head's correction,

where the head reads at r_k the denoiser's hidden state there, the token drawn at r_{k−1} (the mask token for k = 1)
through the denoiser's own input embedding, and the gap r_k − r_{k−1}, attends causally over r_1..r_k with rotary
positions, and corrects the logits by a shift Δ of the denoiser's final hidden state read through the denoiser's own
output layer W: correction = W Δ. Δ's projection is zero-initialised: at initialisation the joint step is the
factorised one, token for token. The head thus learns d × d maps around the teacher's trained embedding and output
layer, not a V-way table of its own (so a denoiser whose output layer is still zero gives it nothing to correct
through: it is a head for a trained denoiser).

`StepHead.correction` is the teacher-forced form (training: every r_k in one pass); `JointStep` the incremental form
a sampler uses (one position per row per call, keys and values cached), which
`models.transformer.JointStepDenoiser.open_step` opens after the denoiser's one call of the step."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tcsm.models.layers import MLP, RotaryEmbedding, apply_rotary, init_weights, make_norm, zero_init_

__all__ = ["JointStep", "StepHead", "reveal_order"]


def reveal_order(reveal: Tensor) -> tuple[Tensor, Tensor]:
    """(positions [B, n] of each row's revealed positions left to right, padded with position 0; valid [B, n]),
    n = the largest reveal count of the batch."""
    B, L = reveal.shape
    ar = torch.arange(L, device=reveal.device)
    order = torch.where(reveal, ar, L + ar).argsort(-1)
    count = reveal.sum(-1)
    n = int(count.max()) if B else 0
    valid = torch.arange(n, device=reveal.device) < count[:, None]
    return torch.where(valid, order[:, :n], 0), valid


class _HeadLayer(nn.Module):
    """Pre-norm causal attention + MLP over a row's revealed positions; rotary tables gathered per position."""

    def __init__(self, d: int, heads: int, mlp_ratio: float, norm: str, activation: str):
        super().__init__()
        self.heads, self.dh = heads, d // heads
        self.norm1, self.norm2 = make_norm(norm, d), make_norm(norm, d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.out = nn.Linear(d, d, bias=False)
        self.mlp = MLP(d, mlp_ratio, 0.0, activation)

    def qkv_of(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, n, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, self.heads, self.dh).unbind(2)
        q, k = apply_rotary(q, cos[:, :, None], sin[:, :, None]), apply_rotary(k, cos[:, :, None], sin[:, :, None])
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, n, Dh]

    def finish(self, x: Tensor, y: Tensor) -> Tensor:
        b, _, n, _ = y.shape
        x = x + self.out(y.transpose(1, 2).reshape(b, n, -1))
        return x + self.mlp(self.norm2(x))


class StepHead(nn.Module):
    """The logit correction of each revealed position given the tokens drawn before it in the step (module doc)."""

    def __init__(self, vocab_size: int, d_model: int, n_heads: int, n_layers: int, max_len: int, *,
                 mlp_ratio: float = 4, norm: str = "layernorm", activation: str = "gelu", rope_base: float = 10000.0):  # fmt: skip
        super().__init__()
        self.vocab_size = int(vocab_size)
        # the token drawn before is read through the denoiser's trained input embedding (passed in as `embed`; id V,
        # the mask token, stands for none): a table of its own would have to learn what each of V tokens is from
        # the few thousand steps a round gives it
        self.token_norm = make_norm(norm, d_model)
        self.token = nn.Linear(d_model, d_model, bias=False)
        # how far back that token sits (0: none before): attention alone would not say it, since a position's own
        # input carries its predecessor's token, whose distance rotary angles between the two never see
        self.gap = nn.Embedding(max_len + 1, d_model)
        self.rotary = RotaryEmbedding(d_model // n_heads, max_len, rope_base)
        self.layers = nn.ModuleList(_HeadLayer(d_model, n_heads, mlp_ratio, norm, activation) for _ in range(n_layers))
        self.norm = make_norm(norm, d_model)
        self.apply(init_weights)
        # the token and gap inputs join a normalised hidden state of unit scale: at GPT-2's 0.02 they would be 2 % of
        # it after the head's first norm, and the head would take thousands of steps to start reading them
        nn.init.eye_(self.token.weight)
        nn.init.normal_(self.gap.weight, std=1.0)
        # the correction is a shift of the denoiser's final hidden state read through its own output layer
        # (`unembed`, [V, d]): d × d weights to learn instead of a fresh d × V, whose V-way noise a round's few
        # tokens per update do not average out; zero: at init the factorised step
        self.out = zero_init_(nn.Linear(d_model, d_model, bias=False))

    def _before(self, prev: Tensor, gap: Tensor, embed) -> Tensor:
        """The input a revealed position adds to its hidden state: the token drawn at the revealed position before
        it (`prev`, V: none) through the denoiser's input embedding `embed`, and how far back that is (`gap`, 0 for
        the first)."""
        token = self.token(self.token_norm(embed(prev).to(self.token.weight.dtype)))
        return token + self.gap(gap.clamp(0, self.gap.num_embeddings - 1))

    def _tables(self, positions: Tensor, dtype) -> tuple[Tensor, Tensor]:
        cos, sin = self.rotary(int(positions.max()) + 1 if positions.numel() else 1, dtype=dtype)
        return cos[positions], sin[positions]

    def correction(self, h: Tensor, reveal: Tensor, tokens: Tensor, embed, unembed: Tensor) -> Tensor:
        """[B, L, V]: the correction at every revealed position given the tokens `tokens` [B, L] at the revealed
        positions before it (teacher forcing), 0 elsewhere. h [B, L, D]: the denoiser's final hidden states; `embed`:
        its input embedding (ids 0..V, V the mask); `unembed` [V, D]: its output layer's weight."""
        B, L, D = h.shape
        pos, valid = reveal_order(reveal)
        out = h.new_zeros(B, L, self.vocab_size)
        if pos.shape[1] == 0:
            return out
        drawn = tokens.gather(1, pos).clamp(0, self.vocab_size - 1)
        prev = torch.cat([torch.full_like(drawn[:, :1], self.vocab_size), drawn[:, :-1]], 1)
        gap = pos.diff(dim=1, prepend=pos[:, :1])
        x = h.gather(1, pos[..., None].expand(-1, -1, D)) + self._before(prev, gap, embed).to(h.dtype)
        cos, sin = self._tables(pos, x.dtype)
        for layer in self.layers:
            q, k, v = layer.qkv_of(x, cos, sin)
            x = layer.finish(x, F.scaled_dot_product_attention(q, k, v, is_causal=True))
        corr = F.linear(self.out(self.norm(x)), unembed.to(x.dtype)) * valid[..., None]
        return out.scatter_add(1, pos[..., None].expand(-1, -1, self.vocab_size), corr.to(out.dtype))


class JointStep:
    """One sampler step's joint draw, incremental, on the denoiser's hidden states h [B, L, D] and its output layer
    `project` (hidden states → logits): `positions[:, k]` is each row's k-th revealed position (valid where
    `valid[:, k]`), and `logits(k, prev)` the full logits there given the token `prev` [B] drawn at its (k−1)-th (call
    k = 0, 1, … in order; keys and values of earlier positions are cached). The denoiser's own logits are taken at
    the revealed positions only: a step reveals few, and the output layer is a large share of a call."""

    def __init__(self, head: StepHead, h: Tensor, reveal: Tensor, project, embed, unembed: Tensor):
        self.head, self.h, self.embed, self.unembed = head, h, embed, unembed
        self.positions, self.valid = reveal_order(reveal)
        B, n = self.positions.shape
        self.base = project(h.gather(1, self.positions[..., None].expand(-1, -1, h.shape[-1]))).float()  # [B, n, V]
        dh = head.layers[0].dh if len(head.layers) else 0
        self.cache = [(h.new_zeros(B, layer.heads, n, dh), h.new_zeros(B, layer.heads, n, dh)) for layer in head.layers]
        self.calls = 0  # head evaluations (one per revealed position index of the batch)

    @property
    def size(self) -> int:
        return self.positions.shape[1]

    def logits(self, k: int, prev: Tensor) -> Tensor:
        head, D = self.head, self.h.shape[-1]
        pos = self.positions[:, k : k + 1]  # [B, 1]
        gap = pos - self.positions[:, k - 1 : k] if k else torch.zeros_like(pos)
        x = self.h.gather(1, pos[..., None].expand(-1, -1, D)) + head._before(prev[:, None], gap, self.embed).to(self.h.dtype)
        cos, sin = head._tables(pos, x.dtype)
        for layer, (keys, values) in zip(head.layers, self.cache, strict=True):
            q, kk, vv = layer.qkv_of(x, cos, sin)
            keys[:, :, k : k + 1], values[:, :, k : k + 1] = kk, vv
            x = layer.finish(x, F.scaled_dot_product_attention(q, keys[:, :, : k + 1], values[:, :, : k + 1]))
        self.calls += 1
        corr = F.linear(head.out(head.norm(x)), self.unembed.to(x.dtype))[:, 0].float()
        return self.base[:, k] + corr
