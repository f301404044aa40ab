"""Valid upper bounds on −log p^θ_1(x_1) (negative ELBOs), and BPC / perplexity (MATH.md §2).

Every bound is KL(P^{x_1} ‖ P^θ) for one specific model CTMC (MATH.md §2.1), written as
∫_0^1 w(t) E_{x_t ~ p_{t|1}(·|x_1)}[G(t, x_t)] dt and estimated by Monte Carlo over stratified t (§2.4):

* masked source, bound "masked" (§2.2): w = κ_t, G = Σ_{i: x_t^i = M} −log m^i_θ(x_1^i | x_t) (carry-over);
* uniform source, bound "reversal" (§2.3 B, default; the bound of the analytic sampler §6.2): w = c_t =
  α̇_t/(Vα_t), G = Σ_i Σ_{y≠x_t^i} D_GKL(r^i_y ‖ ŝ^i_y);
* uniform source, bound "dfm" (§2.3 A; the bound of the Euler sampler §6.1, looser at the optimum):
  w = κ_t, G = Σ_i g^i_t.

A denoiser is any callable (x_t LongTensor[B, L], t FloatTensor[B]) → logits FloatTensor[B, L, V] over
the V clean tokens. Everything here is model-agnostic and free of module state.

Numerics. The weights κ_t (at t = 1) and c_t (at t = 0) diverge while the expected integrands stay finite,
so the per-sequence scalars and the uniform-source terms are computed in float64 (float32 on devices without
float64), and sampled times are mapped into [tiny, 1 − 2^-24] (float32-representable, so the denoiser sees
exactly the t used for the weights). That moves, never drops, the samples of a set of measure ≲ 6e-8; the
integrands are bounded there, so the change is O(1e-7) nats, far below the Monte Carlo error.

Variance. Near t = 1 a corrupted token is rare (probability ~ 1 − α_t) but weighted by κ_t ~ 1/(1 − α_t),
which gives plain sampling a heavy tail. x_t is therefore drawn split on the event "some token corrupted",
with importance weights that keep every estimate unbiased (`_sample_xt`); stratified t does the rest.

For the uniform source both bounds are finite only if the denoiser's mass on tokens other than x_t^i
vanishes like 1 − α_t as t → 1 (as the exact posterior's does, MATH.md §1.3); a denoiser that stays
diffuse at t → 1 has an infinite bound, and its Monte Carlo estimate then has a heavy tail.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import torch
from torch import Tensor

from tcsm.paths import ProbabilityPath
from tcsm.timesteps import stratified_times

__all__ = [
    "BOUNDS",
    "Denoiser",
    "bits_per_token",
    "bpc",
    "default_bound",
    "evaluate_bound",
    "nelbo",
    "nelbo_integrand",
    "nelbo_terms",
    "perplexity",
    "prior_term",
    "resolve_bound",
    "summarise_nats",
]

Denoiser = Callable[[Tensor, Tensor], Tensor]

#: The bounds each source admits; the first is the default (MATH.md §2.2, §2.3, §7).
BOUNDS: dict[str, tuple[str, ...]] = {"masked": ("masked",), "uniform": ("reversal", "dfm")}

# Largest float32 below 1: sampled times are kept in [T_LO, T_HI] so that neither end is hit exactly.
_T_HI = 1.0 - 2.0**-24
_T_LO = torch.finfo(torch.float32).tiny
_LN2 = math.log(2.0)
# Tokens of x_t sampled per vectorised draw in `nelbo_terms` (bounds its memory, fixes its random stream).
_SAMPLE_BLOCK = 1 << 20
# Elements per [rows, L, V] float64 temporary of the time-reversal bound (bounds its memory to ~128 MiB each).
_VDIM_BLOCK = 1 << 24


def default_bound(path: ProbabilityPath) -> str:
    """The recommended bound for `path`: "masked" (§2.2) or "reversal" (§2.3 B, tight at the optimum)."""
    return resolve_bound(path, None)


def resolve_bound(path: ProbabilityPath, bound: str | None) -> str:
    """Validate `bound` for `path` (None → the default) and return its name; ValueError otherwise."""
    kind = getattr(path, "kind", None)
    if kind not in BOUNDS:
        raise ValueError(f"no likelihood bound for a path of kind {kind!r}; expected one of {sorted(BOUNDS)}")
    allowed = BOUNDS[kind]
    if bound is None:
        return allowed[0]
    if not isinstance(bound, str) or bound not in {b for bs in BOUNDS.values() for b in bs}:
        raise ValueError(f"unknown likelihood bound {bound!r}; the {kind} source admits {list(allowed)}")
    if bound not in allowed:
        if kind == "masked":
            raise ValueError(
                f"bound {bound!r} is for the uniform source; the masked source has the single bound "
                "'masked' (MATH.md §2.2: its DFM and time-reversal bounds coincide with it)"
            )
        raise ValueError(
            f"bound {bound!r} is for the masked source; the uniform source admits {list(allowed)}"
        )
    return bound


def _work_dtype(device: torch.device) -> torch.dtype:
    # MPS has no float64; everywhere else the per-sequence scalars and V-dim terms use it.
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def _col(v: Tensor, dims: int) -> Tensor:
    return v.reshape(v.shape + (1,) * dims)


def _log_m(logits: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(logits, logsumexp) in at least float32 (bf16/fp16 model outputs are upcast first)."""
    logits = logits.to(torch.promote_types(logits.dtype, dtype))
    return logits, torch.logsumexp(logits, dim=-1)


