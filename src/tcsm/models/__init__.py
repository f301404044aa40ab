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
