"""Samplers for masked and uniform discrete diffusion (MATH.md §6).

Every sampler runs a grid 0 = t_0 < … < t_K = 1 from the source to clean data. At each step the model's
per-token clean-token distribution m^i(· | x_t) (softmax of the denoiser logits, optionally tempered and
nucleus-truncated) or a jointly drawn x̂_1 drives one of three per-token transitions:

* ``"euler"`` (§6.1): draw x̂^i ~ m^i and jump to it with probability λ = (α_{t'} − α_t)/(1 − α_t);
  only the path's free positions move (`path.free`; masked source: the masked ones, carry-over).
* ``"analytic"`` (§6.2): draw x^i_{t'} from the exact forward-chain bridge Σ_a m^i(a) B(· | x^i_t, a)
  (`Path.bridge`); the time-reversal sampler whose likelihood bound is MATH.md §2.3(B) for the uniform source.
* ``"ancestral"``: for an absorbing source (`path.absorbing`, the masked one) §6.1 and §6.2 are the same
  sampler; this name runs it in the sparse form (reveal with probability λ, then draw only the revealed
  tokens) with MDLM's cache. For other sources it is an alias of ``"analytic"``.
* ``"joint"``: a callable draws x̂_1 jointly from p_{1|t}(· | x_t) and the per-token bridge is applied to the
  one-hot x̂_1, which is exact for any number of steps (§6.2, oracle e.a).

The last step goes to t_K = 1, where every one of these transitions reduces to x^i_1 = x̂^i at the positions
that may still change, so the output is clean (never a mask id). The path supplies everything that depends
on the source; whether outputs may be cached is decided once, by `may_cache`. Categorical draws use Gumbel-max in float64,
and all randomness flows through one `torch.Generator`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tcsm.models.kinds import denoise, kind_of
from tcsm.paths import ProbabilityPath
from tcsm.sampling.common import (
    RowStreams,
    adjust_log_probs,
    as_grid,
    denoise_rows,
    inverse_cdf,
    pinned_positions,
    prefix_condition,
    row_streams,
)

__all__ = ["METHODS", "SamplingStats", "may_cache", "sample"]

Denoiser = Callable[[Tensor, Tensor], Tensor]
#: (x_t LongTensor[b, L], t FloatTensor[b], generator) -> x̂_1 LongTensor[b, L] drawn jointly from p_{1|t}.
X1Sampler = Callable[[Tensor, Tensor, "torch.Generator | None"], Tensor]
StepCallback = Callable[[int, float, Tensor], None]

METHODS = ("ancestral", "analytic", "euler", "joint")
#: the most uniforms (rows × 2 keys a step × steps × positions) an eager decode hashes ahead of its steps (8 MB)
_UNIFORMS_AHEAD = 2**20


@dataclass
class SamplingStats:
    """What a `sample` call did. `num_calls` counts batched denoiser (or x̂_1-sampler) invocations, `num_rows`
    the sequences they evaluated in total, `row_calls` [B] the evaluations of each output sequence."""

    method: str
    num_steps: int
    cached: bool
    times: Tensor
    num_calls: int = 0
    num_rows: int = 0
    row_calls: Tensor | None = None
    #: step index k -> x_{t_k} [B, L] (mask ids allowed before the last step), for the requested steps.
    trajectory: dict[int, Tensor] = field(default_factory=dict)
    #: what a particular sampler also counts (SIR: steps with and without SIR, energy rows scored)
    counts: dict[str, int] = field(default_factory=dict)
    #: the decoding orders' steps that had a position to reveal, a 0-d device count (read it when reporting)
    steps_taken: Tensor | None = None

    def add_chunk(self, other: SamplingStats) -> None:
        """Add the counts of a later chunk of rows (`in_row_chunks`): its rows follow this one's."""
        self.num_calls += other.num_calls
        self.num_rows += other.num_rows
        self.row_calls = torch.cat([self.row_calls, other.row_calls])
        self.counts = {key: self.counts[key] + other.counts[key] for key in self.counts}
        if self.steps_taken is not None:
            self.steps_taken = self.steps_taken + other.steps_taken

    @property
    def max_row_calls(self) -> int:
        """Most evaluations of any one sequence: ≤ min(K, L) for the cached masked sampler (MATH.md §6.2)."""
        return int(self.row_calls.max()) if self.row_calls is not None and self.row_calls.numel() else 0


