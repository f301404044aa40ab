"""Hugging Face adapters: any masked LM or causal LM as an LM of p_1 (MATH.md §4).

The adapters map our clean ids {0..V−1} to the HF model's ids (`token_ids[y]` is the HF id of our token y), call
the HF model and return logits restricted to those V ids, so they are drop-in replacements for `MaskedLM` and
`CausalLM`:

* `HFMaskedLM(model, token_ids, mask_token_id)`: x [B, L] with ids in {0..V} (V = [MASK]) → logits [B, L, V];
* `HFCausalLM(model, token_ids, bos_token_id)`: x [B, L] → next-token logits [B, L, V] (BOS prepended), plus
  `forward_soft` for the Taylor estimator and `kv_cache` / `extend` (the HF key/value cache) for the exact AR
  marginal's prefix reuse.

`transformers` is imported lazily, only by `from_pretrained` (install the `hf` extra); wrapping a model object
needs no import at all. Restricting the logits to V ids renormalises the HF distribution over our alphabet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from tcsm.models.kinds import HF_CAUSAL, HF_MLM

__all__ = ["HFCausalLM", "HFMaskedLM", "import_transformers"]


def import_transformers():
    """Import `transformers` or fail with a one-line fix."""
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("Hugging Face adapters need `transformers`: pip install 'tcsm[hf]'") from e
    return transformers


def _resolve_token_ids(token_ids, symbols, tokenizer, hf_vocab: int, vocab_size: int | None) -> list[int]:
    if token_ids is None and symbols is not None:
        if tokenizer is None:
            raise ValueError("mapping `symbols` to HF ids needs a tokenizer")
        token_ids = tokenizer.convert_tokens_to_ids(list(symbols))
    if token_ids is None:
        if vocab_size is None:
            raise ValueError(
                "pass token_ids (HF id of each clean token), symbols, or vocab_size for ids 0..V−1"
            )
        token_ids = list(range(vocab_size))
    token_ids = [int(i) for i in token_ids]
    if len(set(token_ids)) != len(token_ids) or min(token_ids) < 0 or max(token_ids) >= hf_vocab:
        raise ValueError(f"token_ids must be distinct HF ids in [0, {hf_vocab}), got {token_ids[:8]}…")
    return token_ids


def _load(auto: str, name_or_path: str, token_ids, symbols, need_tokenizer: bool, local_files_only: bool, kwargs):
    """(model, tokenizer or None, our token ids) of a Hugging Face model loaded with `transformers.<auto>`."""
    tf = import_transformers()
    kwargs.setdefault("trust_remote_code", False)  # never an interactive prompt: custom code must be asked for
    model = getattr(tf, auto).from_pretrained(name_or_path, local_files_only=local_files_only, **kwargs)
    tok = (tf.AutoTokenizer.from_pretrained(name_or_path, local_files_only=local_files_only, trust_remote_code=False)
           if need_tokenizer else None)
    hf_vocab = model.get_input_embeddings().weight.shape[0]
    return model, tok, _resolve_token_ids(token_ids, symbols, tok, hf_vocab, None)


def _cache_to_list(cache) -> list[tuple[Tensor, Tensor]]:
    """Per-layer (keys, values) of a Hugging Face dynamic cache ([B, H, S, Dh] each)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:  # transformers >= 4.54: Cache.layers of key/value layers
        if any(getattr(lay, "is_sliding", False) or getattr(lay, "keys", None) is None for lay in layers):
            raise NotImplementedError("only a plain dynamic key/value cache can be reused")
        return [(lay.keys, lay.values) for lay in layers]
    if hasattr(cache, "key_cache"):  # older DynamicCache
        return list(zip(cache.key_cache, cache.value_cache))
    if isinstance(cache, (tuple, list)) and all(len(c) == 2 for c in cache):  # legacy tuples
        return [tuple(c) for c in cache]
    raise NotImplementedError(f"cannot reuse a {type(cache).__name__} as a key/value cache")


class _HFAdapter(nn.Module):
    def __init__(self, model: nn.Module, token_ids: Sequence[int], special_id: int):
        super().__init__()
        self.hf = model
        hf_vocab = model.get_input_embeddings().weight.shape[0]
        ids = _resolve_token_ids(token_ids, None, None, hf_vocab, None)
        if not 0 <= int(special_id) < hf_vocab:
            raise ValueError(f"special token id {special_id} is outside the HF vocabulary [0, {hf_vocab})")
        self.vocab_size = len(ids)
        # table[y] = HF id of clean y for y < V, table[V] = the special ([MASK] / BOS) id.
        self.register_buffer(
            "table", torch.tensor(ids + [int(special_id)], dtype=torch.long), persistent=False
        )

    @property
    def token_ids(self) -> Tensor:
        return self.table[:-1]

    def _logits(self, **inputs) -> Tensor:
        out = self.hf(**inputs)
        logits = out.logits if hasattr(out, "logits") else out[0]
        return logits[..., self.token_ids].float()

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str,
        token_ids: Sequence[int] | None = None,
        symbols: Sequence[str] | None = None,
        local_files_only: bool = False,
        **kwargs: Any,
    ):
        """Load `transformers.<AUTO>` (and its tokenizer when `symbols` must be mapped to ids or the special id
        looked up). The special id is the keyword `SPECIAL` (`mask_token_id` / `bos_token_id`); None: the
        tokenizer's [MASK] for a masked LM, the model config's BOS for a causal LM. Other keywords go to
        `from_pretrained` of transformers."""
        special = kwargs.pop(cls.SPECIAL, None)
        need_tokenizer = symbols is not None or (special is None and cls.SPECIAL == "mask_token_id")
        model, tok, ids = _load(cls.AUTO, name_or_path, token_ids, symbols, need_tokenizer, local_files_only, kwargs)
        if special is None and cls.SPECIAL == "mask_token_id":
            special = tok.mask_token_id
        return cls(model, ids, special)


