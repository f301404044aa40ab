"""Likelihood of the strategy-(ii) energy model p^θ_{1|t} ∝ p^ref_{1|t} e^f: an importance-sampling *estimate*,
reported beside the reference's valid bound (MATH.md §2.2, §5.1, §8 item 14).

The masked bound (§2.2) needs the per-token marginals of p^θ_{1|t}; with a factorized reference they are

    m^θ_i(y | x_t) = m^ref_i(y | x_t) · Z_i(y) / Z,   Z = E_ref[e^{f(x̂)}],   Z_i(y) = E_ref[e^{f([y, x̂^{≠i}])}],

so the integrand is the reference's, −Σ_{i: x_t^i = M} log m^ref_i(x_1^i), plus Σ_i [log Z − log Z_i(x_1^i)].
Both normalisers are replaced by means over n reference draws x̂_j (shared by Z and every Z_i: common random
numbers). log Ẑ is biased low and enters with a plus sign, so the result is an optimistic, consistent *estimate*
— never a bound; its bias shrinks as n grows, which the report shows by giving it for several n (nested subsets
of one set of draws). The reference's integrand at the same (t, x_t) draws is an unbiased estimate of its valid
bound, so the two numbers and their difference are compared with common random numbers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from tcsm.core.progress import WorkProgress
from tcsm.core.results import summarise_nats
from tcsm.evaluation.likelihood import evaluate_bound
from tcsm.paths import ProbabilityPath
from tcsm.paths.timesteps import stratified_times
from tcsm.posttrain.dre.losses import EnergyFn, draw_reference_samples, log_mean_exp, reference_log_probs

__all__ = ["energy_estimate_cost", "energy_integrand", "energy_nelbo_terms", "evaluate_energy_estimate"]

Denoiser = Callable[[Tensor, Tensor], Tensor]
Tick = Callable[[int], None]


def energy_estimate_cost(
    path: ProbabilityPath, num_sequences: int, length: int, num_t: int, num_samples: int
) -> float:
    """Expected energy-model rows (calls of f on one sequence) of `evaluate_energy_estimate`: per sequence and
    time, n = max(num_samples) draws for Ẑ plus n for each masked position's Ẑ_i, i.e. n · (1 + L · E[1 − α_t])
    with t ~ U(0, 1). A pre-trained model's bound costs one denoiser row per sequence and time instead."""
    schedule = getattr(path, "schedule", None)
    if schedule is None:
        masked = 0.5
    else:  # E_t[1 − α_t] by the midpoint rule
        masked = float(
            schedule.one_minus_alpha((torch.arange(1000, dtype=torch.float64) + 0.5) / 1000).mean()
        )
    return float(num_sequences) * num_t * num_samples * (1.0 + length * masked)


def _chunked(
    energy: EnergyFn, x1: Tensor, xt: Tensor, t: Tensor, max_rows: int, tick: Tick | None = None
) -> Tensor:
    """f for rows [N, L] in calls of at most `max_rows` rows (the evaluation's memory bound); `tick(rows)` after
    each call."""
    parts = []
    for s in range(0, x1.shape[0], max_rows):
        parts.append(energy(x1[s : s + max_rows], xt[s : s + max_rows], t[s : s + max_rows]))
        if tick is not None:
            tick(parts[-1].shape[0])
    return torch.cat(parts) if parts else x1.new_zeros(0, dtype=torch.float32)