def in_row_chunks(draw_rows, num: int, length: int, chunk_size: int | None, streams: RowStreams,
                  fixed: Tensor | None = None, values: Tensor | None = None):  # fmt: skip
    """(tokens [num, length], SamplingStats) of a whole decode run over chunks of at most `chunk_size` rows, one after
    another: `draw_rows(n, streams, pins)` draws n rows from their streams (`pins`: their `fixed` / `values`, or
    none). Each row draws from its own stream, so the tokens do not depend on the chunks; the stats are summed."""
    chunk = num if chunk_size is None else max(1, int(chunk_size))
    outs, stats = [], None
    for lo in range(0, num, chunk):
        rows = slice(lo, min(num, lo + chunk))
        pins = {}
        if fixed is not None:
            pins = {"fixed": fixed.expand(num, length)[rows], "values": values.expand(num, length)[rows]}
        x, st = draw_rows(rows.stop - lo, streams.select(rows), pins)
        outs.append(x)
        if stats is None:
            stats = st
        else:
            stats.add_chunk(st)
    return torch.cat(outs), stats


# --- the sampler's cache rule ---------------------------------------------------------------------


def may_cache(denoiser, path: ProbabilityPath) -> bool:
    """Whether `sample` reuses the denoiser's output for a row while its x_t is unchanged (MDLM cache, MATH.md
    §1.3, §6.2): iff the denoiser declares that it ignores t (a `time_independent` attribute, else a model
    config with `time_conditioning=False`) and p_{1|t}(·|x_t) does not depend on t on this path
    (`path.posterior_depends_on_t` False, the masked source), the only case where such a denoiser can be exact."""
    if path.posterior_depends_on_t:
        return False
    if hasattr(denoiser, "time_independent"):
        return bool(denoiser.time_independent)
    cfg = getattr(denoiser, "cfg", None)
    return cfg is not None and getattr(cfg, "time_conditioning", True) is False


# --- the sampler ---------------------------------------------------------------------------------------


def _resolve_method(method: str | None, path: ProbabilityPath, x1_sampler) -> str:
    if method is None:
        method = "joint" if x1_sampler is not None else "ancestral"
    if method not in METHODS:
        raise ValueError(f"unknown sampling method {method!r}; choose one of {list(METHODS)}")
    if method == "joint" and x1_sampler is None:
        raise ValueError("method 'joint' needs an x1_sampler that draws x̂_1 from p_{1|t}(· | x_t)")
    if method != "joint" and x1_sampler is not None:
        raise ValueError(f"an x1_sampler is only used by method 'joint', not {method!r}")
    if method == "ancestral" and not path.absorbing:
        method = "analytic"  # §6.2: without an absorbing source the ancestral step is the analytic bridge
    return method


def _infer_device(denoiser, values):
    if values is not None:
        return torch.as_tensor(values).device
    params = getattr(denoiser, "parameters", None)
    if callable(params):
        for p in params():
            return p.device
    return torch.device("cpu")


