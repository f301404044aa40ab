"""Zero-shot perplexity of GPT-2-BPE models on WikiText-2, PTB, LAMBADA and the LM1B subset.

Protocol (SEDD/MDLM; docs/evaluation.md): each document (a WikiText line, a PTB sentence, a LAMBADA passage,
an LM1B sentence) is detokenised, encoded with GPT-2 BPE and followed by one EOS; the documents are joined
into one token stream, which is cut into fixed-length blocks with no overlap (no sliding window) and the
remainder dropped. The likelihood bound is applied to every block independently and
PPL = exp(Σ_blocks NELBO / Σ_blocks tokens) (MATH.md §2.4).

Two block layouts are offered: "sedd" (plain L-token slices of the stream; SEDD's layout, which the TCSM paper
says it follows) and "mdlm" (BOS + L−2 stream tokens + EOS per block, MDLM's `wrap` layout).
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from tcsm.evaluation.detokenizers import DETOKENIZERS

__all__ = [
    "ZEROSHOT_SETS",
    "ZeroShotBlocks",
    "ZeroShotSpec",
    "build_blocks",
    "default_data_root",
    "load_documents",
    "prepare_zeroshot",
    "zeroshot_perplexity",
]

LAYOUTS = ("sedd", "mdlm")


@dataclass(frozen=True)
class ZeroShotSpec:
    """Where a zero-shot set lives under the data root, how it is split into documents, and its report label."""

    name: str
    relpath: str
    reader: str  # "lines_raw" (keep the newline, like HF wikitext rows) | "lines_strip" | "jsonl"
    detokenizer: str
    label: str
    note: str = ""


ZEROSHOT_SETS: dict[str, ZeroShotSpec] = {
    "wikitext2": ZeroShotSpec(
        "wikitext2", "wikitext2/wiki.test.raw.gz", "lines_raw", "wikitext", "WikiText-2 (raw, test)",
        note="the local copy has no blank lines; the HF split's 1467 empty rows (one lone EOS each) are absent",
    ),
    "ptb": ZeroShotSpec("ptb", "ptb/ptb.test.txt.gz", "lines_strip", "ptb", "PTB (test)"),
    "lambada": ZeroShotSpec("lambada", "lambada/lambada_test.jsonl.gz", "jsonl", "lambada", "LAMBADA (test)"),
    "lm1b": ZeroShotSpec(
        "lm1b", "lm1b/lm1b_heldout_subset.test.txt.gz", "lines_strip", "lm1b", "LM1B subset (test)",
        note="12,105 held-out sentences, not the full LM1B test split: not comparable with full-LM1B numbers",
    ),
}


def default_data_root() -> Path:
    """$TCSM_DATA_DIR if set, else ../shared/data relative to the working directory (the repo layout here)."""
    env = os.environ.get("TCSM_DATA_DIR")
    return Path(env) if env else Path("..") / "shared" / "data"


def _spec(name: str) -> ZeroShotSpec:
    try:
        return ZEROSHOT_SETS[name]
    except KeyError:
        raise ValueError(f"unknown zero-shot set {name!r}; choose from {sorted(ZEROSHOT_SETS)}") from None


def load_documents(name: str, data_root: str | os.PathLike | None = None) -> list[str]:
    """The raw documents of a zero-shot set, before detokenisation, split as the protocol splits them."""
    spec = _spec(name)
    path = Path(data_root if data_root is not None else default_data_root()) / spec.relpath
    if not path.is_file():
        raise FileNotFoundError(f"zero-shot set {name!r} not found at {path}; pass --data-root or set TCSM_DATA_DIR")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", newline="") as f:
        if spec.reader == "jsonl":
            return [json.loads(line)["text"] for line in f if line.strip()]
        if spec.reader == "lines_raw":
            # HF wikitext rows keep their trailing newline, which the detokeniser then rewrites (" \n" → "\n").
            return [line if line.strip() else "" for line in f]
        return [line.strip() for line in f]


def build_blocks(
    documents: Iterable[Sequence[int]],
    block_size: int,
    *,
    eos_id: int,
    bos_id: int | None = None,
    layout: str = "sedd",
) -> tuple[Tensor, dict]:
    """Join documents (each followed by EOS) into one stream and cut it into non-overlapping blocks.

    "sedd": blocks are stream[kL:(k+1)L]; "mdlm": BOS + stream[k(L−2):(k+1)(L−2)] + EOS. The tail shorter than
    one block is dropped. Returns (LongTensor[N, L], stats).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown block layout {layout!r}; choose from {LAYOUTS}")
    inner = block_size - 2 if layout == "mdlm" else block_size
    if inner < 1:
        raise ValueError(f"block_size {block_size} is too small for layout {layout!r}")
    stream: list[int] = []
    num_docs = 0
    for doc in documents:
        stream.extend(doc)
        stream.append(eos_id)
        num_docs += 1
    n = len(stream) // inner
    body = torch.tensor(stream[: n * inner], dtype=torch.long).view(n, inner)
    if layout == "mdlm":
        start = bos_id if bos_id is not None else eos_id
        body = torch.cat([torch.full((n, 1), start), body, torch.full((n, 1), eos_id)], dim=1)
    stats = {"num_documents": num_docs, "stream_tokens": len(stream), "dropped_tokens": len(stream) - n * inner}
    return body, stats


