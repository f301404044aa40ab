"""Log concrete scores of an autoregressive model: ℓ^i(y) = log p^AR([y, x^{≠i}]) − log p^AR(x) (MATH.md §4, §5.4).

An `ARScoreEstimator` maps (causal model, clean x [B, L]) to ℓ [B, L, V], with −inf for tokens it leaves out;
`log_softmax(ℓ)` over y is then the teacher's single-site conditional p^AR(y | x^{≠i}). Estimators:

* `ExactARScore`: every y, (V−1)L+1 sequence scores. With a model that offers `kv_cache` / `extend`
  (`tcsm.models.causal.CausalLM`, `tcsm.models.hf.HFCausalLM`) the prefix x^{<i} is run once and only the
  changed suffixes are evaluated, Σ_i (V−1)(L−1−i) token evaluations; any other causal model is scored
  naively (every changed sequence in full), in chunks.
* `TopKARScore` (`alg:topk_log_density_ratio`): candidates TopK_y p(y | x^{<i}) ∪ {x^i}, scored exactly; the
  rest gets −inf (a truncation bias). At most LK+1 sequence scores (the paper counts L(K+1), x^i included).
* `TopKNgramARScore` (`alg:topk_ngram_log_density_ratio`): the same, with the Top-K' of a right-context n-gram
  p(x^i | x^{i+1:i+N−1}) (`tcsm.posttrain.distill.ngram`) added to every candidate set; the union is scored exactly.
* `TaylorARScore` (`alg:ddlm_taylor`): one forward/backward pass with relaxed one-hot inputs E;
  ℓ^i(y) ≈ (g_{i,y} − g_{i,x^i}) / τ with g = ∇_E Σ_j ⟨E_j, log softmax(logits_{j−1})⟩. The term
  log p(y | x^{<i}) − log p(x^i | x^{<i}) is exact; only the effect of y on later tokens is linearised.

`estimator.estimate(model, x)` also returns what the estimate cost (`ARScoreEstimate`): sequence scores (the
unit of MATH.md §8 item 19: x itself plus each distinct changed sequence) and the token positions the teacher
actually evaluated. Candidate sets are deduplicated before scoring, so each sequence is scored once.

The causal model interface: `model(x)` → next-token logits [B, L, V] (logits[:, j] for x^j given x^{<j}, BOS
internal), `model.vocab_size`; optionally `input_ids`, `kv_cache`, `extend` (prefix reuse, KV-cached
sampling) and `forward_soft` (Taylor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from tcsm.core.parts import Parts

__all__ = [
    "AR_ESTIMATORS",
    "ARScoreEstimate",
    "ARScoreEstimator",
    "ExactARScore",
    "TaylorARScore",
    "TopKARScore",
    "TopKNgramARScore",
    "estimator_options",
    "first_occurrence",
    "make_ar_estimator",
    "missed_mass",
    "sample_ar",
    "score_candidates",
    "score_candidates_naive",
    "total_variation",
]


def _token_logprobs(logits: Tensor, x: Tensor) -> Tensor:
    """log p(x^j | x^{<j}) [.., L] from next-token logits [.., L, V]."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, x.unsqueeze(-1)).squeeze(-1)


def _all_candidates(x: Tensor, vocab_size: int) -> Tensor:
    return torch.arange(vocab_size, device=x.device).expand(x.shape + (vocab_size,))


def first_occurrence(candidates: Tensor) -> Tensor:
    """BoolTensor like `candidates` [.., C]: True at the first occurrence of each id ≥ 0 along the last axis
    (negative ids are padding). A stable sort puts equal ids next to each other in their original order."""
    vals, order = torch.sort(candidates, dim=-1, stable=True)
    repeat = torch.zeros_like(candidates, dtype=torch.bool)
    repeat.scatter_(-1, order[..., 1:], vals[..., 1:] == vals[..., :-1])
    return ~repeat & (candidates >= 0)


def _scored(x: Tensor, candidates: Tensor, valid: Tensor | None) -> tuple[Tensor, Tensor]:
    """(valid entries, entries that need a teacher evaluation: valid and not the observed token)."""
    valid = (candidates >= 0) if valid is None else (valid & (candidates >= 0))
    return valid, valid & (candidates != x.unsqueeze(-1))