def _log_mass_except(logits: Tensor, lse: Tensor, idx: Tensor) -> Tensor:
    """log Σ_{y≠idx} m(y), computed without the cancellation of log(1 − m(idx))."""
    excl = logits.scatter(-1, idx.unsqueeze(-1), -torch.inf)
    return torch.logsumexp(excl, dim=-1) - lse


def nelbo_integrand(
    logits: Tensor, x1: Tensor, xt: Tensor, t: Tensor, path: ProbabilityPath, bound: str | None = None
) -> Tensor:
    """w(t) · G(t, x_t) per sequence [B] for one (t, x_t) draw (MATH.md §2.2, §2.3); E_t E_{x_t} of it is the bound.

    `logits` [B, L, V] are the denoiser's output at (x_t, t); `t` [B] must lie in (0, 1) (see `nelbo`).
    """
    bound = resolve_bound(path, bound)
    # The denoiser may run under autocast; this arithmetic must keep its float64 / float32.
    with _no_autocast(x1.device):
        return _integrand(logits, x1, xt, t, path, bound)


def _no_autocast(device: torch.device):
    try:
        return torch.autocast(device_type=torch.device(device).type, enabled=False)
    except (RuntimeError, ValueError):  # a device type without autocast support
        return contextlib.nullcontext()


