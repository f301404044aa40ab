"""Sequence log-likelihood estimates ℓ ≈ log p^θ(completion | prompt) for policy gradients, behind one interface:
`estimator(model, x, cond_mask, generator, sign=None) → ℓ [B]`, differentiable in the model's parameters.
`cond_mask` [B, L] marks the prompt (None: no prompt); `keep` [B, L] (None: all), the completion tokens whose terms
count (d1 leaves out those after the first end-of-sequence token; the one-step and exact estimates take it, the
ELBO's bound is over the whole completion); the randomness of an estimate is a function of `generator`
alone, so two calls with equally seeded generators see the same noise (the ratio of the current to the old
policy compares like with like).

* `OneStepEstimate` (diffu-GRPO, d1): one denoiser call with every completion token at the source (all masked),
  each prompt token masked independently with probability `prompt_mask_prob`; ℓ = Σ_{i completion}
  log m^i_θ(x^i | x_masked). A biased, low-variance proxy: it scores each token as if it were the first revealed.
  On a block model the denoiser reads the blocks before each block clean (its KV cache of x_1), so the estimate is a
  product over blocks, Σ_b Σ_{i ∈ block b} log m^i_θ(x^i | x^{<b} clean, block b at the source): only the current
  block's completion tokens are at the source, not the whole completion.
* `ELBOEstimate` (tcsm's own bound, MATH.md §2.2–2.4): ℓ = −NELBO(completion | prompt), `num_t` stratified times
  (`evaluation.likelihood.nelbo` with the prompt as `cond_mask`), an unbiased estimate of a lower bound on
  log p^θ. With `upper` (SPG), rollouts with a negative advantage use SPG's evidence upper bound instead (`eubo`),
  or the mixture ω·EUBO + (1 − ω)·ELBO, so that lowering ℓ lowers an upper bound rather than a lower one.
* `ExactEstimate`: ℓ = Σ_{j completion} log p(x^j | x^{<j}) of an autoregressive model (`model(x)` gives the
  next-token logits, `tcsm.targets.ar`) or of a block denoiser with one-token blocks: the likelihood itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import ClassVar

import torch
from torch import Tensor

from tcsm.core.parts import Parts
from tcsm.evaluation.likelihood import nelbo
from tcsm.models.kinds import denoise, kind_of
from tcsm.paths import ProbabilityPath
from tcsm.paths.timesteps import T_MIN, stratified_times

__all__ = ["ESTIMATORS", "ELBOEstimate", "ELBOSettings", "ExactEstimate", "NoSettings", "OneStepEstimate",
           "OneStepSettings", "SequenceLogLikelihood", "eubo", "make_estimator", "through_first_eos"]  # fmt: skip

#: every registered estimator, by name (`objective.estimator`); a new one is `@ESTIMATORS.register` on its class
ESTIMATORS = Parts("RL estimator")


def _completion(x: Tensor, cond_mask: Tensor | None) -> Tensor:
    return torch.ones_like(x, dtype=torch.bool) if cond_mask is None else ~cond_mask.to(torch.bool)


def through_first_eos(x: Tensor, cond_mask: Tensor | None, eos_id: int) -> Tensor:
    """[B, L] bool: the positions up to and including each row's first `eos_id` in its completion (every position of
    a row without one); prompt positions are kept (they are not completion terms anyway)."""
    comp = _completion(x, cond_mask)
    hit = (x == int(eos_id)) & comp
    before = torch.cumsum(hit.long(), -1) - hit.long()  # EOS tokens strictly before each position
    return before == 0


def _token_logprobs(logits: Tensor, x: Tensor) -> Tensor:
    """log m^i(x^i) [B, L] from logits [B, L, V], in float32 at least (float64 stays float64)."""
    logits = logits if logits.dtype == torch.float64 else logits.float()
    return torch.log_softmax(logits, -1).gather(-1, x.unsqueeze(-1)).squeeze(-1)


class SequenceLogLikelihood:
    """ℓ(model, x [B, L], cond_mask [B, L] | None, generator, sign [B] | None) → [B] (see the module docstring).
    `sign` is the sign of each rollout's advantage; only estimators that treat the two sides differently read it."""

    name: ClassVar[str] = ""
    help: ClassVar[str] = ""
    #: its options (a frozen dataclass; each field's help), keys of the run's `objective:` section
    settings_type: ClassVar[type] = None  # type: ignore[assignment]

    @classmethod
    def from_settings(cls, path: ProbabilityPath, settings) -> SequenceLogLikelihood:
        return cls(path, **{f.name: getattr(settings, f.name) for f in fields(settings)})

    def supports(self, model, path: ProbabilityPath) -> str | None:
        """None if this estimate is defined for `model` on `path`, else why not (one line)."""
        return None

    def __call__(self, model, x: Tensor, cond_mask: Tensor | None, generator=None, sign: Tensor | None = None,
                 keep: Tensor | None = None) -> Tensor:  # fmt: skip
        raise NotImplementedError


@dataclass(frozen=True)
class NoSettings:
    """An estimator without options."""


