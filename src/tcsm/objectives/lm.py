"""Training losses for the LMs (models of the data, not diffusion models) that serve as parametric targets (MATH.md §4).

Each loss is an objective in the trainer's sense: `loss(model, x1, generator)` → (scalar loss, metrics), in nats
per token.

* `MaskedLMLoss`: BERT's masked-LM loss — mask a random fraction of positions, cross-entropy on them;
* `AutoregressiveLoss`: next-token NLL, −(1/L) log p^AR(x) (an exact likelihood: `bpc` is a true bound-free BPC);
* `PseudoLikelihoodLoss`: −(1/L) Σ_i log p(x^i | x^{≠i}) for models that output all single-site conditionals in
  one pass (Hollow transformer; MATH.md §8 item 20: consistent, not an MLE).

`LM_LOSSES[family]` names the default loss of each model family; `conditional_nll` scores any teacher's
single-site conditionals on held-out data (the quantity a parametric target actually uses). Every loss also has
`evaluate(model, data, ...)`, the validation metric the trainer and `tcsm eval` report for an LM
instead of a diffusion bound: the exact NLL for the AR model, the pseudo-NLL −(1/L) Σ_i log p(x^i | x^{≠i}) for
the others; and `sample(model, num, length, ...)`, which replaces the diffusion sampler: ancestral sampling for
the AR model, None (no sampler) for the MLM and Hollow models, whose conditionals define no direct sampler.
The registry entries at the bottom let `tcsm train` use them (`objective.name: lm | mlm | autoregressive |
pseudo_likelihood`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tcsm.core.batch import as_batch
from tcsm.core.parts import Parts
from tcsm.models.modes import eval_mode

__all__ = [
    "LM_LOSSES",
    "AutoregressiveLoss",
    "MaskedLMLoss",
    "PseudoLikelihoodLoss",
    "conditional_nll",
    "make_lm_loss",
]

_LN2 = math.log(2.0)

def _metrics(loss: Tensor, **extra: Tensor) -> dict[str, Tensor]:
    v = loss.detach()
    return {"loss": v, "bpc": v / _LN2, **extra}


class LMLoss:
    """Base: `__call__(model, batch, generator)` → (loss, metrics); `evaluate` → dataset metrics (no gradients);
    `sample` → sequences from the model, or None where the family has no direct sampler."""

    #: name of the reported validation quantity
    metric = "nll"

    def sequence_nll(self, model, x: Tensor) -> Tensor:
        """Per-sequence nats [B] of the validation metric."""
        raise NotImplementedError

    @torch.no_grad()
    def evaluate(self, model, data: Tensor, *, batch_size: int = 64, device=None, **_) -> dict:
        """Validation metric over `data` [N, L] in nats and bits per token, with standard errors (MATH.md §2.4)."""
        with eval_mode(model):
            device = next(model.parameters()).device if device is None else device
            per_seq = [
                self.sequence_nll(model, data[s : s + batch_size].to(device=device, dtype=torch.long))
                .float()
                .cpu()
                for s in range(0, data.shape[0], batch_size)
            ]
        from tcsm.core.results import summarise_nats

        length = data.shape[1]
        return summarise_nats(torch.cat(per_seq) / length, length, self.metric)

    def sample(self, model, num: int, length: int, generator=None, device=None, *, settings=None, fixed=None,
               values=None):
        """(None, None): single-site conditionals p(x^i | x^{≠i}) (MLM, Hollow) give no direct sampler of the joint
        (MATH.md §4); the `Samples` contract (tcsm.core.protocols)."""
        return None, None


class MaskedLMLoss(LMLoss):
    """E[Σ_{i∈M} −log p(x^i | x^{∖M}) / |M|], M ∋ i independently with probability r (BERT; MATH.md §4).

    `mask_rate` is r, or a pair (lo, hi) from which r is drawn uniformly per sequence (more varied contexts).
    With `random_rate` / `keep_rate` a chosen position gets a random token / keeps its own token instead of
    [MASK] (BERT's 80/10/10 corresponds to 0.1 / 0.1); the loss is on every chosen position either way.
    """

    def __init__(
        self, mask_rate: float | tuple[float, float] = 0.15, random_rate: float = 0.0, keep_rate: float = 0.0
    ):
        lo, hi = (mask_rate, mask_rate) if isinstance(mask_rate, (int, float)) else tuple(mask_rate)
        if not 0.0 < lo <= hi <= 1.0:
            raise ValueError(f"mask_rate must lie in (0, 1] (or be a range lo <= hi in it), got {mask_rate}")
        if random_rate < 0 or keep_rate < 0 or random_rate + keep_rate >= 1:
            raise ValueError("random_rate and keep_rate must be >= 0 with random_rate + keep_rate < 1")
        self.lo, self.hi = float(lo), float(hi)
        self.random_rate, self.keep_rate = float(random_rate), float(keep_rate)

    def corrupt(self, x1: Tensor, mask_id: int, vocab_size: int, generator=None) -> tuple[Tensor, Tensor]:
        """(input ids, chosen positions): chosen positions become [MASK] (or random / kept, see above)."""
        B, L = x1.shape
        u = torch.rand(B, 1, generator=generator, device=x1.device)
        rate = self.lo + (self.hi - self.lo) * u
        chosen = torch.rand(B, L, generator=generator, device=x1.device) < rate
        # Every sequence contributes at least one position, so short sequences never yield an empty loss.
        first = torch.randint(0, L, (B,), generator=generator, device=x1.device)
        chosen[torch.arange(B, device=x1.device), first] = True
        v = torch.rand(B, L, generator=generator, device=x1.device)
        rand_tok = torch.randint(0, vocab_size, (B, L), generator=generator, device=x1.device)
        inp = torch.where(v < self.random_rate, rand_tok, torch.full_like(x1, mask_id))
        inp = torch.where(v >= 1.0 - self.keep_rate, x1, inp)
        return torch.where(chosen, inp, x1), chosen

    def __call__(self, model, batch, generator: torch.Generator | None = None):
        x1 = as_batch(batch).x1
        inp, chosen = self.corrupt(x1, model.mask_id, model.vocab_size, generator)
        logp = torch.log_softmax(model(inp).float(), dim=-1)
        nll = -logp.gather(-1, x1.unsqueeze(-1)).squeeze(-1)
        loss = (nll * chosen).sum() / chosen.sum().clamp_min(1)
        return loss, _metrics(loss, mask_frac=chosen.float().mean())

    metric = "pseudo-nll"

    def sequence_nll(self, model, x):
        from tcsm.targets.parametric import mlm_conditionals

        return -mlm_conditionals(model, x).gather(-1, x.unsqueeze(-1)).squeeze(-1).sum(-1)


class _OnePassLoss(LMLoss):
    """−(1/(B·L)) Σ_{b,i} log p(x_b^i | ·) for a model whose `forward(x)[:, i]` already excludes x^i from the
    context (next-token or hollow logits), so one pass on the clean x scores every position (MATH.md §4)."""

    @staticmethod
    def token_nll(model, x: Tensor) -> Tensor:
        """−log p(x^i | ·) per position [B, L]."""
        logp = torch.log_softmax(model(x).float(), dim=-1)
        return -logp.gather(-1, x.unsqueeze(-1)).squeeze(-1)

    def sequence_nll(self, model, x):
        return self.token_nll(model, x).sum(-1)

    def __call__(self, model, batch, generator: torch.Generator | None = None):
        loss = self.token_nll(model, as_batch(batch).x1).mean()
        return loss, _metrics(loss)


class AutoregressiveLoss(_OnePassLoss):
    """−(1/(B·L)) Σ_b log p^AR(x_b) = mean next-token NLL (nats per token; MATH.md §4)."""

    metric = "ar-nll"
    #: the registered sampler `sample` implements (`tcsm.sampling.own`)
    sampler = "left_to_right"

    @torch.no_grad()
    def sample(self, model, num: int, length: int, generator=None, device=None, *, settings=None, fixed=None,
               values=None):
        """Ancestral sampling x^j ~ p^AR(· | x^{<j}), j = 0..L−1 (MATH.md §4; `tcsm.targets.ar.sample_ar`), with the
        settings' temperature / top-p; pinned positions must be a prefix (a prompt), which is kept and continued.
        Returns (tokens, CallCount)."""
        from tcsm.sampling.common import CallCount
        from tcsm.targets.ar import sample_ar

        prefix = None
        if fixed is not None:
            P = int(fixed[0].sum())
            if not bool(fixed[:, :P].all()) or bool(fixed[:, P:].any()):
                raise ValueError("an autoregressive model continues a prompt left to right; it cannot fill a template")
            prefix = values[:, :P] if P else None
        temperature = 1.0 if settings is None else settings.temperature
        top_p = 1.0 if settings is None else settings.top_p
        engine = getattr(settings, "engine", "auto")
        with eval_mode(model):
            x = sample_ar(model, num, length, generator, device, prefix=prefix, temperature=temperature, top_p=top_p,
                          engine=engine)  # fmt: skip
        return x, CallCount("autoregressive", length - (0 if prefix is None else prefix.shape[1]))


class PseudoLikelihoodLoss(_OnePassLoss):
    """−(1/(B·L)) Σ_{b,i} log p(x_b^i | x_b^{≠i}) from one pass of a model that never reads x^i (MATH.md §4, §8 item 20)."""

    metric = "pseudo-nll"


LM_LOSSES = Parts("LM loss family", {"mlm": MaskedLMLoss, "causal": AutoregressiveLoss, "hollow": PseudoLikelihoodLoss})


def make_lm_loss(family: str, **kwargs):
    """The default training loss of an LM family ("mlm" | "causal" | "hollow")."""
    if family not in LM_LOSSES:
        raise ValueError(f"no LM loss for family {family!r}; choose one of {sorted(LM_LOSSES)}")
    return LM_LOSSES[family](**kwargs)


@torch.no_grad()
def conditional_nll(teacher, x: Tensor) -> float:
    """−(1/(B·L)) Σ log p_1(x^i | x^{≠i}) under a teacher's conditionals (nats per token; MATH.md §4)."""
    logq = teacher(x)
    return float(-logq.gather(-1, x.unsqueeze(-1)).squeeze(-1).mean())
