"""Generative perplexity of samples under a scorer causal LM, and the unigram entropy of samples.

Generative perplexity (gen-PPL) scores what a sampler produced with an independent autoregressive model:
gen-PPL = exp(Σ_n Σ_j −log p_ref(y_{n,j} | y_{n,<j}) / Σ_n #scored tokens). Low gen-PPL alone is easy to
game with repetitive text, so it is always reported beside the sample entropy (MDLM/DUO report both):
the entropy of the empirical unigram distribution of each sample, averaged over samples.

The scorer LM is anything that maps token ids [B, T] to next-token logits [B, T, V']; adapters wrap a
Hugging Face causal LM (lazy `transformers` import) or any callable such as a causal model trained by this
project. When the scorer uses another tokenizer, samples are decoded to text and re-encoded with it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "GenPPLResult",
    "ScorerLM",
    "generative_perplexity",
    "sample_entropy",
    "unigram_entropy",
]


@dataclass
class ScorerLM:
    """A causal LM used as a judge: `logits_fn(ids[B, T], attention_mask[B, T]) → logits[B, T, V']`.

    `convention` says which token position j's logits predict: "next" (Hugging Face: token j+1, so the first
    token of a window is not scored) or "current" (this project's `CausalLM`: token j, with its own BOS in
    front, so every token is scored). `encode`/`decode` are the scorer's own tokenizer (needed only to
    re-tokenise text); `context_length` bounds the window it is called on; `eos_id`/`bos_id` its specials.
    """

    logits_fn: Callable[[Tensor, Tensor | None], Tensor]
    context_length: int | None = None
    encode: Callable[[str], list[int]] | None = None
    decode: Callable[[Sequence[int]], str] | None = None
    eos_id: int | None = None
    bos_id: int | None = None
    device: torch.device | str = "cpu"
    name: str = "scorer"
    convention: str = "next"

    def __post_init__(self):
        if self.convention not in ("next", "current"):
            raise ValueError(f"convention must be 'next' or 'current', got {self.convention!r}")

    @classmethod
    def from_callable(cls, fn: Callable[[Tensor], Tensor], **kwargs) -> ScorerLM:
        """Wrap `fn(ids) → logits` (e.g. a causal model trained by this project); padding is on the right,
        which a causal model never attends to from earlier positions, so no mask is passed."""
        return cls(logits_fn=lambda ids, mask: fn(ids), **kwargs)

    @classmethod
    def from_tcsm(cls, model, tokenizer=None, *, eos_id: int | None = None, device=None, name: str | None = None):
        """Wrap a causal LM trained by this project (`tcsm.models.causal.CausalLM`: `model(x)[:, j]` predicts
        x^j from x^{<j} and a BOS it adds itself) and, optionally, the tokenizer of its training data."""
        if device is None:
            device = next(model.parameters()).device
        model = model.to(device).eval()
        cfg = getattr(model, "cfg", None)
        return cls(
            logits_fn=lambda ids, mask: model(ids),
            context_length=getattr(cfg, "max_len", None),
            encode=None if tokenizer is None else tokenizer.encode,
            decode=None if tokenizer is None else tokenizer.decode,
            eos_id=eos_id,
            device=device,
            name=name or type(model).__name__,
            convention="current",
        )

    @classmethod
    def from_hf(cls, model, tokenizer=None, *, device: torch.device | str | None = None, name: str | None = None):
        """Wrap a Hugging Face causal LM (`transformers.PreTrainedModel`) and, optionally, its tokenizer."""
        if device is None:
            device = next(model.parameters()).device
        model = model.to(device).eval()
        cfg = model.config
        ctx = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)

        def logits_fn(ids: Tensor, mask: Tensor | None) -> Tensor:
            return model(input_ids=ids, attention_mask=mask).logits

        encode = decode = None
        eos = getattr(cfg, "eos_token_id", None)
        bos = getattr(cfg, "bos_token_id", None)
        if tokenizer is not None:
            encode = lambda text: tokenizer.encode(text, add_special_tokens=False)
            decode = lambda ids: tokenizer.decode(list(ids))
            eos = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else eos
            bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else bos
        return cls(logits_fn, context_length=ctx, encode=encode, decode=decode, eos_id=eos, bos_id=bos,
                   device=device, name=name or getattr(cfg, "_name_or_path", "") or type(model).__name__)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, *, device: torch.device | str = "cpu") -> ScorerLM:
        """Load a Hugging Face causal LM and tokenizer from a local directory (never downloads)."""
        try:
            import transformers
        except ImportError as e:  # pragma: no cover - exercised only without the extra
            raise ImportError("a Hugging Face scorer LM needs `pip install tcsm[hf]` (transformers)") from e
        if not os.path.isdir(path):
            raise FileNotFoundError(f"scorer LM directory not found: {path}")
        model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        try:
            tok = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        except (OSError, ValueError):
            tok = None  # a model directory without tokenizer files scores ids that are already its own
        return cls.from_hf(model, tok, device=device, name=str(path))


@dataclass
class GenPPLResult:
    """gen-PPL and its parts; `per_sequence_nll` is each sample's mean NLL per scored token (nats)."""

    gen_ppl: float
    nll_nats_per_token: float
    num_tokens: int
    num_sequences: int
    per_sequence_nll: list[float] = field(default_factory=list)
    scorer: str = ""

    def to_dict(self) -> dict:
        return {
            "gen_ppl": self.gen_ppl,
            "nll_nats_per_token": self.nll_nats_per_token,
            "num_tokens": self.num_tokens,
            "num_sequences": self.num_sequences,
            "scorer": self.scorer,
        }