class HFMaskedLM(_HFAdapter):
    """Any HF masked LM as a `MaskedLM`: ids {0..V} (V = [MASK]) → logits [B, L, V] over our clean tokens."""

    model_kind = HF_MLM
    AUTO, SPECIAL = "AutoModelForMaskedLM", "mask_token_id"

    def __init__(self, model: nn.Module, token_ids: Sequence[int], mask_token_id: int):
        super().__init__(model, token_ids, mask_token_id)
        self.mask_id = self.vocab_size

    def forward(self, x: Tensor) -> Tensor:
        """Logits [B, L, V] of the HF MLM head restricted to our V tokens (MATH.md §4, BERT/MLM)."""
        return self._logits(input_ids=self.table[x])


class HFCausalLM(_HFAdapter):
    """Any HF causal LM as a `CausalLM`: x [B, L] → next-token logits [B, L, V] with BOS prepended."""

    model_kind = HF_CAUSAL
    AUTO, SPECIAL = "AutoModelForCausalLM", "bos_token_id"
    #: methods besides forward that run the network (a sharded model gathers its weights for them too)
    forward_methods = ("forward_soft", "log_prob", "kv_cache", "extend")

    def __init__(self, model: nn.Module, token_ids: Sequence[int], bos_token_id: int | None = None):
        if bos_token_id is None:
            bos_token_id = getattr(getattr(model, "config", None), "bos_token_id", None)
        if bos_token_id is None:
            raise ValueError("pass bos_token_id: the HF config defines none")
        super().__init__(model, token_ids, bos_token_id)
        self.bos_id = self.vocab_size

    def input_ids(self, x: Tensor) -> Tensor:
        """[BOS, x^0, …, x^{L−2}] in our id space (BOS = V)."""
        return torch.cat([torch.full_like(x[:, :1], self.bos_id), x[:, :-1]], dim=1)

    def forward(self, x: Tensor) -> Tensor:
        """Next-token logits [B, L, V]: logits[:, j] ∝ log p(x^j = · | x^{<j}) (MATH.md §5.4)."""
        return self._logits(input_ids=self.table[self.input_ids(x)])

    def forward_soft(self, probs: Tensor) -> Tensor:
        """Next-token logits for relaxed one-hot inputs probs [B, L, V] (embedding = probs · W_emb[token_ids])."""
        w = self.hf.get_input_embeddings().weight
        bos = w[self.table[-1]].expand(probs.shape[0], 1, -1)
        emb = torch.cat([bos, probs[:, :-1].to(w.dtype) @ w[self.token_ids]], dim=1)
        return self._logits(inputs_embeds=emb)

    # --- prefix reuse for the exact AR marginal (same contract as tcsm.models.causal.CausalLM) -----------
    @torch.no_grad()
    def kv_cache(self, x: Tensor):
        """(next-token logits [B, L, V], per-layer (keys, values) [B, H, L, Dh]) from the HF cache. Raises
        NotImplementedError for cache types other than a plain dynamic key/value cache (the AR estimators then
        score full sequences instead)."""
        out = self.hf(input_ids=self.table[self.input_ids(x)], use_cache=True)
        return out.logits[..., self.token_ids].float(), _cache_to_list(out.past_key_values)

    @torch.no_grad()
    def extend(self, tokens: Tensor, cache, start: int, return_cache: bool = False):
        """Logits for input ids `tokens` [N, n] (our ids, BOS = V) at positions start.., after cached positions;
        with `return_cache`, also the per-layer (keys, values) of all positions (for ancestral sampling)."""
        from transformers import DynamicCache

        past = DynamicCache()
        for layer, (k, v) in enumerate(cache):
            past.update(k, v, layer)
        pos = torch.arange(start, start + tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)
        out = self.hf(input_ids=self.table[tokens], past_key_values=past, position_ids=pos, use_cache=True)
        logits = out.logits[..., self.token_ids].float()
        return (logits, _cache_to_list(out.past_key_values)) if return_cache else logits

    def log_prob(self, x: Tensor) -> Tensor:
        """log p^AR(x) = Σ_j log p(x^j | x^{<j}) over our V tokens: [B]."""
        logp = torch.log_softmax(self.forward(x), dim=-1)
        return logp.gather(-1, x.unsqueeze(-1)).squeeze(-1).sum(-1)
