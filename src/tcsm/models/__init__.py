"""Neural networks: shared transformer layers and the bidirectional denoiser."""

# Clean-data models of p_1 (parametric targets); importing them registers model.name = mlm | causal | hollow |
# hf_mlm | hf_causal with tcsm.registry.MODELS (transformers itself is imported only when an HF model is built).
from tcsm.models import clean as _clean  # noqa: F401
from tcsm.models import hf as _hf  # noqa: F401
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
