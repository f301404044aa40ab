"""BERT-style masked language model over clean tokens: a parametric model of p_1(x^i | x^{≠i}) (MATH.md §4).

Input alphabet {0..V−1} ∪ {[MASK] = V}; bidirectional attention; logits over the V clean tokens at every position.
Trained with the masked-LM loss (`tcsm.teachers.MaskedLMLoss`). As a teacher, replacing x^i by [MASK] and reading
position i gives p_1(· | x^{≠i}) (`tcsm.targets.parametric.MLMTeacher`, one pass per position).
"""

from __future__ import annotations

from torch import Tensor, nn

from tcsm.models.clean import CleanLMConfig
from tcsm.models.layers import RotaryEmbedding, TransformerBlock, init_weights, make_norm, zero_init_

__all__ = ["MaskedLM"]


class MaskedLM(nn.Module):
    """x [B, L] with ids in {0..V} (V = [MASK]) → logits [B, L, V] of p(x^i = · | unmasked tokens)."""

    family = "mlm"

    def __init__(self, cfg: CleanLMConfig):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = cfg.vocab_size
        self.mask_id = cfg.vocab_size
        self.embed = nn.Embedding(cfg.vocab_size + 1, cfg.d_model)
        self.rotary = RotaryEmbedding(cfg.d_model // cfg.n_heads, cfg.max_len, cfg.rope_base)
        self.blocks = nn.ModuleList(
            TransformerBlock(cfg.d_model, cfg.n_heads, cfg.mlp_ratio, cfg.dropout, None, False, cfg.norm)
            for _ in range(cfg.n_layers)
        )
        self.final_norm = make_norm(cfg.norm, cfg.d_model)
        self.head = zero_init_(nn.Linear(cfg.d_model, cfg.vocab_size, bias=True))
        self.apply(init_weights)

    def forward(self, x: Tensor) -> Tensor:
        """Logits [B, L, V] over clean tokens; meaningful at [MASK] positions (MATH.md §4, BERT/MLM)."""
        if x.dim() != 2:
            raise ValueError(f"x must be a [batch, length] tensor of token ids, got shape {tuple(x.shape)}")
        if x.shape[1] > self.cfg.max_len:
            raise ValueError(f"sequence length {x.shape[1]} exceeds the model's max_len={self.cfg.max_len}")
        h = self.embed(x)
        rope = self.rotary(x.shape[1])
        for block in self.blocks:
            h = block(h, rope)
        return self.head(self.final_norm(h)).float()