@dataclass(frozen=True)
class OneStepSettings:
    prompt_mask_prob: float = field(default=0.15, metadata={"help": "prompt tokens masked (d1)"})


@dataclass(frozen=True)
class ELBOSettings:
    num_t: int = field(default=1, metadata={"help": "stratified times per estimate"})
    upper: str = field(
        default="none",
        metadata={"help": "negative advantages: none | eubo | mix (SPG)", "choices": ("none", "eubo", "mix")},
    )
    eubo_beta: float = field(default=1.0, metadata={"help": "SPG's β of the upper bound (>= 1)"})
    mix_weight: float = field(default=0.5, metadata={"help": "upper=mix: weight ω of the upper bound"})


@ESTIMATORS.register
class OneStepEstimate(SequenceLogLikelihood):
    """d1's one-step estimate: completion at the source, prompt tokens masked with probability `prompt_mask_prob`,
    ℓ = Σ_{i completion} log m^i_θ(x^i | x̃) at the source end t = T_MIN; on a block model each block's terms read
    the blocks before it clean (see the module docstring)."""

    name = "one_step"
    help = ("d1's one-step estimate; its policy gradient has cosine 0.20-0.22 with the true one on a tiny "
            "enumerated policy")
    settings_type = OneStepSettings

    def __init__(self, path: ProbabilityPath, prompt_mask_prob: float = 0.15):
        if not 0.0 <= float(prompt_mask_prob) < 1.0:
            raise ValueError(f"prompt_mask_prob must be in [0, 1), got {prompt_mask_prob}")
        self.path, self.prompt_mask_prob = path, float(prompt_mask_prob)

    def supports(self, model, path):
        if not kind_of(model).is_denoiser:
            return "the one-step estimate reads a diffusion denoiser"
        if self.prompt_mask_prob > 0 and path.mask_id is None:
            return f"prompt masking needs a mask token; the {path.kind} path has none (set prompt_mask_prob=0)"
        return None

    def __call__(self, model, x, cond_mask, generator=None, sign=None, keep=None):
        B, L = x.shape
        comp = _completion(x, cond_mask)
        xin = torch.where(comp, self.path.prior_sample(B, L, device=x.device, generator=generator), x)
        if self.prompt_mask_prob > 0:
            hide = (torch.rand(B, L, generator=generator, device=x.device) < self.prompt_mask_prob) & ~comp
            xin = torch.where(hide, torch.full_like(x, self.path.mask_id), xin)
        t = torch.full((B,), T_MIN, device=x.device)  # the source end (t = 0 exactly has α_0 = 0 in a log)
        logp = _token_logprobs(denoise(model, xin, t, x), x)
        return (logp * (comp if keep is None else comp & keep)).sum(-1)


def eubo(model, x: Tensor, path: ProbabilityPath, *, num_t: int, beta: float, generator=None,
         cond_mask: Tensor | None = None) -> Tensor:  # fmt: skip
    """SPG's evidence upper bound, per sequence [B]:

        U_β(x) = (1/β) Σ_{i completion} log Ê_i,   Ê_i = (1/K) Σ_k 1[x_{t_k}^i = M] · (n + 1)/M_k · m^i_θ(x^i | x_{t_k})^β,

    over K = `num_t` stratified t_k ~ U(0, 1) and x_{t_k} ~ p_{t|1}(·|x) with the prompt kept; n = completion
    length, M_k = completion tokens masked in draw k. The weight (n + 1)/M_k is SPG's empirical masking rate 1/t̂
    (bounded by n + 1, where the exact 1/(1 − α_t) has infinite variance), scaled so that under the linear schedule
    Ê_i is unbiased for E_i = Σ_U |U|!(n−1−|U|)!/n! · m_i(x^i | prompt, x^U)^β over the sets U of other revealed
    completion tokens: the random-order average, which is what SPG's bound integrates (SPG's own scale differs by the
    θ-free constant n/(n + 1) per token). What it is exactly: with the model's conditionals equal to those of one
    joint distribution p, (1/β) log E_i ≥ E_U log p(x^i | x^U) (Jensen), whose sum over i is log p(x) (the chain
    rule along a random order), so U_β ≥ log p for every β ≥ 1; for a model whose conditionals are not those of
    its own sampler's law it is SPG's surrogate, not a guaranteed bound. The log of a K-sample mean is biased low
    (Jensen again), and a token masked in none of the K draws is left out (SPG's convention), which moves U_β up.
    Needs a masked path.
    """
    if path.mask_id is None or path.block_length is not None:
        raise ValueError(f"the evidence upper bound needs a full-sequence masked path, got the {path.kind} path")
    B, L = x.shape
    K = int(num_t)
    comp = _completion(x, cond_mask)
    t = stratified_times(K, B, generator=generator, device=x.device).clamp_min(T_MIN).reshape(-1)  # [K·B]
    xs = x.repeat(K, 1)
    xt = torch.where(comp.repeat(K, 1), path.draw_xt(xs, t, generator), xs)
    masked = (xt == path.mask_id).reshape(K, B, L)
    logp = _token_logprobs(denoise(model, xt, t, xs), xs).reshape(K, B, L)
    n = comp.sum(-1).float()  # [B]
    log_w = (torch.log(n + 1) - torch.log(masked.sum(-1).float().clamp_min(1))).unsqueeze(-1)  # [K, B, 1]
    terms = torch.where(masked, float(beta) * logp + log_w, torch.full_like(logp, -math.inf))
    log_e = torch.logsumexp(terms, 0) - math.log(K)  # [B, L]
    seen = torch.isfinite(log_e) & comp
    return torch.where(seen, log_e, torch.zeros_like(log_e)).sum(-1) / float(beta)


