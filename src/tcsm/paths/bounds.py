"""Which likelihood bounds a path admits and their integrands w(t)·G(t, x_t) per sequence (MATH.md §2.1–2.3); the
paths supply w and G (`path.bound_integrand`), this module validates the bound's name and keeps the arithmetic
out of autocast.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from tcsm.paths import PATHS
from tcsm.paths.base import ProbabilityPath

#: The bounds each built-in source admits, by `kind`; the first is the default (MATH.md §2.2, §2.3, §7).
#: A lookup table for configs and reports; code asks the path (`path.bounds`).
BOUNDS: dict[str, tuple[str, ...]] = {kind: cls.bounds for kind, cls in PATHS.items()}


def default_bound(path: ProbabilityPath) -> str:
    """The recommended bound for `path`, `path.bounds[0]`: "masked" (§2.2) or "reversal" (§2.3 B)."""
    return resolve_bound(path, None)


def resolve_bound(path: ProbabilityPath, bound: str | None) -> str:
    """Validate `bound` against `path.bounds` (None → the default, its first) and return its name; ValueError
    otherwise (MATH.md §2, §7)."""
    kind = getattr(path, "kind", type(path).__name__)
    allowed = tuple(getattr(path, "bounds", ()))
    if not allowed:
        raise ValueError(f"no likelihood bound for a path of kind {kind!r}: it declares no `bounds`")
    if bound is None:
        return allowed[0]
    if isinstance(bound, str) and bound in allowed:
        return bound
    owners = [k for k, bs in BOUNDS.items() if bound in bs]
    if owners:
        raise ValueError(
            f"bound {bound!r} is for the {' or '.join(owners)} source; the {kind} source admits {list(allowed)}"
        )
    raise ValueError(f"unknown likelihood bound {bound!r}; the {kind} source admits {list(allowed)}")


def _work_dtype(device: torch.device) -> torch.dtype:
    # MPS has no float64; everywhere else the per-sequence scalars and V-dim terms use it.
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def nelbo_integrand(
    logits: Tensor, x1: Tensor, xt: Tensor, t: Tensor, path: ProbabilityPath, bound: str | None = None
) -> Tensor:
    """w(t) · G(t, x_t) per sequence [B] for one (t, x_t) draw (MATH.md §2.1–2.3), from `path.bound_integrand`;
    E_t E_{x_t} of it is the bound.

    `logits` [B, L, V] are the denoiser's output at (x_t, t); `t` [B] must lie in (0, 1) (see `nelbo`).
    """
    bound = resolve_bound(path, bound)
    # The denoiser may run under autocast; this arithmetic must keep its float64 / float32.
    with _no_autocast(x1.device):
        w, G = path.bound_integrand(bound, logits, x1.long(), xt.long(), t.to(_work_dtype(x1.device)))
        # The weight may be huge where G = 0 (t → 1 and nothing corrupted); never form 0 · inf.
        return torch.where(G > 0, w * G, torch.zeros_like(G))


def _no_autocast(device: torch.device):
    try:
        return torch.autocast(device_type=torch.device(device).type, enabled=False)
    except (RuntimeError, ValueError):  # a device type without autocast support
        return contextlib.nullcontext()


def prior_term(x1: Tensor, path: ProbabilityPath) -> Tensor:
    """KL(p_{0|1}(·|x_1) ‖ p_0) per sequence [B], non-zero only for a clipped start α_0 > 0 (MATH.md §2.1).

    The path computes it (`path.prior_kl`; uniform: closed form; masked: infinite, so a ValueError).
    α_1 < 1 is rejected for every path: its reconstruction term is not implemented.
    """
    wd = _work_dtype(x1.device)
    sched = path.schedule
    oma1 = float(sched.one_minus_alpha(torch.ones(1, dtype=wd, device=x1.device))[0])
    if oma1 > 1e-9:
        raise ValueError(
            f"schedule {sched!r} has α_1 = {1 - oma1:.6g} < 1: its reconstruction term is not implemented "
            "(MATH.md §2.1); use a schedule with α_1 = 1"
        )
    return path.prior_kl(x1, wd)