def _sample_chunk(
    denoiser,
    path: ProbabilityPath,
    *,
    fixed: Tensor,
    values: Tensor,
    grid: Tensor,
    grid_host: list[float] | None,
    method: str,
    generator,
    temperature: float,
    top_p: float,
    final_argmax: bool,
    use_cache: bool,
    x1_sampler,
    record: set[int],
    callback,
):
    B, L = fixed.shape
    V = path.vocab_size
    device = fixed.device
    K = grid.numel() - 1
    time_dtype = torch.get_default_dtype()

    x = _prior(path, generator, L)
    # an x̂_1 sampler draws whole batches from a torch.Generator: its rows share one stream (not batch invariant)
    joint_generator = _generator(generator.fork(-2).host_seeds()[0], device) if method == "joint" else None
    x = torch.where(fixed, values, x)  # conditioning: clean from t = 0 on (masked: simply unmasked tokens)

    cache: Tensor | None = None  # denoiser logits [B, L, V] or joint x̂_1 [B, L] for the current x of each row
    valid = torch.zeros(B, dtype=torch.bool, device=device)  # row's cache entry belongs to its current x
    stats = {"calls": 0, "rows": 0, "row_calls": torch.zeros(B, dtype=torch.long, device=device)}
    trajectory: dict[int, Tensor] = {}

    # a denoiser that evaluates the whole batch at static shapes (the engine's block calls) is called every step on
    # every row, and every update is a dense select: the same draws (keyed by position), no host read in the loop
    dense = bool(getattr(denoiser, "static_rows", False)) and method != "joint"
    # a denoiser that projects chosen positions alone is called, per step, on the moving positions only
    positional = (not dense and method in ("ancestral", "euler") and "positions" in kind_of(denoiser).offers
                  and not callable(getattr(denoiser, "batch_rows", None)))  # fmt: skip

    def emit(k: int):
        if k in record:
            trajectory[k] = x.clone()
        if callback is not None:
            callback(k, grid_host[k], x)

    # the engine's denoiser may replay the whole step (its call, the draws, the update) as one captured graph
    capture = getattr(denoiser, "capture_step", None) if dense else None
    if capture is not None:  # step k draws at keys 2k (reveal) and 2k + 1 (token), read from the device
        keys = torch.arange(2 * K, device=device).view(K, 2)
    # the eager steps' uniforms in one hash call when they are few: the same values (each is keyed by its row, key
    # and position) for a fraction of the per-step calls' tensor ops, which a block model's short steps feel
    ahead = None
    if not dense and B * 2 * K * L <= _UNIFORMS_AHEAD:
        ahead = generator.uniform(range(2 * K), L).view(B, K, 2, L)
    emit(0)
    for k in range(K):
        last = k == K - 1
        step = None if capture is None else capture(
            ("dense", id(path), method, temperature, top_p, final_argmax, last),
            lambda x, fixed, ts, key, base, last=last: _dense_update(
                path, x, fixed, denoiser.raw, ts, RowStreams.of_base(base).uniform(key, L), method, temperature,
                top_p, final_argmax, last))  # fmt: skip
        if step is not None:
            # its output is static: read before the next step, cloned at the end
            x = step(x, fixed, grid[k : k + 2], keys[k], generator.base)
            stats["calls"] += 1
            stats["rows"] += B
            stats["row_calls"] += 1
            stats["captured_steps"] = stats.get("captured_steps", 0) + 1
            emit(k + 1)
            continue
        if dense:
            x = _dense_step(denoiser, path, x, fixed, grid, grid_host, k, method, generator, temperature, top_p,
                            final_argmax)  # fmt: skip
            stats["calls"] += 1
            stats["rows"] += B
            stats["row_calls"] += 1
            emit(k + 1)
            continue
        t, s = grid[k], grid[k + 1]
        free = ~fixed & path.free(x)
        # the reveal's and the token's uniform of every position
        u = ahead[:, k] if ahead is not None else generator.uniform([2 * k, 2 * k + 1], L)
        if positional:
            x = _positional_step(denoiser, path, x, free, u, t, s, last, temperature, top_p, final_argmax, stats)
            emit(k + 1)
            continue
        active = free.any(-1)  # rows with nothing left to resolve need no network call

        need = active & ~valid if use_cache else active
        if need.any():
            rows = need.nonzero().squeeze(1)
            t_rows = torch.full((rows.numel(),), float(t), dtype=time_dtype, device=device)
            if method == "joint":
                out = x1_sampler(x[rows], t_rows, joint_generator).long()
            else:
                out = denoise_rows(denoiser, x, rows, t_rows)
                if out.shape != (rows.numel(), L, V):
                    raise ValueError(
                        f"denoiser returned shape {tuple(out.shape)}, expected {(rows.numel(), L, V)}"
                    )
            if cache is None:
                cache = torch.empty((B,) + tuple(out.shape[1:]), dtype=out.dtype, device=device)
            cache[rows] = out
            valid[rows] = use_cache
            stats["calls"] += 1
            stats["rows"] += rows.numel()
            stats["row_calls"][rows] += 1

        x_prev = x
        x = x.clone()
        sparse = last or method in ("euler", "ancestral") or (method == "joint" and path.absorbing)
        if sparse:
            # §6.1 / absorbing §6.2: each free token moves with probability λ to x̂^i; only moving tokens need x̂^i.
            # At t_K = 1 every transition (Euler, bridge, joint) sets x^i = x̂^i on all free positions.
            if last:
                move = free
            else:
                lam = path.jump_prob(t.reshape(1), s.reshape(1))
                move = free & (u[:, 0] < lam)
            pos = move.nonzero(as_tuple=True)
            if pos[0].numel():
                if method == "joint":
                    new = cache[pos]
                else:
                    lp = adjust_log_probs(cache[pos], temperature, top_p)
                    new = lp.argmax(-1) if (last and final_argmax) else inverse_cdf(lp, u[:, 1][pos])
                x[pos] = new
        else:
            # §6.2 analytic step: x^i_{t'} ~ Σ_a m^i(a) B(· | x^i_t, a) with the exact bridge of the path.
            rows = active.nonzero().squeeze(1)
            if rows.numel():
                if method == "joint":
                    probs = torch.nn.functional.one_hot(cache[rows], V).double()
                else:
                    probs = adjust_log_probs(cache[rows], temperature, top_p).exp()
                b = rows.numel()
                bridge = path.bridge(
                    x[rows], t.expand(b).to(torch.float64), s.expand(b).to(torch.float64), probs
                )
                new = inverse_cdf(torch.log(bridge), u[rows, 1])
                x[rows] = torch.where(free[rows], new, x[rows])  # fixed tokens never move

        if use_cache:
            valid &= ~(x != x_prev).any(-1)
        emit(k + 1)

    if not dense and (x >= V).any():  # (the dense path reads nothing on the host: its caller checks once)
        raise RuntimeError("sampler left noise-only ids (masks) in the output; the time grid must end at t = 1")
    return (x.clone() if "captured_steps" in stats else x), stats, trajectory


