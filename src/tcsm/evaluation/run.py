"""The validation metric of a model, as training logs it and `tcsm eval` reports it: the objective's own
evaluator when it has one (e.g. an LM), the diffusion likelihood bound otherwise (MATH.md §2.4) — of the
completions given their prompts when the data's rows pin a prompt (the `task` and `sft` kinds)."""

from __future__ import annotations

import inspect

import torch

from tcsm.core.protocols import Evaluates
from tcsm.core.results import EvalResult, summarise_nats

__all__ = ["evaluate_model", "prompted_bound"]


@torch.no_grad()
def prompted_bound(model, rows, path, *, batch_size, num_t, generator=None, bound=None, device=None,
                   t_max=None) -> EvalResult:  # fmt: skip
    """The bound on −log p^θ(completion | prompt) of each record, in nats per completion token (padding included),
    from `nelbo_terms` with the prompt clean at every t (MATH.md §2.4); `rows.to_batch()` holds the prompt as
    `cond_mask`. `t_max` < 1: the bound of the reversal stopped at t_max (MATH.md §9, "A time-blind denoiser")."""
    from tcsm.evaluation.likelihood import nelbo_terms
    from tcsm.models.modes import eval_mode
    from tcsm.paths.bounds import resolve_bound

    bound = resolve_bound(path, bound)
    batch = rows.to_batch()
    device = batch.x1.device if device is None else torch.device(device)
    N, L = batch.x1.shape
    nats = []
    with eval_mode(model):
        for s in range(0, N, int(batch_size)):
            x1 = batch.x1[s : s + int(batch_size)].to(device)
            cond = batch.cond_mask[s : s + int(batch_size)].to(device)
            terms = nelbo_terms(model, x1, path, num_t=num_t, generator=generator, bound=bound, cond_mask=cond,
                                t_max=t_max)  # fmt: skip
            nats.append((terms.double().mean(0) / (L - cond.sum(-1)).clamp_min(1)).cpu())
    label = bound if t_max is None else f"{bound}@t_max={float(t_max):g}"
    out = EvalResult(summarise_nats(torch.cat(nats), L, f"{label}, completion | prompt"), num_t=int(num_t))
    if t_max is not None:
        out["t_max"] = float(t_max)
    return out


def evaluate_model(objective, model, data, path, e, *, generator=None, device=None, progress=False) -> EvalResult:
    """The validation metric of `model` on `data` [N, L] under eval settings `e` (the `eval` config section).

    An objective that trains something other than a denoiser (e.g. an LM, tcsm.objectives.lm) brings its
    own `evaluate`; every other model gets the diffusion likelihood bound (MATH.md §2.4). Both are `EvalResult`s.
    """
    if isinstance(objective, Evaluates):
        # `progress` is optional in the contract: evaluators written without it keep working
        params = inspect.signature(objective.evaluate).parameters
        wants = "progress" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
        extra = {"progress": progress} if wants else {}
        result = objective.evaluate(model, data, batch_size=e.batch_size, generator=generator, device=device, **extra)
        return EvalResult.of(result, f"{type(objective).__name__}.evaluate")
    # The eval section's settings reach either bound alike; a prompted set bounds the completions only.
    settings = {"batch_size": e.batch_size, "num_t": e.num_t, "generator": generator, "bound": e.bound,
                "device": device, "t_max": getattr(e, "t_max", None)}  # fmt: skip
    if getattr(data, "to_batch", None) is not None and getattr(data.to_batch(), "cond_mask", None) is not None:
        return prompted_bound(model, data, path, **settings)
    from tcsm.evaluation.likelihood import evaluate_bound

    return evaluate_bound(model, data, path, progress=progress, **settings)
