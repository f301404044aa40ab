"""Shared configuration of the LMs of p_1 (models of the data, not diffusion models) used as parametric targets (MATH.md §4).

Three families model clean sequences x ∈ {0..V−1}^L and feed `tcsm.targets.parametric`:

* `MaskedLM` (models/mlm.py): BERT-style, input alphabet V+1 with [MASK] = V, logits over V everywhere;
* `CausalLM` (models/causal.py): autoregressive with a BOS token, logits[:, j] = log p(x^j | x^{<j});
* `HollowTransformer` (models/hollow.py): all L conditionals p(x^i | x^{≠i}) in one pass.

They share one config dataclass and the size presets below (the MLM and the causal LM also share their trunk,
`LMTransformer`); `tcsm.models.lm_families.build_lm(family, preset, **overrides)`
builds any of them (the Hugging Face adapters in models/hf.py wrap external models instead); `tcsm.builders.models`
makes them `model.name: mlm | causal | hollow` of a run config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn

from tcsm.models.config import ModelConfig
from tcsm.models.layers import RotaryEmbedding, TransformerBlock, init_weights, make_norm, zero_init_

__all__ = ["LM_PRESETS", "LMConfig", "LMTransformer"]


@dataclass
class LMConfig(ModelConfig):
    """Architecture of an LM. `n_layers` counts blocks per stack (the Hollow transformer has
    two stacks of n_layers plus `n_mix_layers` mixing blocks; the other families ignore `n_mix_layers`)."""

    vocab_size: int
    max_len: int = 256
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    mlp_ratio: float = 4
    dropout: float = 0.0
    norm: str = "layernorm"
    rope_base: float = 10000.0
    n_mix_layers: int = 1

    label: ClassVar[str] = "LM config"

    def __post_init__(self) -> None:
        if self.n_mix_layers < 0:
            raise ValueError(f"n_mix_layers must be >= 0, got {self.n_mix_layers}")
        self.check_sizes(("max_len", "d_model", "n_layers", "n_heads"))


class LMTransformer(nn.Module):
    """Input ids {0..V} (id V is [MASK] or BOS) → `n_layers` rotary pre-norm blocks, causal or bidirectional →
    logits over the V clean tokens: the trunk of `MaskedLM` and `CausalLM` (MATH.md §4)."""

    def __init__(self, cfg: LMConfig, causal: bool):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = cfg.vocab_size
        self.embed = nn.Embedding(cfg.vocab_size + 1, cfg.d_model)
        self.rotary = RotaryEmbedding(cfg.d_model // cfg.n_heads, cfg.max_len, cfg.rope_base)
        self.blocks = nn.ModuleList(
            TransformerBlock(cfg.d_model, cfg.n_heads, cfg.mlp_ratio, cfg.dropout, None, causal, cfg.norm)
            for _ in range(cfg.n_layers)
        )
        self.final_norm = make_norm(cfg.norm, cfg.d_model)
        # Zero head: the untrained model is uniform over V, so the first loss is exactly log V.
        self.head = zero_init_(nn.Linear(cfg.d_model, cfg.vocab_size, bias=True))
        self.apply(init_weights)

    def _check(self, x: Tensor) -> None:
        if x.dim() != 2:
            raise ValueError(f"x must be a [batch, length] tensor of token ids, got shape {tuple(x.shape)}")
        if x.shape[1] > self.cfg.max_len:
            raise ValueError(f"sequence length {x.shape[1]} exceeds the model's max_len={self.cfg.max_len}")

    def _trunk(self, h: Tensor) -> Tensor:
        """Embedded inputs h [B, L, d] → float32 logits [B, L, V]."""
        rope = self.rotary(h.shape[1])
        for block in self.blocks:
            h = block(h, rope)
        return self.head(self.final_norm(h)).float()


# Sizes only; vocab_size comes from the data.
LM_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"max_len": 128, "d_model": 32, "n_layers": 1, "n_heads": 2, "n_mix_layers": 1},
    "small": {"max_len": 256, "d_model": 128, "n_layers": 2, "n_heads": 4, "n_mix_layers": 1},
    "base": {"max_len": 256, "d_model": 256, "n_layers": 4, "n_heads": 4, "n_mix_layers": 2},
}
