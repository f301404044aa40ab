"""Sampling-importance-resampling (SIR) sampler for the strategy-(ii) energy model (MATH.md §6.3, EDLM).

Model: p^θ_{1|t}(x_1 | x_t) ∝ p^ref_{1|t}(x_1 | x_t) e^{f(x_1, x_t, t)}. With candidates drawn from p^ref, the
importance weight p^θ / p^ref is ∝ e^f, so SIR picks candidate j with probability softmax_j(f_j / T): the
weight *increases* with f (MATH.md §6.3 warns that EDLM's code has the opposite sign for its energy E = −f).
As k → ∞ the pick is a draw from p^θ_{1|t}; the exact bridge of MATH.md §6.2 applied to that joint draw is
then an exact step for any step size (oracle e.a).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from tcsm.paths import ProbabilityPath
from tcsm.posttrain.dre.losses import EnergyFn, draw_reference_samples, energy_log_ratio
from tcsm.sampling.common import as_grid, categorical, prefix_condition
from tcsm.sampling.samplers import SamplingStats

__all__ = ["sample_sir", "sir_select"]

Denoiser = Callable[[Tensor, Tensor], Tensor]


def sir_select(f: Tensor, temperature: float = 1.0, generator: torch.Generator | None = None) -> Tensor:
    """Index j ~ softmax_j(f_j / T) over the last axis of candidate log-ratios f [..., k] (MATH.md §6.3):
    candidates ~ p^ref and p^θ ∝ p^ref e^f, so the importance weight of a candidate is ∝ e^f."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return categorical(torch.log_softmax(f.double() / temperature, dim=-1), generator)


def sample_sir(
    reference: Denoiser,
    energy: EnergyFn,
    path: ProbabilityPath,
    *,
    batch_size: int,
    length: int,
    num_steps: int,
    num_candidates: int = 2,
    window: tuple[float, float] = (0.4, 0.6),
    temperature: float = 1.0,
    grid: str | Sequence[float] | Tensor = "uniform",
    fixed: Tensor | None = None,
    values: Tensor | None = None,
    prompt: Tensor | None = None,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    device=None,
    return_stats: bool = False,
):
    """Draw sequences from p^θ ∝ p^ref e^f by K = `num_steps` steps t_k → t_{k+1} (MATH.md §6.3).

    At a step with α_{t_k} in `window` (inclusive; (0, 1) for every step): one reference call gives
    m^ref(· | x_t); k = `num_candidates` factorized candidates x̂^(j) (carry-over of unmasked tokens) are scored
    by `energy` and one is picked by `sir_select`; the exact bridge `path.bridge` with the one-hot x̂ as the
    clean-token distribution draws x_{t'}. The pick is cached while x_t is unchanged (it stays a posterior
    draw of the unchanged state). Outside the window: the plain §6.2 bridge with the reference's marginals.

    Args:
        reference: (x_t [b, L], t [b]) -> logits [b, L, V] of the frozen factorized reference.
        energy: (x_1 [b, L], x_t [b, L], t [b]) -> f [b], the log-ratio of p^θ to p^ref (e.g. a `RatioHead`).
        grid, fixed, values, prompt, generator, seed, device: as in `tcsm.sampling.sample`.

    Returns:
        LongTensor[B, L] of clean tokens, or (tokens, SamplingStats) if `return_stats`: reference calls and rows,
        and `counts` of SIR and plain steps and of energy rows scored.
    """
    B, L, V = int(batch_size), int(length), path.vocab_size
    k = int(num_candidates)
    if k < 1:
        raise ValueError(f"num_candidates must be >= 1, got {num_candidates}")
    lo, hi = float(window[0]), float(window[1])
    if prompt is not None:
        if fixed is not None or values is not None:
            raise ValueError("pass either a prompt or fixed/values, not both")
        fixed, values = prefix_condition(prompt, B, L)
    if device is None:
        device = values.device if values is not None else torch.device("cpu")
    if fixed is None:
        fixed = torch.zeros(B, L, dtype=torch.bool, device=device)
        values = torch.zeros(B, L, dtype=torch.long, device=device)
    fixed = torch.as_tensor(fixed, dtype=torch.bool, device=device).expand(B, L)
    values = torch.as_tensor(values, dtype=torch.long, device=device).expand(B, L)
    if generator is None and seed is not None:
        generator = torch.Generator(device=device).manual_seed(int(seed))
    times = as_grid(grid, int(num_steps), device)
    K = times.numel() - 1
    alphas = path.alpha(times)
    time_dtype = torch.get_default_dtype()
    stats = SamplingStats(method="sir", num_steps=K, cached=False, times=times,
                          row_calls=torch.zeros(B, dtype=torch.long, device=device),
                          counts={"sir_steps": 0, "plain_steps": 0, "energy_rows": 0})  # fmt: skip

    x = path.prior_sample(B, L, device=device, generator=generator)
    x = torch.where(fixed, values, x)
    chosen = torch.zeros(B, L, dtype=torch.long, device=device)
    valid = torch.zeros(B, dtype=torch.bool, device=device)  # `chosen` belongs to the row's current x

    with torch.no_grad():
        for step in range(K):
            t, s = times[step], times[step + 1]
            free = path.loss_mask(x) & ~fixed
            active = free.any(-1)
            use_sir = lo <= float(alphas[step]) <= hi
            if use_sir:
                stats.counts["sir_steps"] += 1
                need = active & ~valid
            else:
                stats.counts["plain_steps"] += 1
                valid.zero_()
                need = active
            rows = need.nonzero().squeeze(1)
            if rows.numel():
                t_rows = torch.full((rows.numel(),), float(t), dtype=time_dtype, device=device)
                lp = torch.log_softmax(reference(x[rows], t_rows), dim=-1)
                stats.num_calls += 1
                stats.num_rows += rows.numel()
                stats.row_calls[rows] += 1
                if use_sir:
                    cands = draw_reference_samples(
                        lp, x[rows], path, k, generator, fixed=fixed[rows], values=values[rows]
                    )
                    f = energy_log_ratio(energy, cands, x[rows], t_rows)
                    stats.counts["energy_rows"] += cands.shape[0] * k
                    j = sir_select(f, temperature, generator)
                    chosen[rows] = cands[torch.arange(rows.numel(), device=device), j]
                    valid[rows] = True
                else:
                    probs_plain = lp.double().exp()
            act = active.nonzero().squeeze(1)
            if act.numel():
                if use_sir:
                    probs = torch.nn.functional.one_hot(chosen[act], V).double()
                else:
                    probs = probs_plain  # `need` = `active` outside the window: same rows, same order
                b = act.numel()
                bridge = path.bridge(x[act], t.expand(b), s.expand(b), probs)
                new = categorical(torch.log(bridge), generator)
                x_prev = x
                x = x.clone()
                x[act] = torch.where(free[act], new, x[act])
                valid &= (x == x_prev).all(-1)

    if (x >= V).any():
        raise RuntimeError(
            "sampler left noise-only ids (masks) in the output; the time grid must end at t = 1"
        )
    return (x, stats) if return_stats else x
