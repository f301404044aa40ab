"""The validation metric of a model, as training logs it and `tcsm eval` reports it: the objective's own
evaluator when it has one (e.g. an LM), the diffusion likelihood bound otherwise (MATH.md §2.4)."""

from __future__ import annotations

import inspect

from tcsm.core.protocols import Evaluates
from tcsm.core.results import EvalResult

__all__ = ["evaluate_model"]


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
    from tcsm.evaluation.likelihood import evaluate_bound

    return evaluate_bound(
        model,
        data,
        path,
        batch_size=e.batch_size,
        num_t=e.num_t,
        generator=generator,
        bound=e.bound,
        device=device,
        progress=progress,
        t_max=getattr(e, "t_max", None),
    )