def energy_integrand(
    reference: Denoiser,
    energy: EnergyFn,
    x1: Tensor,
    xt: Tensor,
    t: Tensor,
    path: ProbabilityPath,
    *,
    num_samples: Sequence[int] = (16,),
    generator: torch.Generator | None = None,
    max_rows: int = 8192,
    tick: Tick | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The masked-bound integrand at given (t, x_t) draws of x1 [R, L] (MATH.md §2.2, §5.1): (w = κ_t [R],
    G_ref [R] = Σ_{i: x_t^i = M} −log m^ref_i(x_1^i), G_est [len(ns), R] = G_ref + Σ_i [log Ẑ − log Ẑ_i(x_1^i)],
    log Ẑ [len(ns), R]), the normalisers from the first n of one set of reference draws for each n in
    `num_samples` (sorted). As n → ∞, −log m̂ → −log m^θ_i, the marginals of p^ref e^f / Z.
    Cost: max(n) · (1 + #masked) energy rows per row of x_t; `tick(rows)` is called as they are done."""
    if path.mask_id is None or "masked" not in path.bounds:
        raise ValueError(f"the energy-model estimate uses the masked bound; this is a {path.kind} path")
    ns = sorted({int(n) for n in num_samples})
    if not ns or ns[0] < 1:
        raise ValueError(f"num_samples must be positive integers, got {list(num_samples)}")
    R, L = x1.shape
    device = x1.device
    ref_lp = reference_log_probs(reference, xt, t.float())
    w, g_ref = path.bound_integrand("masked", ref_lp, x1, xt, t.double())
    # Draws for Z and, with x_1^i substituted at each masked i, for every Z_i(x_1^i).
    x_hat = draw_reference_samples(ref_lp, xt, path, ns[-1], generator)  # [R, n, L]
    n = x_hat.shape[1]
    tf = t.float()
    f_base = _chunked(
        energy, x_hat.reshape(R * n, L), xt.repeat_interleave(n, 0), tf.repeat_interleave(n), max_rows, tick
    ).reshape(R, n)
    rows, pos = (xt == path.mask_id).nonzero(as_tuple=True)  # one pair per masked position
    subst = x_hat[rows].clone()  # [P, n, L]
    subst[torch.arange(rows.numel(), device=device), :, pos] = x1[rows, pos].unsqueeze(-1)
    f_sub = _chunked(
        energy,
        subst.reshape(-1, L),
        xt[rows].repeat_interleave(n, 0),
        tf[rows].repeat_interleave(n),
        max_rows,
        tick,
    ).reshape(-1, n)
    wd = g_ref.dtype
    g_est, log_zs = [], []
    for k in ns:
        log_z = log_mean_exp(f_base[:, :k].to(wd), dim=-1)  # [R]
        corr = torch.zeros(R, dtype=wd, device=device).index_add_(
            0, rows, log_z[rows] - log_mean_exp(f_sub[:, :k].to(wd), dim=-1)
        )
        g_est.append(g_ref + corr)
        log_zs.append(log_z)
    return w, g_ref, torch.stack(g_est), torch.stack(log_zs)


def energy_nelbo_terms(
    reference: Denoiser,
    energy: EnergyFn,
    x1: Tensor,
    path: ProbabilityPath,
    *,
    num_t: int = 8,
    num_samples: Sequence[int] = (16,),
    generator: torch.Generator | None = None,
    max_rows: int = 8192,
    tick: Tick | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sequence masked-bound integrals in nats for x1 [B, L] (MATH.md §2.2, §2.4, §5.1), from `num_t`
    stratified times and one x_t ~ p_{t|1} per time:

    (reference [B]: unbiased for p^ref's valid bound; estimate [len(num_samples), B]: the energy model's IS
    estimate for each n in sorted `num_samples`; log_z [len(num_samples), B]: mean log Ẑ(x_t) per sequence,
    → 0 at the self-normalised DRE optimum)."""
    B = x1.shape[0]
    t = stratified_times(num_t, B, generator=generator, device=x1.device).reshape(-1)  # row r = k·B + b
    z1 = x1.repeat(num_t, 1)
    xt = path.draw_xt(z1, t, generator)
    w, g_ref, g_est, log_z = energy_integrand(
        reference,
        energy,
        z1,
        xt,
        t,
        path,
        num_samples=num_samples,
        generator=generator,
        max_rows=max_rows,
        tick=tick,
    )

    def integral(g: Tensor) -> Tensor:  # w may be huge where nothing is masked (g = 0): never form 0 · inf
        return torch.where(g != 0, w * g, torch.zeros_like(g)).reshape(num_t, B).mean(0)

    estimate = torch.stack([integral(g) for g in g_est])
    return integral(g_ref), estimate, log_z.reshape(-1, num_t, B).mean(1)


def evaluate_energy_estimate(
    reference: Denoiser,
    energy: EnergyFn,
    data: Tensor,
    path: ProbabilityPath,
    *,
    batch_size: int = 32,
    num_t: int = 8,
    num_samples: Sequence[int] = (1, 4, 16),
    generator: torch.Generator | None = None,
    max_rows: int = 8192,
    device=None,
    progress: bool = False,
) -> dict:
    """Dataset report of the energy model (MATH.md §2.4, §5.1, §8 item 14): the reference's valid bound as
    `bpc` / `nats_per_token` / ... (the keys every bound report has, `bound` naming what they are) and the
    energy model's IS estimate as `bpc_estimate` (largest n) and `bpc_estimate_n{n}` for every n, each with a
    stderr, the paired difference `bpc_estimate_minus_reference`, and mean log Ẑ per n (`log_z_mean_n{n}`).

    On a path without a masked bound there is no estimate: the reference's bound alone, so labelled.
    `progress`: report energy rows done, with rate and ETA, on stderr (`tcsm.core.progress`); the cost is
    `energy_estimate_cost`, hundreds of times a pre-trained model's bound at the same settings."""
    data = torch.as_tensor(data)
    if data.dim() != 2 or data.shape[0] == 0:
        raise ValueError(f"data must be a non-empty LongTensor [N, L], got shape {tuple(data.shape)}")
    device = data.device if device is None else torch.device(device)
    if path.mask_id is None or "masked" not in path.bounds:
        out = evaluate_bound(
            reference,
            data,
            path,
            batch_size=batch_size,
            num_t=num_t,
            generator=generator,
            device=device,
            progress=progress,
        )
        out["bound"] = f"reference p^ref {out['bound']}; no energy-model estimate for the {path.kind} source"
        out["reference_bpc"], out["reference_bpc_stderr"] = out["bpc"], out["bpc_stderr"]
        return out
    ns = sorted({int(n) for n in num_samples})
    N, L = data.shape
    refs, ests, zs = [], [], []
    bar = WorkProgress(
        energy_estimate_cost(path, N, L, num_t, ns[-1]),
        "energy-model estimate",
        "energy rows",
        enabled=progress,
    )
    with torch.no_grad():
        for s in range(0, N, int(batch_size)):
            x1 = data[s : s + int(batch_size)].to(device=device, dtype=torch.long)
            r, e, z = energy_nelbo_terms(
                reference,
                energy,
                x1,
                path,
                num_t=num_t,
                num_samples=ns,
                generator=generator,
                max_rows=max_rows,
                tick=bar.update,
            )
            refs.append(r.double().cpu())
            ests.append(e.double().cpu())
            zs.append(z.double().cpu())
    bar.close()
    ref, est, log_z = torch.cat(refs) / L, torch.cat(ests, dim=1) / L, torch.cat(zs, dim=1)
    top = summarise_nats(est[-1], L, "estimate")
    label = (
        f"energy-model IS estimate {top['bpc']:.4f} bits/token (log Ẑ from n={ns[-1]} draws; not a bound) "
        "| reference p^ref masked"
    )
    out = {**summarise_nats(ref, L, label), "num_t": int(num_t)}
    out["reference_bpc"], out["reference_bpc_stderr"] = out["bpc"], out["bpc_stderr"]
    out["bpc_estimate"], out["bpc_estimate_stderr"] = top["bpc"], top["bpc_stderr"]
    out["nats_per_token_estimate"] = top["nats_per_token"]
    diff = (est[-1] - ref) / math.log(2)
    out["bpc_estimate_minus_reference"] = float(diff.mean())
    out["bpc_estimate_minus_reference_stderr"] = float(diff.std() / math.sqrt(N)) if N > 1 else float("nan")
    for i, n in enumerate(ns):
        s_n = summarise_nats(est[i], L, "estimate")
        out[f"bpc_estimate_n{n}"], out[f"bpc_estimate_n{n}_stderr"] = s_n["bpc"], s_n["bpc_stderr"]
        out[f"log_z_mean_n{n}"] = float(log_z[i].mean())
    out["log_z_samples"] = ns[-1]
    return out
