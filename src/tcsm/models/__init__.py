"""Neural networks: shared transformer layers, the bidirectional denoiser and the block denoiser; the LMs of p_1 (models of the data, not diffusion models)
(`tcsm.models.lm_families`), Hugging Face adapters (`tcsm.models.hf`) and the density-ratio head live in
their own modules. Nothing here reads configs: `tcsm.builders.models` turns a config section into a model."""

from tcsm.models.blocks import BlockDenoiser, BlockDenoiserConfig, build_block_denoiser  # noqa: F401
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
