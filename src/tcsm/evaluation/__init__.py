"""Evaluation: zero-shot perplexity bounds, generative perplexity and sample entropy, reports (docs/evaluation.md)."""

from tcsm.evaluation.detokenizers import (
    DETOKENIZERS,
    lambada_detokenize,
    lm1b_detokenize,
    ptb_detokenize,
    wikitext_detokenize,
)
from tcsm.evaluation.genppl import (
    GenPPLResult,
    ScorerLM,
    generative_perplexity,
    sample_entropy,
    unigram_entropy,
)
from tcsm.evaluation.zeroshot import (
    ZEROSHOT_SETS,
    ZeroShotBlocks,
    build_blocks,
    load_documents,
    prepare_zeroshot,
    zeroshot_perplexity,
)

__all__ = [
    "DETOKENIZERS",
    "ZEROSHOT_SETS",
    "GenPPLResult",
    "ScorerLM",
    "ZeroShotBlocks",
    "build_blocks",
    "generative_perplexity",
    "lambada_detokenize",
    "lm1b_detokenize",
    "load_documents",
    "prepare_zeroshot",
    "ptb_detokenize",
    "sample_entropy",
    "unigram_entropy",
    "wikitext_detokenize",
    "zeroshot_perplexity",
]