def _integrand(logits: Tensor, x1: Tensor, xt: Tensor, t: Tensor, path: ProbabilityPath, bound: str) -> Tensor:
    wd = _work_dtype(x1.device)
    t = t.to(wd)
    sched = path.schedule
    V = path.vocab_size
    alpha, oma, adot = sched.alpha(t), sched.one_minus_alpha(t), sched.alpha_dot(t)
    tiny = torch.finfo(wd).tiny
    z = x1.long()
    x = xt.long()

    if bound in ("masked", "dfm"):
        kappa = adot / oma.clamp_min(tiny)
        lg, lse = _log_m(logits, torch.float32)
        if bound == "masked":
            # Carry-over: unmasked positions are copied by the model CTMC and contribute nothing (§2.2).
            masked = x == path.mask_id
            nll = lse - lg.gather(-1, z.unsqueeze(-1)).squeeze(-1)
            g = torch.where(masked, nll.to(wd), torch.zeros((), dtype=wd, device=x.device))
        else:
            # g = 1 − m(x_t) if x_t = x_1, else −log m(x_1) − m(x_t)  (§2.3 A).
            x_safe = x.clamp_max(V - 1)
            log_mx = (lg.gather(-1, x_safe.unsqueeze(-1)).squeeze(-1) - lse).to(wd)
            log_mz = (lg.gather(-1, z.unsqueeze(-1)).squeeze(-1) - lse).to(wd)
            om_x = _log_mass_except(lg, lse, x_safe).to(wd).exp()
            g = torch.where(x == z, om_x, -log_mz - log_mx.exp())
        G = g.sum(-1)
        # The weight may be huge where G = 0 (t → 1 and nothing masked); never form 0 · inf.
        return torch.where(G > 0, kappa * G, torch.zeros_like(G))

    # --- time-reversal bound (§2.3 B): c_t Σ_i Σ_{y≠x} GKL(r_y ‖ ŝ_y), in closed, cancellation-free pieces ---
    oma_c = oma.clamp_min(tiny)
    b = V * alpha / oma_c  # boost b_t
    rho = oma_c / (oma_c + V * alpha)  # 1 / (1 + b)
    omrho = V * alpha / (oma_c + V * alpha)  # b / (1 + b)
    c = adot / (V * alpha.clamp_min(tiny))
    # The [rows, L, V] float64 temporaries are built a slice of rows at a time to bound their memory.
    n = x.shape[0]
    step = max(1, _VDIM_BLOCK // max(1, x.shape[1] * V))
    parts = []
    for i in range(0, n, step):
        sl = slice(i, i + step)
        parts.append(_reversal_gkl(logits[sl], x[sl], z[sl], b[sl], rho[sl], omrho[sl], wd))
    G = torch.cat(parts) if parts else torch.zeros(0, dtype=wd, device=x.device)
    return torch.where(G > 0, c * G, torch.zeros_like(G))


def _reversal_gkl(logits, x, z, b, rho, omrho, wd) -> Tensor:
    """Σ_i Σ_{y≠x^i} D_GKL(r^i_y ‖ ŝ^i_y) per row (MATH.md §2.3 B); b, rho = 1/(1+b), omrho = b/(1+b) per row."""
    V = logits.shape[-1]
    lg = logits.to(wd)
    lse = torch.logsumexp(lg, dim=-1)
    m = (lg - lse.unsqueeze(-1)).exp()  # [n, L, V]
    b3, rho3, omrho3 = _col(b, 2), _col(rho, 2), _col(omrho, 2)
    m_x = m.gather(-1, x.unsqueeze(-1))  # [n, L, 1]
    om_x = _log_mass_except(lg, lse, x).exp().unsqueeze(-1)  # 1 − m(x), accurately
    om_z = _log_mass_except(lg, lse, z).exp().unsqueeze(-1)
    ys = torch.arange(V, device=x.device)
    is_x = ys == x.unsqueeze(-1)
    is_z = ys == z.unsqueeze(-1)
    eq = (x == z).unsqueeze(-1)

    # ŝ_y = 1 + b m_y − b/(1+b) m_x = 1/(1+b) + b/(1+b)(1 − m_x) + b m_y: a sum of non-negative terms.
    s = rho3 + omrho3 * om_x + b3 * m
    one = torch.ones((), dtype=wd, device=x.device)
    # r_y: x = x_1 → 1/(1+b) for every y ≠ x; x ≠ x_1 → 1 + b at y = x_1, 1 elsewhere.
    r = torch.where(eq, rho3, torch.where(is_z, 1.0 + b3, one))
    # ŝ − r, with each case's cancellation done by hand.
    s_minus_r = torch.where(
        eq,
        omrho3 * om_x + b3 * m,
        torch.where(is_z, -omrho3 * m_x - b3 * om_z, b3 * m - omrho3 * m_x),
    )
    d = s_minus_r / r
    # log(ŝ/r): log1p where ŝ ≈ r (t → 0, where GKL ~ (ŝ − r)²), a plain difference elsewhere.
    log_ratio = torch.where(d.abs() < 0.5, torch.log1p(d.clamp_min(-0.5)), torch.log(s) - torch.log(r))
    gkl = torch.where(is_x, torch.zeros((), dtype=wd, device=x.device), s_minus_r - r * log_ratio)
    return gkl.sum((-1, -2))


def _safe_times(t: Tensor) -> Tensor:
    """Round stratified times to float32 and keep them in [tiny, 1 − 2^-24] (see the module docstring)."""
    return t.to(torch.float32).clamp(_T_LO, _T_HI)


def _sample_xt(x1: Tensor, t: Tensor, path: ProbabilityPath, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """x_t from p_{t|1}(·|x_1) split on E = {some token is corrupted (masked / changed)}, with the weight [B]
    that keeps E_{x_t}[w(t) G] unbiased (MATH.md §2.4).

    Near t = 1, E is rare while the weight κ_t (or c_t b_t) is large, so plain sampling has a heavy tail.
    The draw picks E with probability q = max(P(E), 1/2) (q = 1 for the masked source, where G = 0 off E)
    and returns weight P(E)/q on E, P(not E)/(1 − q) off it: the tail is capped at 2 P(E) κ_t = O(L α̇_t).
    On E, the first corrupted position is drawn from its truncated geometric law and the later ones
    independently; every token keeps exactly its kernel k_t (MATH.md §1.1).
    """
    B, L = x1.shape
    V = path.vocab_size
    wd = t.dtype
    oma = path.schedule.one_minus_alpha(t).clamp(0.0, 1.0)
    # Per-token corruption probability e: masked → 1 − α; uniform → (1 − α)(V − 1)/V (a redraw may hit x_1).
    e = oma if path.kind == "masked" else oma * (V - 1) / V
    log_keep = torch.log1p(-e)  # log(1 − e) ≤ 0
    p_event = -torch.expm1(L * log_keep)  # P(E) = 1 − (1 − e)^L, accurate when e is tiny
    if path.kind == "masked":
        q = torch.ones_like(p_event)
    else:
        q = p_event.clamp_min(0.5)
    u = torch.rand(2, B, generator=generator, device=x1.device, dtype=wd)
    event = u[0] < q
    # First corrupted position j: P(j) = (1 − e)^j e / P(E), by inverting its CDF (1 − (1 − e)^{j+1}) / P(E).
    j = torch.floor(torch.log1p(-u[1] * p_event) / log_keep)
    j = torch.nan_to_num(j, nan=0.0, posinf=L - 1.0).clamp(0, L - 1).long()
    pos = torch.arange(L, device=x1.device)
    later = torch.rand(B, L, generator=generator, device=x1.device, dtype=wd) < e.unsqueeze(-1)
    corrupt = (pos == j.unsqueeze(-1)) | ((pos > j.unsqueeze(-1)) & later)
    corrupt = corrupt & event.unsqueeze(-1)
    if path.kind == "masked":
        noisy = torch.full_like(x1, path.mask_id)
    else:
        shift = torch.randint(1, V, (B, L), generator=generator, device=x1.device)
        noisy = (x1 + shift) % V  # uniform over the V − 1 other tokens
    xt = torch.where(corrupt, noisy, x1)
    weight = torch.where(event, p_event / q, (1.0 - p_event) / (1.0 - q).clamp_min(torch.finfo(wd).tiny))
    return xt, weight


def nelbo_terms(
    denoiser: Denoiser,
    x1: Tensor,
    path: ProbabilityPath,
    *,
    num_t: int = 8,
    generator: torch.Generator | None = None,
    bound: str | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """Per-stratum Monte Carlo terms [num_t, B] of the path-space integral (MATH.md §2.4); their mean over
    dim 0 plus `prior_term` is `nelbo`. Row k uses t ∈ [k/num_t, (k+1)/num_t), so the row-to-row spread gives
    a conservative standard error for the stratified mean.

    The denoiser is called on at most `chunk_size` (x_t, t) rows at a time (default B: one stratum per call,
    i.e. the memory of one forward pass on the batch); the random draws do not depend on `chunk_size`.
    """
    bound = resolve_bound(path, bound)
    if x1.dim() != 2:
        raise ValueError(f"x1 must be a LongTensor [B, L], got shape {tuple(x1.shape)}")
    if x1.dtype.is_floating_point or x1.dtype == torch.bool:
        raise ValueError(f"x1 must hold integer token ids, got dtype {x1.dtype}")
    if x1.numel() and (int(x1.min()) < 0 or int(x1.max()) >= path.vocab_size):
        raise ValueError(
            f"x1 must hold clean tokens in [0, {path.vocab_size}); the mask is not a clean token"
        )
    if int(num_t) < 1:
        raise ValueError(f"num_t must be >= 1, got {num_t}")
    num_t = int(num_t)
    B = x1.shape[0]
    device = x1.device
    wd = _work_dtype(device)
    x1 = x1.long()
    chunk = B if chunk_size is None else int(chunk_size)
    if chunk < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")

    t32 = _safe_times(stratified_times(num_t, B, generator=generator, device=device, dtype=torch.float64))
    if B == 0:
        return torch.empty(num_t, 0, dtype=wd, device=device)
    out: list[Tensor] = []

    pending: list[Tensor] = []  # sampled x_t rows not yet sent to the denoiser, in stratum order
    row_weight = torch.empty(num_t * B, dtype=wd, device=device)
    n_pending, done = 0, 0

    def flush(rows: Tensor) -> None:
        nonlocal done
        n = rows.shape[0]
        tt = t32.reshape(-1)[done : done + n]
        # Row j of the flattened [num_t, B] grid belongs to sequence j mod B.
        z = x1[torch.arange(done, done + n, device=device) % B]
        logits = denoiser(rows, tt)
        if logits.dim() != 3 or logits.shape[:2] != rows.shape or logits.shape[-1] != path.vocab_size:
            raise ValueError(
                f"denoiser must return logits [N, L, V={path.vocab_size}], got shape {tuple(logits.shape)}"
            )
        out.append(row_weight[done : done + n] * nelbo_integrand(logits, z, rows, tt, path, bound))
        done += n

    # x_t is drawn for whole blocks of strata (a fixed number of tokens, so the random stream does not depend
    # on chunk_size), at the float32 times the denoiser will see, with float64 kernel arithmetic.
    L = x1.shape[1]
    per_block = max(1, _SAMPLE_BLOCK // max(1, B * L))
    t_rows = t32.reshape(-1).to(wd)
    for k0 in range(0, num_t, per_block):
        k1 = min(num_t, k0 + per_block)
        xt_blk, row_weight[k0 * B : k1 * B] = _sample_xt(
            x1.repeat(k1 - k0, 1), t_rows[k0 * B : k1 * B], path, generator
        )
        pending.append(xt_blk)
        n_pending += xt_blk.shape[0]
        while n_pending >= chunk or (k1 == num_t and n_pending > 0):
            rows = torch.cat(pending) if len(pending) > 1 else pending[0]
            take = min(chunk, n_pending)
            flush(rows[:take])
            rest = rows[take:]
            pending = [rest] if rest.shape[0] else []
            n_pending = rest.shape[0]
    return torch.cat(out).reshape(num_t, B)


def prior_term(x1: Tensor, path: ProbabilityPath) -> Tensor:
    """KL(p_{0|1}(·|x_1) ‖ p_0) per sequence [B], non-zero only for a clipped start α_0 > 0 (MATH.md §2.1).

    Uniform source: L Σ_y k_0(y|x) log(V k_0(y|x)), in closed form. Masked source: the term is infinite
    (p_0 is all-mask while p_{0|1} keeps tokens), so a ValueError is raised. α_1 < 1 is rejected too.
    """
    wd = _work_dtype(x1.device)
    sched = path.schedule
    zero = torch.zeros(1, dtype=wd, device=x1.device)
    a0 = float(sched.alpha(zero)[0])
    oma1 = float(sched.one_minus_alpha(zero + 1.0)[0])
    if oma1 > 1e-9:
        raise ValueError(
            f"schedule {sched!r} has α_1 = {1 - oma1:.6g} < 1: its reconstruction term is not implemented "
            "(MATH.md §2.1); use a schedule with α_1 = 1"
        )
    B, L = x1.shape
    if a0 <= 0.0:
        return torch.zeros(B, dtype=wd, device=x1.device)
    if path.kind == "masked":
        raise ValueError(
            f"schedule {sched!r} starts at α_0 = {a0:.3g} > 0: for the masked source the prior term "
            "KL(p_0|1 ‖ δ_mask) is infinite, so no valid bound exists (MATH.md §2.1, §8.21); use α_0 = 0 "
            "(e.g. LogLinearSchedule(eps=0))"
        )
    V = path.vocab_size
    hit = a0 + (1.0 - a0) / V
    kl = hit * math.log(V * hit) + (V - 1) * (1.0 - a0) / V * math.log1p(-a0)
    return torch.full((B,), L * kl, dtype=wd, device=x1.device)


def nelbo(
    denoiser: Denoiser,
    x1: Tensor,
    path: ProbabilityPath,
    *,
    num_t: int = 8,
    generator: torch.Generator | None = None,
    bound: str | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """Per-sequence upper bound on −log p^θ_1(x_1) in nats, FloatTensor[B] (float64 where available).

    −log p^θ_1(x_1) ≤ KL(p_{0|1} ‖ p_0) + ∫_0^1 w(t) E_{x_t~p_{t|1}}[G] dt (MATH.md §2.1–2.4), estimated
    unbiasedly with `num_t` stratified times per sequence and one x_t ~ p_{t|1}(·|x_1) per time. `bound`:
    None → "masked" (masked source) or "reversal" (uniform source, §2.3 B); "dfm" selects §2.3 A.
    All randomness comes from `generator`; `chunk_size` bounds the rows per denoiser call. Differentiable
    (no no_grad here).
    """
    bound = resolve_bound(path, bound)
    prior = prior_term(x1, path)  # raises early for a masked source with a clipped start
    terms = nelbo_terms(
        denoiser, x1, path, num_t=num_t, generator=generator, bound=bound, chunk_size=chunk_size
    )
    return terms.mean(0) + prior


def bits_per_token(nats, length: int):
    """BPC / bits per token = nats / (L ln 2) (MATH.md §2.4); `nats` is a per-sequence bound (float or tensor)."""
    return nats / (length * _LN2)


bpc = bits_per_token


def perplexity(nats, length: int):
    """Perplexity = exp(nats / L) (MATH.md §2.4)."""
    if isinstance(nats, Tensor):
        return torch.exp(nats / length)
    return math.exp(nats / length)


def evaluate_bound(
    denoiser: Denoiser,
    data: Tensor,
    path: ProbabilityPath,
    *,
    batch_size: int = 32,
    num_t: int = 8,
    generator: torch.Generator | None = None,
    bound: str | None = None,
    progress: bool = False,
    chunk_size: int | None = None,
    device=None,
) -> dict:
    """Dataset-level bound: mean over sequences of `nelbo`/L, as nats and bits per token and perplexity,
    with standard errors across sequences (MATH.md §2.4). No gradients; leaves the model's mode alone.

    Returns {"nats_per_token", "nats_per_token_stderr", "bpc", "bpc_stderr", "perplexity",
    "perplexity_stderr", "nats_per_sequence", "bound", "num_sequences", "num_tokens", "num_t"}.
    The stderr combines data and Monte Carlo spread (it is the stderr of the dataset mean).
    """
    bound = resolve_bound(path, bound)
    data = torch.as_tensor(data)
    if data.dim() != 2:
        raise ValueError(f"data must be a LongTensor [N, L], got shape {tuple(data.shape)}")
    if int(batch_size) < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    N, L = data.shape
    if N == 0 or L == 0:
        raise ValueError("evaluate_bound needs at least one non-empty sequence")
    device = data.device if device is None else torch.device(device)
    starts = range(0, N, int(batch_size))
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=f"nelbo[{bound}]", unit="batch")
    per_seq = []
    with torch.no_grad():
        for s in starts:
            x1 = data[s : s + int(batch_size)].to(device=device, dtype=torch.long)
            per_seq.append(
                nelbo(
                    denoiser, x1, path, num_t=num_t, generator=generator, bound=bound, chunk_size=chunk_size
                )
                .double()
                .cpu()
            )
    return {**summarise_nats(torch.cat(per_seq) / L, L, bound), "num_t": int(num_t)}


def summarise_nats(nats: Tensor, length: int, bound: str) -> dict:
    """Dataset metrics from nats per token of each of N sequences [N]: mean and standard error (NaN for N = 1)
    as nats, bits (÷ ln 2) and perplexity exp(mean) (delta-method error), for sequences of `length` tokens,
    labelled `bound` (MATH.md §2.4). The report format of every likelihood-type metric here."""
    nats = nats.double()
    N = nats.numel()
    mean = float(nats.mean())
    se = float(nats.std(unbiased=True) / math.sqrt(N)) if N > 1 else float("nan")
    return {
        "nats_per_token": mean,
        "nats_per_token_stderr": se,
        "bpc": mean / _LN2,
        "bpc_stderr": se / _LN2,
        "perplexity": math.exp(mean),
        "perplexity_stderr": math.exp(mean) * se,  # delta method
        "nats_per_sequence": mean * length,
        "bound": bound,
        "num_sequences": N,
        "num_tokens": N * length,
    }