def _positional_step(denoiser, path, x, free, u, t, s, last, temperature, top_p, final_argmax, stats) -> Tensor:
    """The sparse step (§6.1; absorbing §6.2) of a denoiser that offers "positions": the moving positions are drawn
    first (they do not depend on its output), then it is called on the rows that move, projected at their moving
    positions alone. The draws are the cached step's (the same uniforms, the same bits of the logits); a row that
    moves nothing makes no call, whether or not the denoiser reads t."""
    move = free if last else free & (u[:, 0] < path.jump_prob(t.reshape(1), s.reshape(1)))
    rows = move.any(-1).nonzero().squeeze(1)
    if rows.numel() == 0:
        return x
    at = move[rows]
    t_rows = torch.full((rows.numel(),), float(t), dtype=torch.get_default_dtype(), device=x.device)
    lp = adjust_log_probs(denoise(denoiser, x[rows], t_rows, None, at=at), temperature, top_p)
    x = x.clone()
    pos = move.nonzero(as_tuple=True)
    x[pos] = lp.argmax(-1) if (last and final_argmax) else inverse_cdf(lp, u[:, 1][pos])
    stats["calls"] += 1
    stats["rows"] += rows.numel()
    stats["row_calls"][rows] += 1
    return x


def _dense_step(denoiser, path, x, fixed, grid, grid_host, k, method, streams, temperature, top_p, final_argmax):
    """x_{t_{k+1}} from x_{t_k} [B, L] with the denoiser on every row and dense selects, drawing what the sparse
    step draws: a reveal uniform (key 2k) and a token uniform (key 2k + 1) per position."""
    last = k == grid.numel() - 2
    u = streams.uniform([2 * k, 2 * k + 1], x.shape[1])
    return _dense_update(path, x, fixed, denoiser, grid[k : k + 2], u, method, temperature, top_p, final_argmax, last)


