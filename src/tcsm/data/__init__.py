"""Data sources, tokenizers and batching: everything returns a `DataBundle` (see `build_data`)."""

from tcsm.data.base import (  # noqa: F401
    CharTokenizer,
    DataBundle,
    DataError,
    chunk,
    compact_dtype,
    read_text,
    split_by_fractions,
)
from tcsm.data.batching import EpochBatches  # noqa: F401
from tcsm.data.bpe import BPETokenizer, build_bpe, gpt2_tokenizer, train_bpe_tokenizer  # noqa: F401
from tcsm.data.build import (  # noqa: F401
    DATA_KINDS,
    PATH_KEYS,
    absolute_paths,
    build_data,
    data_kind,
    missing_paths,
    refuse_missing_data,
)
from tcsm.data.synthetic import MarkovChainSource, build_synthetic  # noqa: F401
from tcsm.data.text import build_text, read_documents  # noqa: F401
from tcsm.data.text8 import build_text8  # noqa: F401