def _scored_mask(ids: Tensor, lengths: Tensor, eos_id: int | None, count_repeated_eos: bool) -> Tensor:
    """Which positions count: inside the sequence, and (MDLM/DUO rule) no EOS after the first."""
    T = ids.shape[1]
    pos = torch.arange(T, device=ids.device)
    valid = pos.unsqueeze(0) < lengths.unsqueeze(1)
    if eos_id is not None and not count_repeated_eos:
        is_eos = ids == eos_id
        later_eos = is_eos & (is_eos.long().cumsum(1) > 1)
        valid &= ~later_eos
    return valid


def _score_batch(ref: ScorerLM, seqs: list[list[int]], count_repeated_eos: bool) -> tuple[Tensor, Tensor]:
    """Σ NLL and #scored tokens per sequence, calling the scorer on non-overlapping context windows."""
    lengths = torch.tensor([len(s) for s in seqs])
    T = int(lengths.max())
    ids = torch.zeros(len(seqs), T, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    ids, lengths = ids.to(ref.device), lengths.to(ref.device)
    scored = _scored_mask(ids, lengths, ref.eos_id, count_repeated_eos)
    nll_sum = torch.zeros(len(seqs), dtype=torch.float64, device=ref.device)
    count = torch.zeros(len(seqs), dtype=torch.long, device=ref.device)
    window = ref.context_length or T
    nxt = ref.convention == "next"
    # Each window is scored on its own (as MDLM does for samples longer than the scorer's context). Under
    # the "next" convention a window's first token has no context to be predicted from, so it is not scored.
    for s in range(0, T, window):
        chunk = ids[:, s : s + window]
        mask = (torch.arange(chunk.shape[1], device=ids.device) + s).unsqueeze(0) < lengths.unsqueeze(1)
        keep = mask.any(1)
        if not keep.any():
            continue
        x = chunk[keep]
        logits = ref.logits_fn(x, mask[keep].long()).float()
        if nxt:
            logits, x = logits[:, :-1], x[:, 1:]
        nll = F.cross_entropy(logits.transpose(1, 2), x, reduction="none")
        w = scored[keep, s + int(nxt) : s + chunk.shape[1]]
        nll_sum[keep] += (nll.double() * w).sum(1)
        count[keep] += w.sum(1)
    return nll_sum.cpu(), count.cpu()


@torch.no_grad()
def generative_perplexity(
    scorer: ScorerLM,
    *,
    texts: Sequence[str] | None = None,
    token_ids: Sequence[Sequence[int]] | Tensor | None = None,
    batch_size: int = 8,
    max_length: int | None = None,
    prepend_bos: bool = False,
    count_repeated_eos: bool = False,
) -> GenPPLResult:
    """gen-PPL = exp(Σ NLL / Σ #scored) of samples under `scorer`.

    Give `texts` (decoded samples; re-tokenised with the scorer's tokenizer) or `token_ids` (already in the
    scorer's vocabulary). Under the "next" convention tokens are scored from the second on (from the first
    with `prepend_bos`);
    every EOS after the first is skipped unless `count_repeated_eos` (MDLM/DUO treat them as padding).
    `max_length` truncates each re-tokenised sample, as MDLM does to the generator's length.
    """
    if (texts is None) == (token_ids is None):
        raise ValueError("give exactly one of texts= or token_ids=")
    if texts is not None:
        if scorer.encode is None:
            raise ValueError("this scorer LM has no tokenizer; pass token_ids= in its vocabulary instead")
        seqs = [list(scorer.encode(t)) for t in texts]
    else:
        seqs = [list(map(int, s)) for s in (token_ids.tolist() if isinstance(token_ids, Tensor) else token_ids)]
    if max_length is not None:
        seqs = [s[:max_length] for s in seqs]
    if prepend_bos:
        if scorer.bos_id is None:
            raise ValueError("prepend_bos=True but the scorer LM has no BOS id")
        seqs = [[scorer.bos_id, *s] for s in seqs]
    if not seqs:
        raise ValueError("no samples to score")
    total, n_tok = 0.0, 0
    per_seq: list[float] = []
    for s in range(0, len(seqs), batch_size):
        batch = seqs[s : s + batch_size]
        # Empty samples (e.g. text that re-tokenises to nothing) have nothing to score.
        live = [b if b else [0] for b in batch]
        nll, cnt = _score_batch(scorer, live, count_repeated_eos)
        total += float(nll.sum())
        n_tok += int(cnt.sum())
        per_seq.extend(torch.where(cnt > 0, nll / cnt.clamp_min(1), torch.nan).tolist())
    if n_tok == 0:
        raise ValueError("the samples contain no scorable tokens (each needs at least two)")
    nats = total / n_tok
    return GenPPLResult(gen_ppl=math.exp(nats), nll_nats_per_token=nats, num_tokens=n_tok,
                        num_sequences=len(seqs), per_sequence_nll=per_seq, scorer=scorer.name)


def unigram_entropy(tokens: Sequence[int] | Tensor, ignore_ids: Sequence[int] = ()) -> float:
    """H = −Σ_v p̂_v log p̂_v (nats) of the empirical token distribution p̂ of one sequence."""
    t = torch.as_tensor(tokens, dtype=torch.long).flatten()
    if len(ignore_ids):
        t = t[~torch.isin(t, torch.as_tensor(list(ignore_ids), dtype=torch.long))]
    if t.numel() == 0:
        return 0.0
    _, counts = torch.unique(t, return_counts=True)
    p = counts.double() / counts.sum()
    return float(-(p * p.log()).sum())


def sample_entropy(samples: Sequence[Sequence[int]] | Tensor, ignore_ids: Sequence[int] = ()) -> dict:
    """Mean (and per-sample) unigram entropy in nats over samples: MDLM/DUO's diversity guard."""
    rows = samples.tolist() if isinstance(samples, Tensor) else samples
    if len(rows) == 0:
        raise ValueError("no samples")
    per = [unigram_entropy(r, ignore_ids) for r in rows]
    return {"entropy_mean": sum(per) / len(per), "entropy_per_sample": per}