def _dense_update(path, x, fixed, denoiser, ts, u, method, temperature, top_p, final_argmax, last):
    """The dense step from t = ts[0] to s = ts[1] (device values) with the uniforms u [B, 2, L]: a function of
    tensors only, with no host read, which the engine captures whole (`capture_step`)."""
    B = x.shape[0]
    free = ~fixed & path.free(x)
    t = ts[0].to(torch.get_default_dtype()).expand(B)
    lp = adjust_log_probs(denoiser(x, t), temperature, top_p)
    if last or method in ("euler", "ancestral"):
        move = free
        if not last:
            move = free & (u[:, 0] < path.jump_prob(ts[:1], ts[1:]))
        new = lp.argmax(-1) if (last and final_argmax) else inverse_cdf(lp, u[:, 1])
        return torch.where(move, new, x)
    bridge = path.bridge(x, ts[0].expand(B).to(torch.float64), ts[1].expand(B).to(torch.float64), lp.exp())
    return torch.where(free, inverse_cdf(torch.log(bridge), u[:, 1]), x)


def _prior(path: ProbabilityPath, streams, L: int) -> Tensor:
    """x_0 ~ p_0 [B, L], each row from a generator seeded by its own stream (once per decode); an absorbing
    path's source is its mask state, drawn without randomness (and without reading the seeds on the host)."""
    if path.absorbing:
        return path.prior_sample(len(streams), L, device=streams.device)
    seeds = streams.fork(-1).host_seeds()  # (computed on the host when the streams hold their seeds there)
    return torch.cat([path.prior_sample(1, L, device=streams.device, generator=_generator(s, streams.device))
                      for s in seeds])  # fmt: skip


def _generator(seed: int, device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed & (2**63 - 1))


