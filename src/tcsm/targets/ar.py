"""Log concrete scores of an autoregressive model: ℓ^i(y) = log p^AR([y, x^{≠i}]) − log p^AR(x) (MATH.md §4, §5.4).

An `ARScoreEstimator` maps (causal model, clean x [B, L]) to ℓ [B, L, V], with −inf for tokens it leaves out;
`log_softmax(ℓ)` over y is then the teacher's single-site conditional p^AR(y | x^{≠i}). Estimators:

* `ExactARScore`: every y, (V−1)L+1 sequence scores. With a model that offers `kv_cache` / `extend`
  (`tcsm.models.causal.CausalLM`) the prefix x^{<i} is run once and only the V variants of the suffix are
  evaluated for each i, Σ_i V(L−i) token evaluations; any other causal model is scored naively (V·L full
  sequences), in chunks.
* `TopKARScore` (`alg:topk_log_density_ratio`): candidates TopK_y p(y | x^{<i}) ∪ {x^i}, scored exactly; the
  rest gets −inf (a truncation bias). L(K+1) sequence scores.
* `TaylorARScore` (`alg:ddlm_taylor`): one forward/backward pass with relaxed one-hot inputs E;
  ℓ^i(y) ≈ (g_{i,y} − g_{i,x^i}) / τ with g = ∇_E Σ_j ⟨E_j, log softmax(logits_{j−1})⟩. The term
  log p(y | x^{<i}) − log p(x^i | x^{<i}) is exact; only the effect of y on later tokens is linearised.

The causal model interface: `model(x)` → next-token logits [B, L, V] (logits[:, j] for x^j given x^{<j}, BOS
internal), `model.vocab_size`; optionally `input_ids`, `kv_cache`, `extend` (prefix reuse) and `forward_soft`
(Taylor).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "AR_ESTIMATORS",
    "ARScoreEstimator",
    "ExactARScore",
    "TaylorARScore",
    "TopKARScore",
    "make_ar_estimator",
    "score_candidates",
    "score_candidates_naive",
]


def _token_logprobs(logits: Tensor, x: Tensor) -> Tensor:
    """log p(x^j | x^{<j}) [.., L] from next-token logits [.., L, V]."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, x.unsqueeze(-1)).squeeze(-1)


def _all_candidates(x: Tensor, vocab_size: int) -> Tensor:
    return torch.arange(vocab_size, device=x.device).expand(x.shape + (vocab_size,))