@dataclass
class ZeroShotBlocks:
    """A prepared zero-shot set: the blocks a model is scored on, and how they were made."""

    name: str
    label: str
    blocks: Tensor  # LongTensor[N, L]
    protocol: dict = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return self.blocks.numel()


def _encode_all(encode: Callable, texts: list[str]) -> list[list[int]]:
    # Batch through a fast tokenizer when it offers one; fall back to one call per document.
    batch = getattr(encode, "encode_batch", None)
    if batch is not None:
        return [list(e.ids) if hasattr(e, "ids") else list(e) for e in batch(texts)]
    return [list(encode(t)) for t in texts]


def prepare_zeroshot(
    name: str,
    encode: Callable[[str], Sequence[int]],
    *,
    block_size: int,
    eos_id: int,
    bos_id: int | None = None,
    layout: str = "sedd",
    data_root: str | os.PathLike | None = None,
    max_documents: int | None = None,
) -> ZeroShotBlocks:
    """Load, detokenise, encode and block one zero-shot set (`encode`: text → GPT-2 BPE ids, no specials)."""
    spec = _spec(name)
    docs = load_documents(name, data_root)
    if max_documents is not None:
        docs = docs[:max_documents]
    detok = DETOKENIZERS[spec.detokenizer]
    ids = _encode_all(encode, [detok(d) for d in docs])
    blocks, stats = build_blocks(ids, block_size, eos_id=eos_id, bos_id=bos_id, layout=layout)
    if blocks.shape[0] == 0:
        raise ValueError(f"{spec.label}: {stats['stream_tokens']} tokens is less than one block of {block_size}")
    protocol = {
        "file": spec.relpath,
        "detokenizer": spec.detokenizer,
        "layout": layout,
        "block_size": block_size,
        "eos_id": eos_id,
        "bos_id": bos_id if layout == "mdlm" else None,
        "num_blocks": int(blocks.shape[0]),
        **stats,
    }
    if spec.note:
        protocol["note"] = spec.note
    if max_documents is not None:
        protocol["max_documents"] = max_documents
    return ZeroShotBlocks(name=name, label=spec.label, blocks=blocks, protocol=protocol)


def zeroshot_perplexity(
    denoiser,
    path,
    data: ZeroShotBlocks,
    *,
    batch_size: int = 8,
    num_t: int = 8,
    generator: torch.Generator | None = None,
    bound: str | None = None,
    device=None,
    progress: bool = False,
) -> dict:
    """PPL ≤ exp(Σ_b NELBO(x_b) / Σ_b L) over the blocks x_b of one zero-shot set (MATH.md §2.4).

    Every block gets its own bound (`tcsm.evaluation.likelihood.evaluate_bound`, `num_t` stratified times per block);
    a sum of upper bounds is an upper bound, so the result is an upper bound on the model's perplexity, up to
    Monte Carlo error (reported as a standard error).
    """
    from tcsm.evaluation.likelihood import evaluate_bound

    if data.blocks.shape[1] > 0 and int(data.blocks.max()) >= path.vocab_size:
        raise ValueError(
            f"{data.label}: token ids reach {int(data.blocks.max())} but the model has {path.vocab_size} tokens; "
            "zero-shot evaluation needs a GPT-2-BPE model"
        )
    res = evaluate_bound(
        denoiser, data.blocks, path, batch_size=batch_size, num_t=num_t, generator=generator, bound=bound,
        progress=progress, device=device,
    )
    return {
        "set": data.name,
        "label": data.label,
        "ppl_bound": res["perplexity"],
        "ppl_bound_stderr": res["perplexity_stderr"],
        "nats_per_token": res["nats_per_token"],
        "nats_per_token_stderr": res["nats_per_token_stderr"],
        "bound": res["bound"],
        "num_t": res["num_t"],
        "num_blocks": res["num_sequences"],
        "num_tokens": res["num_tokens"],
        "protocol": data.protocol,
    }
