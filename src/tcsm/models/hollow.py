"""Hollow transformer (Sun et al. 2022): all L conditionals p_1(x^i | x^{≠i}) in one pass (MATH.md §4).

Structure, chosen so that the output at position i never reads x^i:

* a causal stack over the right-shifted sequence [BOS, x^0, …, x^{L−2}] gives f_i, a function of x^{<i};
* an anti-causal stack (a causal stack run on the reversed, left-shifted sequence [x^1, …, x^{L−1}, EOS]) gives
  g_i, a function of x^{>i};
* `n_mix_layers` mixing blocks update a query stream h_i (initialised to f_i + g_i) by attending only to the
  frozen streams: keys/values are [f; g] with f_j visible iff j ≤ i and g_j visible iff j ≥ i. The query stream
  never attends to other query positions (h_j may depend on x^i), so h_i stays a function of x^{≠i}.

Rotary positions in the mixing blocks run over 0..2L−1 (f_j at j, g_j at L+j): relative offsets then also tell
the two streams apart. Trained by pseudo-likelihood Σ_i −log p(x^i | x^{≠i}) (`tcsm.objectives.lm.PseudoLikelihoodLoss`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tcsm.models.kinds import HOLLOW
from tcsm.models.layers import RotaryEmbedding, TransformerBlock, init_weights, make_norm, zero_init_
from tcsm.models.lm import LMConfig

__all__ = ["HollowTransformer", "hollow_mask"]


def hollow_mask(length: int, device=None) -> Tensor:
    """Bool [L, 2L] mask of the mixing layers: query i may see f_j (column j) iff j ≤ i, g_j (column L+j) iff j ≥ i."""
    i = torch.arange(length, device=device)
    return torch.cat([i[None, :] <= i[:, None], i[None, :] >= i[:, None]], dim=1)


class HollowTransformer(nn.Module):
    """x [B, L] clean ids → logits [B, L, V] with logits[:, i] = log p(x^i = · | x^{≠i}) (+ const)."""

    model_kind = HOLLOW
    #: methods besides forward that run the network (a sharded model gathers its weights for them too)
    forward_methods = ("streams",)

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        V = self.vocab_size = cfg.vocab_size
        self.bos_id, self.eos_id = V, V + 1
        self.embed = nn.Embedding(V + 2, cfg.d_model)
        # Mixing positions run to 2L, so the table covers both streams.
        self.rotary = RotaryEmbedding(cfg.d_model // cfg.n_heads, 2 * cfg.max_len, cfg.rope_base)

        def stack(n: int, causal: bool) -> nn.ModuleList:
            return nn.ModuleList(
                TransformerBlock(cfg.d_model, cfg.n_heads, cfg.mlp_ratio, cfg.dropout, None, causal, cfg.norm)
                for _ in range(n)
            )

        self.forward_stack = stack(cfg.n_layers, True)
        self.backward_stack = stack(cfg.n_layers, True)
        self.mix = stack(cfg.n_mix_layers, False)
        self.norm_f = make_norm(cfg.norm, cfg.d_model)
        self.norm_g = make_norm(cfg.norm, cfg.d_model)
        self.final_norm = make_norm(cfg.norm, cfg.d_model)
        self.head = zero_init_(nn.Linear(cfg.d_model, V, bias=True))
        self.apply(init_weights)

    def streams(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(f, g), each [B, L, d]: f_i depends on x^{<i} only, g_i on x^{>i} only."""
        B, L = x.shape
        e = self.embed(x)
        bos = self.embed.weight[self.bos_id].expand(B, 1, -1)
        eos = self.embed.weight[self.eos_id].expand(B, 1, -1)
        rope = self.rotary(L)
        f = torch.cat([bos, e[:, :-1]], dim=1)
        for block in self.forward_stack:
            f = block(f, rope)
        g = torch.cat([e[:, 1:], eos], dim=1).flip(1)  # reversed: causal attention now looks rightwards
        for block in self.backward_stack:
            g = block(g, rope)
        return self.norm_f(f), self.norm_g(g.flip(1))

    def forward(self, x: Tensor) -> Tensor:
        """Logits [B, L, V] of the L single-site conditionals p_1(x^i | x^{≠i}), one pass (MATH.md §4, Hollow)."""
        if x.dim() != 2:
            raise ValueError(f"x must be a [batch, length] tensor of token ids, got shape {tuple(x.shape)}")
        L = x.shape[1]
        if L > self.cfg.max_len:
            raise ValueError(f"sequence length {L} exceeds the model's max_len={self.cfg.max_len}")
        f, g = self.streams(x)
        h = f + g
        if len(self.mix):
            kv = torch.cat([f, g], dim=1)
            mask = hollow_mask(L, x.device)
            rope = self.rotary(2 * L)
            for block in self.mix:
                h = block(h, rope, attn_mask=mask, kv=kv)
        return self.head(self.final_norm(h)).float()