def _naive(model, x: Tensor, candidates: Tensor, valid: Tensor, max_tokens: int, logits: Tensor | None) -> Tensor:
    L = x.shape[1]
    valid, todo = _scored(x, candidates, valid)
    base = _token_logprobs(model(x) if logits is None else logits, x).sum(-1)  # [B]
    out = torch.full(candidates.shape, -math.inf, device=x.device)
    out[valid & ~todo] = 0.0  # ℓ^i(x^i) = 0 exactly
    b, i, c = todo.nonzero(as_tuple=True)
    if b.numel():
        seqs = x[b].clone()
        seqs[torch.arange(b.numel(), device=x.device), i] = candidates[b, i, c]
        chunk = max(1, max_tokens // L)
        scores = torch.cat([_token_logprobs(model(s), s).sum(-1) for s in seqs.split(chunk)])
        out[b, i, c] = scores - base[b]
    return out


@torch.no_grad()
def score_candidates_naive(
    model, x: Tensor, candidates: Tensor, max_tokens: int = 1 << 16, valid: Tensor | None = None
) -> Tensor:
    """ℓ^i(c) = log p^AR([c, x^{≠i}]) − log p^AR(x) for candidates c = candidates[b, i, k]: [B, L, C], by scoring
    every changed sequence in full (MATH.md §4). Entries with `valid` False or a negative id get −inf; the
    observed token gets exactly 0. Needs only `model(x)`; the reference for `score_candidates`."""
    return _naive(model, x, candidates, valid, max_tokens, None)


def _cached(model, x: Tensor, candidates: Tensor, valid: Tensor, max_tokens: int, logits: Tensor, cache) -> Tensor:
    """Position i's term [log p(c | x^{<i}) − log p(x^i | x^{<i})] from the base pass, plus the change of every
    later token's log-prob from the cached prefix, for each valid (b, c) pair at i (ragged: only those)."""
    L = x.shape[1]
    valid, todo = _scored(x, candidates, valid)
    logp = torch.log_softmax(logits.float(), dim=-1)  # [B, L, V]
    base_tok = logp.gather(-1, x.unsqueeze(-1)).squeeze(-1)  # [B, L]
    out = logp.gather(-1, candidates.clamp_min(0)) - base_tok.unsqueeze(-1)
    ids = model.input_ids(x)  # input position p holds x^{p−1}
    for i in range(L - 1):
        b_idx, c_idx = todo[:, i].nonzero(as_tuple=True)
        rows = max(1, max_tokens // L)  # a row holds i+1 cached and L−1−i new positions: L in flight
        for s in range(0, b_idx.numel(), rows):
            bb, cc = b_idx[s : s + rows], c_idx[s : s + rows]
            toks = torch.cat([candidates[bb, i, cc].unsqueeze(1), ids[bb, i + 2 :]], dim=1)
            past = [(k[bb, :, : i + 1], v[bb, :, : i + 1]) for k, v in cache]
            lp = _token_logprobs(model.extend(toks, past, i + 1), x[bb, i + 1 :])
            out[bb, i, cc] += (lp - base_tok[bb, i + 1 :]).sum(-1)
    out = out.masked_fill(~valid, -math.inf)
    return out.masked_fill(valid & ~todo, 0.0)  # ℓ^i(x^i) = 0 exactly, not a difference of two computations


def _base_pass(model, x: Tensor, prefix_reuse: bool):
    """(next-token logits, key/value cache or None): the one full pass every estimate starts from."""
    if prefix_reuse and hasattr(model, "kv_cache") and hasattr(model, "extend"):
        try:
            return model.kv_cache(x)
        except NotImplementedError:  # e.g. an HF model whose cache cannot be sliced
            pass
    return model(x), None


def _score(model, x, candidates, valid, max_tokens, base) -> Tensor:
    logits, cache = base
    if cache is None:
        return _naive(model, x, candidates, valid, max_tokens, logits)
    return _cached(model, x, candidates, valid, max_tokens, logits, cache)


@torch.no_grad()
def score_candidates(
    model, x: Tensor, candidates: Tensor, max_tokens: int = 1 << 16, valid: Tensor | None = None
) -> Tensor:
    """ℓ^i(c) as in `score_candidates_naive` [B, L, C], reusing the prefix x^{<i} through the model's key/value
    cache (MATH.md §4). Only valid, non-observed entries are evaluated, batched across the batch's rows at each
    position (ragged candidate sets cost only what they hold); padding (id < 0) and invalid entries get −inf."""
    return _score(model, x, candidates, valid, max_tokens, _base_pass(model, x, True))


def _cost(x: Tensor, candidates: Tensor, valid: Tensor, reused: bool) -> tuple[Tensor, Tensor]:
    """(sequence scores [B], token evaluations [B]) of scoring `candidates`: x once plus every valid changed
    sequence; with prefix reuse a change at i evaluates the L−1−i later positions only (MATH.md §8 item 19)."""
    L = x.shape[1]
    _, todo = _scored(x, candidates, valid)
    per_pos = todo.sum(-1).double()  # [B, L] changed sequences per position
    seqs = 1.0 + per_pos.sum(-1)
    suffix = torch.arange(L - 1, -1, -1, device=x.device, dtype=torch.float64)
    tokens = L + ((per_pos * suffix).sum(-1) if reused else per_pos.sum(-1) * L)
    return seqs.float(), tokens.float()


@dataclass
class ARScoreEstimate:
    """What an estimator returns: ℓ [B, L, V] (−inf outside the candidate set) and its cost per sequence [B]."""

    ell: Tensor
    seq_scores: Tensor  # full-sequence scores: x itself plus each distinct changed sequence
    token_evals: Tensor  # token positions the teacher evaluated (prefix reuse evaluates only suffixes)


class ARScoreEstimator:
    """(causal model, x [B, L]) → ℓ [B, L, V] ≈ log p^AR([y, x^{≠i}]) − log p^AR(x), −inf where left out
    (MATH.md §5.4). `conditionals` gives log p^AR(y | x^{≠i}) = log_softmax_y ℓ^i(y); `estimate` adds the cost."""

    name = "base"

    def estimate(self, model, x: Tensor) -> ARScoreEstimate:
        raise NotImplementedError

    def log_scores(self, model, x: Tensor) -> Tensor:
        return self.estimate(model, x).ell

    def __call__(self, model, x: Tensor) -> Tensor:
        return self.log_scores(model, x)

    def conditionals(self, model, x: Tensor) -> Tensor:
        """log p^AR(x^i = y | x^{≠i}) [B, L, V] (MATH.md §4, AR marginalisation)."""
        return torch.log_softmax(self.log_scores(model, x), dim=-1)

    def sequence_scores(self, length: int, vocab_size: int) -> float:
        """Nominal cost per sequence in full-sequence evaluations (an upper bound for candidate estimators;
        MATH.md §5.4, §8 item 19)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


class _CandidateEstimator(ARScoreEstimator):
    """Scores a candidate set C_i ∋ x^i exactly and sets ℓ = −inf outside it (MATH.md §5.4)."""

    def __init__(self, prefix_reuse: bool = True, max_tokens: int = 1 << 16):
        self.prefix_reuse = bool(prefix_reuse)
        self.max_tokens = int(max_tokens)

    def candidates(self, model, x: Tensor, logits: Tensor) -> Tensor:
        """Candidate ids [B, L, C] (negative = padding; duplicates allowed) from the base pass's logits."""
        raise NotImplementedError

    @torch.no_grad()
    def estimate(self, model, x):
        base = _base_pass(model, x, self.prefix_reuse)
        cands = self.candidates(model, x, base[0])
        valid = first_occurrence(cands)  # each distinct sequence is scored once
        vals = _score(model, x, cands, valid, self.max_tokens, base)
        out = torch.full(x.shape + (model.vocab_size,), -math.inf, device=x.device, dtype=vals.dtype)
        # Invalid entries hold −inf, so a maximum keeps the one exact value of a repeated candidate.
        out = out.scatter_reduce(-1, cands.clamp_min(0), vals, reduce="amax")
        seqs, tokens = _cost(x, cands, valid, base[1] is not None)
        return ARScoreEstimate(out, seqs, tokens)


class ExactARScore(_CandidateEstimator):
    """Every y exactly: (V−1)L+1 sequence scores; prefix reuse when the model has a KV cache (MATH.md §4)."""

    name = "exact"

    def candidates(self, model, x, logits):
        return _all_candidates(x, model.vocab_size)

    def sequence_scores(self, length, vocab_size):
        return (vocab_size - 1) * length + 1


class TopKARScore(_CandidateEstimator):
    """Candidates C_i = TopK_y p(y | x^{<i}) ∪ {x^i}, scored exactly; ℓ = −inf outside C_i (MATH.md §5.4)."""

    name = "topk"

    def __init__(self, k: int = 8, prefix_reuse: bool = True, max_tokens: int = 1 << 16):
        if int(k) < 1:
            raise ValueError(f"top-k needs k >= 1, got {k}")
        super().__init__(prefix_reuse, max_tokens)
        self.k = int(k)

    def candidates(self, model, x, logits):
        # The proposal for position i is the output at i (it conditions on x^{<i}); MATH.md §8 item 19.
        top = logits.topk(min(self.k, model.vocab_size), dim=-1).indices
        return torch.cat([top, x.unsqueeze(-1)], dim=-1)

    def sequence_scores(self, length, vocab_size):
        return length * min(self.k, vocab_size) + 1


class TopKNgramARScore(TopKARScore):
    """C_i = TopK_y p^AR(y | x^{<i}) ∪ TopK'_y p(y | x^{i+1:i+N−1}) ∪ {x^i}, scored exactly (MATH.md §5.4,
    `alg:topk_ngram_log_density_ratio`). `ngram` is a `tcsm.posttrain.distill.ngram.RightContextNgram` (anything with
    `topk(x, k)` → ids [B, L, k], −1 padding); it may be attached after construction (a run counts it first)."""

    name = "topk_ngram"

    def __init__(
        self,
        k: int = 8,
        ngram=None,
        ngram_k: int | None = None,
        prefix_reuse: bool = True,
        max_tokens: int = 1 << 16,
    ):
        super().__init__(k, prefix_reuse, max_tokens)
        self.ngram_k = self.k if ngram_k is None else int(ngram_k)
        if self.ngram_k < 1:
            raise ValueError(f"the n-gram's top-k needs ngram_k >= 1, got {ngram_k}")
        self.ngram = ngram

    def candidates(self, model, x, logits):
        if self.ngram is None:
            raise ValueError(
                "the Top-K + n-gram estimator has no n-gram: use target.name=distill (tcsm distill), which counts one "
                "from the training data, or set .ngram = RightContextNgram.fit(rows, N, V)"
            )
        return torch.cat([super().candidates(model, x, logits), self.ngram.topk(x, self.ngram_k)], dim=-1)

    def sequence_scores(self, length, vocab_size):
        return length * min(self.k + self.ngram_k, vocab_size - 1) + 1


class TaylorARScore(ARScoreEstimator):
    """First-order Taylor estimate from one gradient of log p^AR w.r.t. relaxed one-hot inputs (MATH.md §5.4)."""

    name = "taylor"

    def __init__(self, temperature: float = 1.0):
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)

    def estimate(self, model, x):
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
        ell = (g - g.gather(-1, x.unsqueeze(-1))) / self.temperature
        ones = torch.ones(x.shape[0], device=x.device)
        # One forward and one backward pass ≈ 3 forward passes of the sequence.
        return ARScoreEstimate(ell, 3.0 * ones, 3.0 * x.shape[1] * ones)

    def sequence_scores(self, length, vocab_size):
        return 3.0


AR_ESTIMATORS = Parts(
    "AR score estimator",
    {"exact": ExactARScore, "topk": TopKARScore, "topk_ngram": TopKNgramARScore, "taylor": TaylorARScore},
)


def estimator_options(name: str) -> frozenset[str]:
    """The keyword options the estimator registered as `name` takes: its constructor's parameters (read from the
    class, so no table of options is kept beside it)."""
    import inspect

    return frozenset(inspect.signature(AR_ESTIMATORS.lookup(name)).parameters)


def make_ar_estimator(name: str | ARScoreEstimator = "exact", **kwargs) -> ARScoreEstimator:
    """Build an estimator by name (one of `AR_ESTIMATORS`) with keyword options, or pass one through."""
    if isinstance(name, ARScoreEstimator):
        return name
    cls = AR_ESTIMATORS.lookup(name)
    try:
        return cls(**kwargs)
    except TypeError as e:  # an option another estimator takes (e.g. temperature for topk)
        raise ValueError(f"AR estimator {name!r}: {e}") from None


# --------------------------------------------------------------------------------------------------- audits


def missed_mass(ell: Tensor, exact_log_cond: Tensor) -> Tensor:
    """1 − Σ_{y ∈ C_i} p^AR(y | x^{≠i}) [B, L]: the teacher mass outside an estimator's candidate set C_i
    (its finite ℓ entries), under the exact conditionals [B, L, V] (MATH.md §5.4, §8 item 19)."""
    inside = torch.where(torch.isfinite(ell), exact_log_cond.double().exp(), torch.zeros((), dtype=torch.float64))
    return (1.0 - inside.sum(-1)).clamp_min(0.0)


def total_variation(log_p: Tensor, log_q: Tensor) -> Tensor:
    """½ Σ_y |p(y) − q(y)| over the last axis, from log-probabilities."""
    return 0.5 * (log_p.double().exp() - log_q.double().exp()).abs().sum(-1)


# --------------------------------------------------------------------------------------------------- sampling


@torch.no_grad()
def sample_ar(
    model,
    num: int,
    length: int,
    generator: torch.Generator | None = None,
    device=None,
    *,
    prefix: Tensor | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    engine: str = "auto",
) -> Tensor:
    """x^j ~ p^AR(· | x^{<j}) for j = 0..L−1, ancestrally: LongTensor[num, length] (MATH.md §4, §5.4 proposal
    h = p^AR). With `kv_cache` / `extend(..., return_cache=True)` each step runs one new position against the
    cached prefix (L passes of one token); otherwise every step reruns the prefix.

    `prefix` [num, P] (a prompt) fixes x^{<P}, left to right: only x^{≥P} are drawn. `temperature` / `top_p`
    reshape each conditional (tcsm.sampling.adjust_log_probs); the defaults draw from p^AR itself, exactly as
    before (the same random draws). A model with a static cache (`new_cache` / `decode`, `CausalLM`) runs the prompt
    in one call and is decoded by `tcsm.sampling.engine.decode_ar` (`engine`: auto | eager | graph)."""
    if device is None:
        device = next(model.parameters()).device
    x = torch.zeros(num, length, dtype=torch.long, device=device)
    P = 0
    if prefix is not None:
        P = int(prefix.shape[-1])
        if P > length:
            raise ValueError(f"a prefix of {P} tokens does not fit in length {length}")
        x[:, :P] = prefix.to(device=device, dtype=torch.long).expand(num, P)
    adjust = None
    if temperature != 1.0 or top_p < 1.0:
        from tcsm.sampling import adjust_log_probs

        def adjust(logits):
            return adjust_log_probs(logits, temperature, top_p)
    from tcsm.sampling.common import row_streams

    streams = row_streams(generator, num, device)  # x^j of row r: drawn at the uniform keyed by (r's seed, j)
    if hasattr(model, "new_cache") and hasattr(model, "decode"):  # a static cache: prefill, then one token a call
        from tcsm.sampling.engine import decode_ar

        return decode_ar(model, x, P, streams, adjust, engine=engine)
    from tcsm.sampling.common import inverse_cdf

    u = streams.uniform(0, length)
    cached = hasattr(model, "kv_cache") and hasattr(model, "extend")
    if cached:
        try:
            logits, cache = model.kv_cache(x[:, :1])  # input [BOS]: the logits of x^0
        except NotImplementedError:  # a cache type that cannot be continued: rerun prefixes
            cached = False
    for j in range(length):
        if j >= P:
            step = logits[:, -1] if cached else model(x[:, : j + 1])[:, j]
            lp = torch.log_softmax(step.double(), dim=-1) if adjust is None else adjust(step)
            x[:, j] = inverse_cdf(lp, u[:, j])
        if cached and j + 1 < length:
            logits, cache = model.extend(x[:, j : j + 1], cache, j + 1, return_cache=True)
    return x
