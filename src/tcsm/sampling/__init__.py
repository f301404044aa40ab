"""Sampling (MATH.md §6): `common` holds the shared building blocks (time grids, exact Gumbel-max draws,
temperature / top-p, prompt pinning), `samplers` the path samplers' math (Euler / τ-leaping, analytic reversal,
cached masked ancestral, joint-x̂_1 bridge) and `sample`, `decoding` the decoding orders of masked models
(confidence, margin, entropy, threshold, random; semi-autoregressive blocks) and `decode`, `blocks` a block
model's decoding block by block with its KV cache (`decode_blocks`). A run chooses among the
registered samplers (`registry`; one class each in `path_samplers`, `orders`, `own`) with its `sample:` section
only: `settings.SampleSettings` is that section (`settings.sample_settings` reads it), `settings.draw` the one
call every caller makes. A method that brings its own sampler (SIR over an energy model, `tcsm.posttrain.dre.sir`;
left to right for an autoregressive model) declares it through `tcsm.core.protocols.Samples`."""

from tcsm.sampling.common import (
    GRIDS,
    adjust_log_probs,
    as_grid,
    categorical,
    jump_prob,
    prefix_condition,
    time_grid,
)
from tcsm.sampling.decoding import DECODERS, decode
from tcsm.sampling.samplers import METHODS, SamplingStats, may_cache, sample

__all__ = [
    "DECODERS",
    "GRIDS",
    "METHODS",
    "SamplingStats",
    "adjust_log_probs",
    "as_grid",
    "categorical",
    "decode",
    "jump_prob",
    "may_cache",
    "prefix_condition",
    "sample",
    "time_grid",
]