@torch.no_grad()
def score_candidates_naive(model, x: Tensor, candidates: Tensor, max_tokens: int = 1 << 16) -> Tensor:
    """ℓ^i(c) = log p^AR([c, x^{≠i}]) − log p^AR(x) for candidates c = candidates[b, i, k]: [B, L, C], by scoring
    every modified sequence in full (MATH.md §4). Needs only `model(x)`; the reference for `score_candidates`."""
    B, L = x.shape
    C = candidates.shape[-1]
    base = _token_logprobs(model(x), x).sum(-1)  # [B]
    seqs = x[:, None, None, :].expand(B, L, C, L).clone()
    pos = torch.arange(L, device=x.device)
    seqs[:, pos, :, pos] = candidates.permute(1, 0, 2)  # seqs[b, i, k, i] = candidates[b, i, k]
    flat = seqs.reshape(-1, L)
    chunk = max(1, max_tokens // L)
    scores = torch.cat([_token_logprobs(model(s), s).sum(-1) for s in flat.split(chunk)])
    return _exact_zero_at_observed(scores.view(B, L, C) - base[:, None, None], x, candidates)


def _exact_zero_at_observed(ell: Tensor, x: Tensor, candidates: Tensor) -> Tensor:
    """ℓ^i(x^i) = 0 by definition; writing it exactly removes round-off of two different computations."""
    return ell.masked_fill(candidates == x.unsqueeze(-1), 0.0)


@torch.no_grad()
def score_candidates(model, x: Tensor, candidates: Tensor, max_tokens: int = 1 << 16) -> Tensor:
    """ℓ^i(c) as in `score_candidates_naive` [B, L, C], reusing the prefix x^{<i} through the model's key/value
    cache: position i's term is [log p(c | x^{<i}) − log p(x^i | x^{<i})] from one base pass, plus the change of
    every later token's log-prob, computed from the cached prefix for the C suffix variants (MATH.md §4)."""
    if not (hasattr(model, "kv_cache") and hasattr(model, "extend")):
        return score_candidates_naive(model, x, candidates, max_tokens)
    try:
        logits, cache = model.kv_cache(x)
    except NotImplementedError:  # e.g. an HF model whose cache cannot be sliced
        return score_candidates_naive(model, x, candidates, max_tokens)
    B, L = x.shape
    C = candidates.shape[-1]
    logp = torch.log_softmax(logits.float(), dim=-1)  # [B, L, V]
    base_tok = logp.gather(-1, x.unsqueeze(-1)).squeeze(-1)  # [B, L]
    out = logp.gather(-1, candidates) - base_tok.unsqueeze(-1)  # the term at position i itself
    ids = model.input_ids(x)  # input position p holds x^{p−1}
    for i in range(L - 1):
        n = L - 1 - i  # input positions i+1..L−1 change (position i+1 now holds the candidate)
        rows = max(1, max_tokens // (C * (n + i + 1)))
        for b0 in range(0, B, rows):
            b1 = min(B, b0 + rows)
            nb = b1 - b0
            toks = torch.cat(
                [candidates[b0:b1, i].reshape(nb * C, 1), ids[b0:b1, i + 2 :].repeat_interleave(C, 0)], dim=1
            )
            past = [
                (k[b0:b1, :, : i + 1].repeat_interleave(C, 0), v[b0:b1, :, : i + 1].repeat_interleave(C, 0))
                for k, v in cache
            ]
            lp = _token_logprobs(model.extend(toks, past, i + 1), x[b0:b1, i + 1 :].repeat_interleave(C, 0))
            delta = lp - base_tok[b0:b1, i + 1 :].repeat_interleave(C, 0)
            out[b0:b1, i] += delta.sum(-1).view(nb, C)
    return _exact_zero_at_observed(out, x, candidates)


class ARScoreEstimator:
    """(causal model, x [B, L]) → ℓ [B, L, V] ≈ log p^AR([y, x^{≠i}]) − log p^AR(x), −inf where left out
    (MATH.md §5.4). `conditionals` gives log p^AR(y | x^{≠i}) = log_softmax_y ℓ^i(y)."""

    name = "base"

    def log_scores(self, model, x: Tensor) -> Tensor:
        raise NotImplementedError

    def __call__(self, model, x: Tensor) -> Tensor:
        return self.log_scores(model, x)

    def conditionals(self, model, x: Tensor) -> Tensor:
        """log p^AR(x^i = y | x^{≠i}) [B, L, V] (MATH.md §4, AR marginalisation)."""
        return torch.log_softmax(self.log_scores(model, x), dim=-1)

    def sequence_scores(self, length: int, vocab_size: int) -> float:
        """Cost per sequence in full-sequence evaluations (MATH.md §5.4, §8 item 19)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


class ExactARScore(ARScoreEstimator):
    """Every y exactly: (V−1)L+1 sequence scores; prefix reuse when the model has a KV cache (MATH.md §4)."""

    name = "exact"

    def __init__(self, prefix_reuse: bool = True, max_tokens: int = 1 << 16):
        self.prefix_reuse = bool(prefix_reuse)
        self.max_tokens = int(max_tokens)

    def log_scores(self, model, x):
        cands = _all_candidates(x, model.vocab_size)
        fn = score_candidates if self.prefix_reuse else score_candidates_naive
        return fn(model, x, cands, self.max_tokens)

    def sequence_scores(self, length, vocab_size):
        return (vocab_size - 1) * length + 1


class TopKARScore(ARScoreEstimator):
    """Candidates C_i = TopK_y p(y | x^{<i}) ∪ {x^i}, scored exactly; ℓ = −inf outside C_i (MATH.md §5.4)."""

    name = "topk"

    def __init__(self, k: int = 8, prefix_reuse: bool = True, max_tokens: int = 1 << 16):
        if int(k) < 1:
            raise ValueError(f"top-k needs k >= 1, got {k}")
        self.k = int(k)
        self.prefix_reuse = bool(prefix_reuse)
        self.max_tokens = int(max_tokens)

    @torch.no_grad()
    def log_scores(self, model, x):
        V = model.vocab_size
        k = min(self.k, V)
        # The proposal for position i is the output at i (it conditions on x^{<i}); MATH.md §8 item 19.
        top = model(x).topk(k, dim=-1).indices  # [B, L, k]
        cands = torch.cat([top, x.unsqueeze(-1)], dim=-1)  # x^i always scored (ℓ = 0 there)
        fn = score_candidates if self.prefix_reuse else score_candidates_naive
        vals = fn(model, x, cands, self.max_tokens)
        out = torch.full(x.shape + (V,), -math.inf, device=x.device, dtype=vals.dtype)
        # A duplicate of x^i inside the top-k writes the same exact value twice, so the order is irrelevant.
        return out.scatter(-1, cands, vals)

    def sequence_scores(self, length, vocab_size):
        return length * min(self.k, vocab_size) + 1


class TaylorARScore(ARScoreEstimator):
    """First-order Taylor estimate from one gradient of log p^AR w.r.t. relaxed one-hot inputs (MATH.md §5.4)."""

    name = "taylor"

    def __init__(self, temperature: float = 1.0):
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)

    def log_scores(self, model, x):
        if not hasattr(model, "forward_soft"):
            raise TypeError(
                f"{type(model).__name__} has no forward_soft(probs): the Taylor estimator needs one"
            )
        V = model.vocab_size
        with torch.enable_grad():  # targets are built under no_grad; the gradient is w.r.t. the inputs only
            E = torch.nn.functional.one_hot(x, V).float().requires_grad_(True)
            logp = torch.log_softmax(model.forward_soft(E).float(), dim=-1)
            total = (E * logp).sum()
            (g,) = torch.autograd.grad(total, E)
        g = g.detach()
        return (g - g.gather(-1, x.unsqueeze(-1))) / self.temperature

    def sequence_scores(self, length, vocab_size):
        return 3.0  # one forward and one backward pass ≈ 3 forward passes


AR_ESTIMATORS: dict[str, type[ARScoreEstimator]] = {
    "exact": ExactARScore,
    "topk": TopKARScore,
    "taylor": TaylorARScore,
}


def make_ar_estimator(name: str | ARScoreEstimator = "exact", **kwargs) -> ARScoreEstimator:
    """Build an estimator by name (one of `AR_ESTIMATORS`) with keyword options, or pass one through."""
    if isinstance(name, ARScoreEstimator):
        return name
    if name not in AR_ESTIMATORS:
        raise ValueError(f"unknown AR score estimator {name!r}; choose one of {sorted(AR_ESTIMATORS)}")
    return AR_ESTIMATORS[name](**kwargs)
