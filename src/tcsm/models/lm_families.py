"""The LM families by name (models of the data, not diffusion models), and `build_lm` (family + size preset + overrides)."""

from __future__ import annotations

from typing import Any

from torch import nn

from tcsm.models.causal import CausalLM
from tcsm.models.hollow import HollowTransformer
from tcsm.models.lm import LM_PRESETS, LMConfig
from tcsm.models.mlm import MaskedLM

__all__ = ["build_lm", "lm_families"]


def lm_families() -> dict[str, type[nn.Module]]:
    """name → class of the built-in LM families (each class declares its family)."""
    return {cls.model_kind.family: cls for cls in (MaskedLM, CausalLM, HollowTransformer)}


def build_lm(
    family: str, preset: str | dict[str, Any] | None = "small", **overrides: Any
) -> nn.Module:
    """Build an LM: family ∈ {"mlm", "causal", "hollow"}, a size preset (or dict), overrides.

    Example: `build_lm("hollow", "tiny", vocab_size=27)`.
    """
    families = lm_families()
    if family not in families:
        raise ValueError(f"unknown LM family {family!r}; choose one of {sorted(families)}")
    if isinstance(preset, str):
        if preset not in LM_PRESETS:
            raise ValueError(f"unknown LM preset {preset!r}; choose one of {sorted(LM_PRESETS)}")
        fields = dict(LM_PRESETS[preset])
    else:
        fields = dict(preset or {})
    fields.update({k: v for k, v in overrides.items() if v is not None})
    if fields.get("vocab_size") is None:
        raise ValueError("LM config is missing vocab_size (the number of clean tokens V)")
    return families[family](LMConfig.from_dict(fields))