@ESTIMATORS.register
class ELBOEstimate(SequenceLogLikelihood):
    """ℓ = −NELBO(completion | prompt) with `num_t` stratified times (MATH.md §2.4); `upper` ("eubo" | "mix"):
    rollouts with sign < 0 use `eubo` (or ω·EUBO + (1 − ω)·ELBO with ω = `mix_weight`), SPG's sandwich."""

    name = "elbo"
    help = "the bound, cosine 0.72-0.75; SPG with --upper"
    settings_type = ELBOSettings

    def __init__(self, path: ProbabilityPath, num_t: int = 1, bound: str | None = None, upper: str | None = None,
                 eubo_beta: float = 1.0, mix_weight: float = 0.5):  # fmt: skip
        if int(num_t) < 1:
            raise ValueError(f"num_t must be >= 1, got {num_t}")
        if upper not in (None, "none", "eubo", "mix"):
            raise ValueError(f"upper must be none, eubo or mix, got {upper!r}")
        if float(eubo_beta) < 1.0:
            raise ValueError(f"eubo_beta must be >= 1, got {eubo_beta}")
        if not 0.0 <= float(mix_weight) <= 1.0:
            raise ValueError(f"mix_weight must be in [0, 1], got {mix_weight}")
        self.path, self.num_t, self.bound = path, int(num_t), bound
        self.upper = None if upper in (None, "none") else upper
        self.eubo_beta, self.mix_weight = float(eubo_beta), float(mix_weight)

    def supports(self, model, path):
        if not kind_of(model).is_denoiser:
            return "the ELBO estimate reads a diffusion denoiser"
        if self.upper and (path.mask_id is None or path.block_length is not None):
            return (f"the evidence upper bound is SPG's for a full-sequence masked path, this is the {path.kind} path"
                    f"{'' if path.block_length is None else f' with block_length={path.block_length}'} (set upper=none)")
        return None

    def __call__(self, model, x, cond_mask, generator=None, sign=None, keep=None):
        lower = -nelbo(model, x, self.path, num_t=self.num_t, generator=generator, bound=self.bound,
                       cond_mask=cond_mask).float()  # fmt: skip
        if self.upper is None or sign is None or not bool((sign < 0).any()):
            return lower
        up = eubo(model, x, self.path, num_t=self.num_t, beta=self.eubo_beta, generator=generator, cond_mask=cond_mask)
        if self.upper == "mix":
            up = self.mix_weight * up + (1.0 - self.mix_weight) * lower
        return torch.where(sign < 0, up, lower)


@ESTIMATORS.register
class ExactEstimate(SequenceLogLikelihood):
    """The policy's own likelihood, no noise: ℓ = Σ_{j completion} log p(x^j | x^{<j}) for an autoregressive model
    (`model(x)` gives next-token logits, MATH.md §4) and for a block denoiser on a masked path with block_length 1,
    whose sampler reveals one position at a time given the clean ones before it (MATH.md §9: B = 1 is the AR
    factorisation; its logits at position j read x^{<j} clean and x^j masked)."""

    name = "exact"
    help = "an AR model"
    settings_type = NoSettings

    def __init__(self, path: ProbabilityPath | None = None):
        self.path = path

    def _one_token_blocks(self, model, path) -> bool:
        return bool(kind_of(model).blocks and path is not None and path.block_length == 1 and path.mask_id is not None)

    def supports(self, model, path):
        if kind_of(model).is_autoregressive or self._one_token_blocks(model, path):
            return None
        return (f"the exact likelihood needs an autoregressive model or a block denoiser with path.block_length=1, "
                f"this is {kind_of(model).description}")  # fmt: skip

    def __call__(self, model, x, cond_mask, generator=None, sign=None, keep=None):
        if kind_of(model).is_autoregressive:
            logits = model(x)
        else:
            B, L = x.shape
            xt = torch.full_like(x, self.path.mask_id)
            logits = denoise(model, xt, torch.full((B, L), T_MIN, device=x.device), x)
        comp = _completion(x, cond_mask)
        return (_token_logprobs(logits, x) * (comp if keep is None else comp & keep)).sum(-1)


def make_estimator(name: str, path: ProbabilityPath, options: dict) -> SequenceLogLikelihood:
    """The estimator registered as `name` with the options its settings declare, read from `options` (a config
    section holding every estimator's keys); ValueError (one line) for an unknown name or a bad value."""
    cls = ESTIMATORS.get(name)
    return cls.from_settings(path, cls.settings_type(**{f.name: options[f.name] for f in fields(cls.settings_type)
                                                         if f.name in options}))  # fmt: skip