def sample(
    denoiser: Denoiser | None,
    path: ProbabilityPath,
    *,
    batch_size: int,
    length: int,
    num_steps: int,
    generator: torch.Generator | None = None,
    method: str | None = None,
    grid: str | Sequence[float] | Tensor = "uniform",
    temperature: float = 1.0,
    top_p: float = 1.0,
    final_argmax: bool = False,
    fixed: Tensor | None = None,
    values: Tensor | None = None,
    prompt: Tensor | None = None,
    time_independent: bool | None = None,
    x1_sampler: X1Sampler | None = None,
    chunk_size: int | None = None,
    seed: int | None = None,
    device=None,
    return_stats: bool = False,
    record_steps: Iterable[int] | None = None,
    callback: StepCallback | None = None,
    precision: str | None = None,
):
    """Draw `batch_size` sequences of `length` clean tokens by running K = `num_steps` steps from t = 0 to t = 1
    (MATH.md §6): Euler §6.1, analytic/ancestral bridge §6.2, or the joint-x̂_1 bridge (exact for any K).

    Args:
        denoiser: (x_t LongTensor[b, L], t FloatTensor[b]) -> logits [b, L, V] over clean tokens. Unused
            (may be None) with `x1_sampler`. One that offers "positions" (`ModelKind.offers`) is called, in the
            sparse steps (ancestral on an absorbing path, Euler), on the rows that move and at their moving
            positions only (`_positional_step`: the same draws, no cache needed).
        path: any `ProbabilityPath`: its schedule defines λ, and it supplies the bridge and free positions.
        method: "ancestral" (default; sparse reveal for an absorbing path such as the masked one, otherwise
            the "analytic" `path.bridge`), "analytic", "euler", or "joint" (default when `x1_sampler` is given).
        grid: "uniform", "cosine" (see `time_grid`) or K + 1 increasing times ending exactly at 1.
        temperature, top_p: applied to the logits before every draw (`adjust_log_probs`).
        final_argmax: take the most likely token instead of a draw at the last step.
        fixed, values: bool mask and clean tokens ([B, L] or [L]) pinned from t = 0 on (prompts, infilling);
            masked source: they start unmasked; uniform source: the model sees them. `prompt` ([P] or [B, P])
            is shorthand for a prefix (see `prefix_condition`).
        time_independent: the denoiser ignores t, so its output can be reused for every row whose x_t did
            not change since its last evaluation (MDLM cache, §6.2): at most min(K, L) calls per sequence for
            the masked source. Defaults to `may_cache(denoiser, path)`. With a joint `x1_sampler` the flag
            reuses x̂_1 while x_t is unchanged, which stays a valid posterior draw (§6.3).
        x1_sampler: (x_t, t, generator) -> x̂_1 [b, L] drawn jointly from p_{1|t}(· | x_t).
        chunk_size: sample the batch in chunks of at most this many sequences (memory), one after another.
        generator / seed: source of all randomness (a seed builds a generator on `device`); neither: torch's
            global generator.
        return_stats: also return a `SamplingStats` (network calls, rows evaluated, trajectory).
        record_steps: step indices k in [0, K] whose states x_{t_k} are kept in `SamplingStats.trajectory`
            (k = 0 is the source sample; intermediate masked states contain mask ids).
        callback: called as callback(k, t_k, x) after every step (per chunk), including k = 0.
        precision: "bf16" runs the denoiser calls under bf16 autocast (its logits, and every draw, stay in
            float32 / float64), "fp32" without autocast; None (default) keeps the caller's autocast context.

    Returns:
        LongTensor[B, L] with values in [0, V), or (tokens, SamplingStats) if `return_stats`.
    """
    method = _resolve_method(method, path, x1_sampler)
    if method != "joint" and denoiser is None:
        raise ValueError(f"method {method!r} needs a denoiser")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    B, L = int(batch_size), int(length)
    if B < 1 or L < 1:
        raise ValueError(f"batch_size and length must be >= 1, got {batch_size}, {length}")
    if prompt is not None:
        if fixed is not None or values is not None:
            raise ValueError("pass either a prompt or fixed/values, not both")
        fixed, values = prefix_condition(prompt, B, L)
    if device is None:
        device = _infer_device(denoiser, values)
    device = torch.device(device)
    # the block decoder checks the pins it hands an in-block sampler once per decode
    checked = bool(getattr(denoiser, "caller_checks", False))
    fixed, values = pinned_positions(fixed, values, B, L, path.vocab_size, device, checked=checked)
    if time_independent is None:
        time_independent = may_cache(denoiser, path)
    if generator is None and seed is not None:
        generator = torch.Generator(device=device).manual_seed(int(seed))
    host_times = as_grid(grid.cpu() if isinstance(grid, Tensor) else grid, int(num_steps), "cpu")
    times = host_times.to(device)
    K = times.numel() - 1
    record = set() if record_steps is None else {int(k) for k in record_steps}
    if any(not 0 <= k <= K for k in record):
        raise ValueError(f"record_steps must lie in [0, {K}]")
    if record and not return_stats:
        raise ValueError("record_steps fills SamplingStats.trajectory: pass return_stats=True to get it back")

    if precision not in (None, "fp32", "bf16"):
        raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
    if precision is not None and denoiser is not None:
        inner = denoiser

        def denoiser(xt, t):
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                return inner(xt, t).float()

    streams = row_streams(generator, B, device)  # a row's draws depend on its own seed only, whatever the chunk
    chunk = B if chunk_size is None else max(1, int(chunk_size))
    stats = SamplingStats(method=method, num_steps=K, cached=bool(time_independent), times=times)
    outs, row_calls, trajs = [], [], []
    grid_host = None if callback is None else host_times.tolist()  # (the callback's times)
    with torch.no_grad():
        for start in range(0, B, chunk):
            sl = slice(start, min(B, start + chunk))
            x, st, traj = _sample_chunk(
                denoiser,
                path,
                fixed=fixed[sl],
                values=values[sl],
                grid=times,
                grid_host=grid_host,
                method=method,
                generator=streams.select(sl),
                temperature=float(temperature),
                top_p=float(top_p),
                final_argmax=final_argmax,
                use_cache=bool(time_independent),
                x1_sampler=x1_sampler,
                record=record,
                callback=callback,
            )
            outs.append(x)
            row_calls.append(st["row_calls"])
            trajs.append(traj)
            stats.num_calls += st["calls"]
            stats.num_rows += st["rows"]
            if "captured_steps" in st:  # steps replayed whole by the engine (call, draws and update)
                stats.counts["captured_steps"] = stats.counts.get("captured_steps", 0) + st["captured_steps"]
    tokens = torch.cat(outs)
    if not return_stats:
        return tokens
    stats.row_calls = torch.cat(row_calls)
    stats.trajectory = {k: torch.cat([tr[k] for tr in trajs]) for k in sorted(record)}
    return tokens, stats
