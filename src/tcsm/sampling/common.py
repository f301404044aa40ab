"""Building blocks every sampler shares (MATH.md §6): time grids, exact float64 Gumbel-max draws, temperature
and nucleus truncation, the jump probability, and prompt pinning. Sibling modules: `tcsm.sampling.samplers` (the
path samplers) and `tcsm.posttrain.dre.sir` (SIR over an energy model) build on these."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from tcsm.paths import ProbabilityPath

__all__ = ["GRIDS", "CallCount", "RowStreams", "adjust_log_probs", "as_grid", "categorical", "denoise_rows",
           "inverse_cdf", "jump_prob", "pinned_positions", "prefix_condition", "row_evaluations", "row_streams", "time_grid"]

GRIDS = ("uniform", "cosine")


@dataclass(frozen=True)
class CallCount:
    """What a sampler without a time grid did (e.g. left to right): its name and its batched network calls."""

    method: str
    num_calls: int


def row_evaluations(stats, num: int) -> int:
    """Network evaluations of single sequences in a sampler call that drew `num` of them: Σ_b row_calls[b] where
    the stats count them (a batched call evaluates only the rows that need it, MATH.md §6.2's cache), else
    num_calls · num (every batched call evaluated every row)."""
    rc = getattr(stats, "row_calls", None)
    if rc is not None and rc.numel():
        return int(rc.sum())
    return int(stats.num_calls) * int(num)


def denoise_rows(denoiser, x: Tensor, rows: Tensor, t: Tensor) -> Tensor:
    """The denoiser's logits for the rows `rows` of the batch x at their times t: `denoiser(x[rows], t)`, or, for a
    denoiser whose rows share state with the whole batch (a block model's KV cache, `tcsm.sampling.blocks`) and that
    says so by a `batch_rows` method, `denoiser.batch_rows(x, rows, t)`."""
    batch_rows = getattr(denoiser, "batch_rows", None)
    return batch_rows(x, rows, t) if callable(batch_rows) else denoiser(x[rows], t)


def time_grid(
    num_steps: int, kind: str = "uniform", *, device=None, dtype: torch.dtype = torch.float64
) -> Tensor:
    """Grid 0 = t_0 < … < t_K = 1 (MATH.md §6): "uniform" t_k = k/K; "cosine" t_k = (1 − cos(πk/K))/2,
    finer near both ends. The last entry is exactly 1 so that the final step resolves every token."""
    K = int(num_steps)
    if K < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    k = torch.arange(K + 1, dtype=torch.float64, device=device) / K
    if kind == "uniform":
        grid = k
    elif kind == "cosine":
        grid = 0.5 * (1.0 - torch.cos(math.pi * k))
    else:
        raise ValueError(f"unknown time grid {kind!r}; choose one of {list(GRIDS)} or pass the times")
    grid[0], grid[-1] = 0.0, 1.0
    return grid.to(dtype)


def as_grid(grid, num_steps: int, device) -> Tensor:
    if isinstance(grid, str):
        return time_grid(num_steps, grid, device=device)
    g = torch.as_tensor(grid, dtype=torch.float64, device=device).flatten()
    if g.numel() != num_steps + 1:
        raise ValueError(f"a time grid for {num_steps} steps needs {num_steps + 1} points, got {g.numel()}")
    if not (g[0] >= 0 and g[-1] == 1 and (g[1:] > g[:-1]).all()):
        raise ValueError("a time grid must increase strictly from t_0 >= 0 to exactly t_K = 1")
    return g


def categorical(log_probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Exact draw y = argmax_y(log p_y + G_y), G_y ~ Gumbel(0, 1) i.i.d., in float64 (low-precision Gumbel
    noise truncates the tail and biases the draw). `log_probs` may be unnormalised and contain −inf."""
    lp = log_probs.double()
    u = torch.rand(lp.shape, dtype=torch.float64, device=lp.device, generator=generator)
    gumbel = -torch.log(-torch.log(u.clamp_min(torch.finfo(torch.float64).tiny)))
    return (lp + gumbel).argmax(-1)


def _signed(c: int) -> int:
    return c - 2**64 if c >= 2**63 else c


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_C1, _C2 = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)


def _splitmix_int(z: int) -> int:
    """`_splitmix` on one Python int, the same signed 64-bit word out as the tensor hash gives."""
    z &= 2**64 - 1
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & (2**64 - 1)
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & (2**64 - 1)
    return _signed(z ^ (z >> 31))


def _splitmix(z: Tensor) -> Tensor:
    """SplitMix64's finaliser (a bijection of 64-bit words) on int64 tensors: products wrap around 2^64 as the
    unsigned arithmetic does, and the right shifts are made logical by masking off the sign's copies."""
    z = (z ^ ((z >> 30) & (2**34 - 1))) * _C1
    z = (z ^ ((z >> 27) & (2**37 - 1))) * _C2
    return z ^ ((z >> 31) & (2**33 - 1))


class RowStreams:
    """One random stream per row of a batch, drawn on the device: the uniform at (row, key, position) is a
    counter-based hash (SplitMix64's finaliser) of the row's seed, the key and the position, computed with integer
    tensor ops, so it depends neither on the batch the row shares, nor on the draws made before, nor on the device,
    and a CUDA graph can capture it. `key` names a draw of a decode (a step, and what it is for); a sampler keys
    every draw so that a row's draws depend on its own state only. `fork(tag)` derives the streams of a sub-decode
    (a block), `select(rows)` the streams of some rows."""

    def __init__(self, seeds: Tensor, host: list[int] | None = None):
        self.seeds = seeds.to(torch.long)
        self.base = _splitmix(self.seeds * _GOLDEN + 0x3C6EF372FE94F82B)
        self._host = host  # the seeds as Python ints when known: forks then derive theirs without a device read

    @classmethod
    def from_generator(cls, generator: torch.Generator | None, batch_size: int, device) -> RowStreams:
        """Row i's seed is s + i, s one draw of `generator` (or of torch's global one): `sample.seed` and a row's
        index fix its stream, whatever the batch size."""
        gen_device = generator.device if generator is not None else "cpu"
        base = torch.randint(0, 2**62, (1,), generator=generator, device=gen_device).to(device)
        return cls(base + torch.arange(int(batch_size), device=device))

    @classmethod
    def of_base(cls, base: Tensor) -> RowStreams:
        """The streams whose hashed seeds are `base` (a captured step reads a static copy of `streams.base`)."""
        streams = cls.__new__(cls)
        streams.seeds, streams.base = None, base
        return streams

    @property
    def device(self):
        return self.base.device

    def __len__(self) -> int:
        return self.seeds.numel()

    def select(self, rows) -> RowStreams:
        host = self._host[rows] if self._host is not None and isinstance(rows, slice) else None
        return RowStreams(self.seeds[rows], host)

    def fork(self, tag: int) -> RowStreams:
        key = int(tag) + 1
        host = None
        if self._host is not None:
            mixed = _splitmix_int(key * _GOLDEN)
            host = [_splitmix_int(_splitmix_int(s * _GOLDEN + 0x3C6EF372FE94F82B) ^ mixed) for s in self._host]
        return RowStreams(_splitmix(self.base ^ _splitmix(torch.full_like(self.base, key) * _GOLDEN)), host)

    def on_host(self) -> RowStreams:
        """These streams with their seeds also held as Python ints (one read of the device now), so that the seeds
        of every fork and slice are computed on the host: a decoder that seeds a per-row torch.Generator per block
        (a uniform path's prior) reads nothing from the device between its blocks."""
        return RowStreams(self.seeds, self.host_seeds())

    def host_seeds(self) -> list[int]:
        """The rows' seeds as Python ints: computed on the host when known there (`on_host`), else read."""
        return list(self._host) if self._host is not None else self.seeds.tolist()

    def uniform(self, keys, length: int, rows: Tensor | None = None) -> Tensor:
        """float64 uniforms in (0, 1) with 53 random bits: [n, length] for one key, [n, len(keys), length] for a
        list (or a long tensor) of keys (one hash call), element (r, key, i) keyed by (seed of row `rows[r]`, all
        rows when None, key, position i < 2^32)."""
        one = isinstance(keys, int)
        if isinstance(keys, Tensor):  # keys on the device (a captured step's): no host value
            key = keys.reshape(-1)
        else:
            key = torch.as_tensor([keys] if one else list(keys), dtype=torch.long, device=self.device)
        counter = (key[:, None] << 32) + torch.arange(int(length), device=self.device)
        base = self.base if rows is None else self.base[rows]
        z = _splitmix(base[:, None, None] ^ (counter * _GOLDEN))
        u = ((z >> 11) & (2**53 - 1)).double().add_(0.5).mul_(2.0**-53)
        return u[:, 0] if one else u


def inverse_cdf(log_probs: Tensor, u: Tensor) -> Tensor:
    """y ~ Categorical(softmax(log_probs)) over the last axis by inversion of the CDF at the uniform u (one per
    distribution, shape log_probs.shape[:-1]), in float64; log_probs may be unnormalised and contain −inf, and a
    token of probability 0 is never drawn."""
    lp = log_probs.double()
    cdf = (lp - lp.amax(-1, keepdim=True)).exp().cumsum(-1)
    total = cdf[..., -1:]
    target = torch.minimum(u.unsqueeze(-1) * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True).squeeze(-1)


def row_streams(generator, batch_size: int, device) -> RowStreams:
    """`generator` itself when it is a `RowStreams` of `batch_size` rows, else streams drawn from it."""
    if isinstance(generator, RowStreams):
        if len(generator) != int(batch_size):
            raise ValueError(f"{len(generator)} row streams for a batch of {batch_size}")
        return generator
    return RowStreams.from_generator(generator, batch_size, device)


def adjust_log_probs(logits: Tensor, temperature: float = 1.0, top_p: float = 1.0) -> Tensor:
    """log m ∝ logits / T, then nucleus truncation: keep the smallest most-likely set with mass ≥ top_p and
    renormalise. Returns float64 log-probabilities over the last axis."""
    lp = logits.double()
    lp = torch.log_softmax(lp if temperature == 1.0 else lp / temperature, dim=-1)  # x / 1 is x, bit for bit
    if top_p < 1.0:
        sorted_lp, order = lp.sort(dim=-1, descending=True)
        p = sorted_lp.exp()
        # A token is dropped when the tokens ranked above it already hold ≥ top_p; the top token never is.
        drop_sorted = (p.cumsum(-1) - p) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        lp = torch.log_softmax(lp.masked_fill(drop, -torch.inf), dim=-1)
    return lp


def jump_prob(path: ProbabilityPath, t: Tensor, s: Tensor) -> Tensor:
    """λ_{t→s} = (α_s − α_t)/(1 − α_t) for s > t (MATH.md §0): the probability that a still-unresolved token is
    resolved by s, i.e. the exact value of 1 − exp(−∫_t^s κ). Delegates to `path.jump_prob`."""
    return path.jump_prob(t, s)


def pinned_positions(fixed, values, batch_size: int, length: int, vocab_size: int, device, *,
                     checked: bool = False) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(fixed [B, L] bool, values [B, L] long) on `device`: nothing pinned when both are None, broadcast otherwise;
    pinned values must be clean tokens (a read of the device; `checked`: the caller has checked them)."""
    B, L, V = int(batch_size), int(length), int(vocab_size)
    if (fixed is None) != (values is None):
        raise ValueError("fixed and values go together")
    if fixed is None:
        fixed = torch.zeros(B, L, dtype=torch.bool, device=device)
        values = torch.zeros(B, L, dtype=torch.long, device=device)
    fixed = torch.as_tensor(fixed, dtype=torch.bool, device=device).expand(B, L)
    values = torch.as_tensor(values, dtype=torch.long, device=device).expand(B, L)
    if not checked and fixed.any() and not ((values[fixed] >= 0) & (values[fixed] < V)).all():
        raise ValueError(f"fixed values must be clean tokens in [0, {V})")
    return fixed, values


def prefix_condition(prompt: Tensor, batch_size: int, length: int) -> tuple[Tensor, Tensor]:
    """(`fixed`, `values`) [B, L] that pin the first P positions to `prompt` ([P] or [B, P])."""
    prompt = torch.as_tensor(prompt, dtype=torch.long)
    if prompt.dim() == 1:
        prompt = prompt.unsqueeze(0).expand(batch_size, -1)
    if prompt.dim() != 2 or prompt.shape[0] != batch_size or prompt.shape[1] > length:
        raise ValueError(
            f"prompt of shape {tuple(prompt.shape)} does not fit batch {batch_size} x length {length}"
        )
    P = prompt.shape[1]
    values = torch.zeros(batch_size, length, dtype=torch.long, device=prompt.device)
    values[:, :P] = prompt
    fixed = torch.zeros(batch_size, length, dtype=torch.bool, device=prompt.device)
    fixed[:, :P] = True
    return fixed, values
