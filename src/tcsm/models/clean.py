"""Shared configuration of the clean-data models p_1 used as parametric targets (MATH.md §4).

Three families model clean sequences x ∈ {0..V−1}^L and feed `tcsm.targets.parametric`:

* `MaskedLM` (models/mlm.py): BERT-style, input alphabet V+1 with [MASK] = V, logits over V everywhere;
* `CausalLM` (models/causal.py): autoregressive with a BOS token, logits[:, j] = log p(x^j | x^{<j});
* `HollowTransformer` (models/hollow.py): all L conditionals p(x^i | x^{≠i}) in one pass.

They share one config dataclass and the size presets below (the MLM and the causal LM also share their trunk,
`CleanTransformer`); `build_clean_model(family, preset, **overrides)`
builds any of them (the Hugging Face adapters in models/hf.py wrap external models instead). Importing this
module registers the three families with `tcsm.registry.MODELS` (`model.name: mlm | causal | hollow`).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, ClassVar

from torch import Tensor, nn

from tcsm.models.config import ModelConfig
from tcsm.models.layers import RotaryEmbedding, TransformerBlock, init_weights, make_norm, zero_init_

__all__ = ["CLEAN_PRESETS", "CleanLMConfig", "CleanTransformer", "build_clean_model", "clean_model_families"]


@dataclass
class CleanLMConfig(ModelConfig):
    """Architecture of a clean-data model. `n_layers` counts blocks per stack (the Hollow transformer has
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

    label: ClassVar[str] = "clean-model config"

    def __post_init__(self) -> None:
        if self.n_mix_layers < 0:
            raise ValueError(f"n_mix_layers must be >= 0, got {self.n_mix_layers}")
        self.check_sizes(("max_len", "d_model", "n_layers", "n_heads"))


class CleanTransformer(nn.Module):
    """Input ids {0..V} (id V is [MASK] or BOS) → `n_layers` rotary pre-norm blocks, causal or bidirectional →
    logits over the V clean tokens: the trunk of `MaskedLM` and `CausalLM` (MATH.md §4)."""

    def __init__(self, cfg: CleanLMConfig, causal: bool):
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
CLEAN_PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"max_len": 128, "d_model": 32, "n_layers": 1, "n_heads": 2, "n_mix_layers": 1},
    "small": {"max_len": 256, "d_model": 128, "n_layers": 2, "n_heads": 4, "n_mix_layers": 1},
    "base": {"max_len": 256, "d_model": 256, "n_layers": 4, "n_heads": 4, "n_mix_layers": 2},
}


def clean_model_families() -> dict[str, type[nn.Module]]:
    """name → class of the built-in clean-data model families (imported lazily to avoid import cycles)."""
    from tcsm.models.causal import CausalLM
    from tcsm.models.hollow import HollowTransformer
    from tcsm.models.mlm import MaskedLM

    return {"mlm": MaskedLM, "causal": CausalLM, "hollow": HollowTransformer}


def build_clean_model(
    family: str, preset: str | dict[str, Any] | None = "small", **overrides: Any
) -> nn.Module:
    """Build a clean-data model: family ∈ {"mlm", "causal", "hollow"}, a size preset (or dict), overrides.

    Example: `build_clean_model("hollow", "tiny", vocab_size=27)`.
    """
    families = clean_model_families()
    if family not in families:
        raise ValueError(f"unknown clean-data model family {family!r}; choose one of {sorted(families)}")
    if isinstance(preset, str):
        if preset not in CLEAN_PRESETS:
            raise ValueError(f"unknown clean-model preset {preset!r}; choose one of {sorted(CLEAN_PRESETS)}")
        fields = dict(CLEAN_PRESETS[preset])
    else:
        fields = dict(preset or {})
    fields.update({k: v for k, v in overrides.items() if v is not None})
    if fields.get("vocab_size") is None:
        raise ValueError("clean-model config is missing vocab_size (the number of clean tokens V)")
    return families[family](CleanLMConfig.from_dict(fields))


# --------------------------------------------------------------------------------------------------- registry
# `tcsm train` builds these from `model.name: mlm | causal | hollow` plus a preset and overrides.


def _clean_schema(family: str) -> type:
    """`model` keys of a clean-data family: a size preset plus any CleanLMConfig field (null: the preset's)."""
    hints = typing.get_type_hints(CleanLMConfig)
    fields: list = [
        ("name", str, family),
        ("preset", str, dataclasses.field(default="small", metadata={"help": " | ".join(CLEAN_PRESETS)})),
    ]
    for f in dataclasses.fields(CleanLMConfig):
        if f.name != "vocab_size":  # from the data
            fields.append((f.name, hints[f.name] | None, dataclasses.field(default=None)))
    return dataclasses.make_dataclass(f"{family.title()}CleanModelConfig", fields)


def _register_families() -> None:
    from tcsm.errors import ConfigError
    from tcsm.registry import MODELS

    helps = {
        "mlm": "BERT-style masked LM of clean data (a parametric p_1 teacher; MATH.md §4)",
        "causal": "autoregressive transformer of clean data with BOS (an AR teacher; MATH.md §4, §5.4)",
        "hollow": "Hollow transformer: all p_1(x^i | x^{≠i}) in one pass (MATH.md §4)",
    }
    for family, text in helps.items():

        def build(node: dict, ctx, family=family):
            node = dict(node)
            preset = node.pop("preset")
            if preset not in CLEAN_PRESETS:
                raise ConfigError(f"unknown model.preset {preset!r}; choose one of {sorted(CLEAN_PRESETS)}")
            fields = {**CLEAN_PRESETS[preset], **{k: v for k, v in node.items() if v is not None}}
            if ctx.seq_len > fields["max_len"]:
                raise ConfigError(
                    f"data sequences have length {ctx.seq_len} but the model allows at most {fields['max_len']}; "
                    f"set model.max_len={ctx.seq_len}"
                )
            try:
                return build_clean_model(family, fields, vocab_size=ctx.vocab_size)
            except ValueError as e:
                raise ConfigError(f"model: {e}") from None

        MODELS.register(family, build, schema=_clean_schema(family), help=text, overwrite=True)


_register_families()
