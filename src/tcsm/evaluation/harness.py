"""The three requests of a standard evaluation harness (lm-evaluation-harness) for a diffusion model, on token ids.

* `loglikelihood(context, continuation)`: −(valid bound) on −log p^θ(continuation | context), i.e. a lower
  bound on the conditional log-likelihood, estimated by Monte Carlo as the peers (LLaDA, SMDM, DUO) do. The
  context is pinned clean (never noised, never scored) and the masked bound of MATH.md §2.2 runs over the
  continuation's positions with `num_t` stratified times; the standard error is the strata's spread / √num_t
  (conservative for the stratified mean, as in `likelihood.nelbo_terms`). `is_greedy`: whether the continuation
  is the argmax of every position's conditional with the whole continuation masked (one-step greedy decoding).
* `loglikelihood_rolling(tokens)`: −bound on −log p^θ of the whole text, cut into windows of the model's length
  that are scored independently (the product of independent windows is itself a model, so the sum stays a
  valid bound; the SEDD/MDLM zero-shot layout, `tcsm.evaluation.zeroshot`).
* `generate_until(context, max_tokens)`: any sampler of `tcsm.sampling.settings` with the context pinned as a
  prompt; the caller cuts at its stop strings.

A request is evaluated at its own length (context + continuation, at most the model's length; the context is
cut on the left to fit), which a position-relative (RoPE) denoiser accepts. Everything here takes the model
object; reading a checkpoint and registering with lm-eval is `tcsm.cli.lmeval`'s job.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tcsm.evaluation.likelihood import nelbo_terms
from tcsm.sampling.settings import SampleSettings, draw, make_sampler

__all__ = ["DiffusionHarness", "LogLikelihood"]


@dataclass(frozen=True)
class LogLikelihood:
    """A Monte Carlo lower bound on log p(continuation | context) in nats, its standard error, and greediness."""

    value: float
    stderr: float
    is_greedy: bool


@dataclass
class DiffusionHarness:
    """`model` (a denoiser), its masked `path`, its maximum `length`; `num_t` Monte Carlo times per request;
    `settings` the sampler of `generate`; `seed` makes every request's draws reproducible."""

    model: object
    path: object
    length: int
    num_t: int = 32
    settings: SampleSettings = field(default_factory=SampleSettings)
    seed: int = 0
    device: torch.device | str = "cpu"

    def __post_init__(self):
        if self.path.mask_id is None:
            raise ValueError(
                "the harness's bound conditions by pinning clean positions: it needs a masked path"
            )
        if self.num_t < 2:
            raise ValueError(f"num_t must be >= 2 for a standard error, got {self.num_t}")

    def _gen(self, i: int) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(self.seed * 1_000_003 + i)

    def _pinned(self, ids: Tensor, ctx: Tensor):
        """The denoiser with the context (`ctx` [L] bool) of `ids` clean in its input and certain in its output,
        so the masked bound's sum over masked positions counts the continuation alone."""
        model = self.model

        def den(xt: Tensor, t: Tensor) -> Tensor:
            logits = model(torch.where(ctx, ids, xt), t).float()
            certain = torch.full_like(logits, -torch.inf).scatter(-1, ids.expand_as(xt).unsqueeze(-1), 0.0)
            return torch.where(ctx.unsqueeze(-1), certain, logits)

        return den

    @torch.no_grad()
    def loglikelihood(self, context: list[int], continuation: list[int], index: int = 0) -> LogLikelihood:
        if not continuation:
            raise ValueError("an empty continuation has no likelihood to bound")
        if len(continuation) > self.length:
            raise ValueError(
                f"a continuation of {len(continuation)} tokens exceeds the model's length {self.length}"
            )
        context = list(context)[max(0, len(context) + len(continuation) - self.length) :]
        ids = torch.tensor(context + list(continuation), dtype=torch.long, device=self.device)
        ctx = torch.zeros(ids.numel(), dtype=torch.bool, device=self.device)
        ctx[: len(context)] = True
        terms = nelbo_terms(
            self._pinned(ids, ctx), ids.unsqueeze(0), self.path, num_t=self.num_t, generator=self._gen(index)
        )
        terms = terms[:, 0].double()
        bound = float(terms.mean())
        stderr = float(terms.std()) / math.sqrt(self.num_t)
        x = torch.where(ctx, ids, torch.full_like(ids, self.path.mask_id)).unsqueeze(0)
        t = torch.zeros(1, dtype=torch.get_default_dtype(), device=self.device)
        greedy = bool((self.model(x, t)[0].argmax(-1)[~ctx] == ids[~ctx]).all())
        return LogLikelihood(-bound, stderr, greedy)

    @torch.no_grad()
    def loglikelihood_rolling(self, tokens: list[int], index: int = 0) -> LogLikelihood:
        total, var = 0.0, 0.0
        for w, s in enumerate(range(0, len(tokens), self.length)):
            r = self.loglikelihood([], tokens[s : s + self.length], index=index * 100_003 + w)
            total, var = total + r.value, var + r.stderr**2
        return LogLikelihood(total, math.sqrt(var), False)

    @torch.no_grad()
    def generate(self, context: list[int], max_tokens: int, index: int = 0) -> list[int]:
        """`max_tokens` new tokens (fewer if the context leaves less room) after `context`, by `settings`."""
        n = min(int(max_tokens), self.length)
        context = list(context)[max(0, len(context) + n - self.length) :]
        L = len(context) + n
        block = self.settings.semi_ar_block
        settings = self.settings
        if (
            block is not None and L % block
        ):  # a block layout over the continuation only would need a new length
            settings = SampleSettings(**{**settings.__dict__, "semi_ar_block": None})
        steps = min(settings.steps, n) if make_sampler(settings).steps_at_most_positions else None
        if steps is not None and steps != settings.steps:
            settings = SampleSettings(**{**settings.__dict__, "steps": steps})
        fixed = torch.zeros(1, L, dtype=torch.bool, device=self.device)
        fixed[0, : len(context)] = True
        values = torch.zeros(1, L, dtype=torch.long, device=self.device)
        values[0, : len(context)] = torch.tensor(context, dtype=torch.long)
        x, _ = draw(self.model, self.path, 1, L, settings, generator=self._gen(index), device=self.device,
                    fixed=fixed, values=values)  # fmt: skip
        return x[0, len(context) :].tolist()
