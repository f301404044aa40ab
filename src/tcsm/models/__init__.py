"""Neural networks: shared transformer layers and the bidirectional denoiser."""

from tcsm.models.layers import (  # noqa: F401
    MLP,
    LayerNorm,
    MultiHeadAttention,
    RMSNorm,
    RotaryEmbedding,
    TimestepEmbedder,
    TransformerBlock,
    apply_rotary,
    init_weights,
    make_norm,
    modulate,
    zero_init_,
)
from tcsm.models.transformer import (  # noqa: F401
    PRESETS,
    Denoiser,
    DenoiserConfig,
    build_denoiser,
    count_parameters,
    flops_per_token,
)
