"""How a run samples (MATH.md §6): one `SampleSettings` — the run config's `sample:` section — and `draw`, the one
place that turns (model, path, objective, settings) into samples. The trainer's logged samples and `tcsm sample`
both call `draw` with the settings the builders layer made from the run's config (`tcsm.builders.sampler`), so a
run samples the same way in training and from the command line.

An objective that brings its own sampler declares it (`tcsm.core.protocols.Samples`: SIR over an energy model, left to
right for an autoregressive model) and receives the same settings; otherwise the path samplers of
`tcsm.sampling.samplers` run."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from tcsm.core.protocols import Samples
from tcsm.sampling.common import GRIDS
from tcsm.sampling.decoding import DECODERS, decode
from tcsm.sampling.samplers import METHODS, may_cache, sample

__all__ = ["SampleSettings", "draw"]


@dataclass(frozen=True)
class SampleSettings:
    """Sampler settings. Path samplers: `steps`, `method` (None: the path's default), `grid`, `temperature`,
    `top_p`, `final_argmax`, `cache` (MDLM's cache where `may_cache` allows it). SIR (an energy model, §6.3):
    `steps`, `grid`, `sir_k` candidates per step inside the α_t window `sir_window`, selection ∝ softmax(f/T)
    with T = `sir_temperature`. Masked models also take the decoding orders of `tcsm.sampling.decoding`
    (`method` "random" | "confidence" | "margin" | "entropy" | "threshold", the last with `threshold` and at most
    `steps` steps), and
    `block_length` (semi-autoregressive blocks, any method inside a block)."""

    steps: int = 128
    method: str | None = None
    grid: str = "uniform"
    temperature: float = 1.0
    top_p: float = 1.0
    final_argmax: bool = False
    cache: bool = True
    sir_k: int = 2
    sir_window: tuple[float, float] = (0.4, 0.6)
    sir_temperature: float = 1.0
    block_length: int | None = None
    #: 0.1, not Fast-dLLM's 0.9: measured on a 27-symbol model (docs/benchmarks.md "Decoding orders"), 0.3–0.99 all
    #: reveal one position per call (the confidence order), 0.1 about six per call (64 positions in 10 calls)
    threshold: float = 0.1

    def __post_init__(self):
        lo, hi = (float(v) for v in self.sir_window)
        object.__setattr__(self, "sir_window", (lo, hi))
        checks = [
            (int(self.steps) >= 1, f"steps must be >= 1, got {self.steps}"),
            (self.method is None or self.method in METHODS + DECODERS,
             f"method must be one of {list(METHODS + DECODERS)}, got {self.method!r}"),
            (self.grid in GRIDS, f"grid must be one of {list(GRIDS)}, got {self.grid!r}"),
            (self.temperature > 0, f"temperature must be > 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (int(self.sir_k) >= 1, f"sir_k must be >= 1, got {self.sir_k}"),
            (0.0 <= lo <= hi <= 1.0, f"sir_window must be [lo, hi] with 0 <= lo <= hi <= 1, got {[lo, hi]}"),
            (self.sir_temperature > 0, f"sir_temperature must be > 0, got {self.sir_temperature}"),
            (0 < self.threshold <= 1, f"threshold must be in (0, 1], got {self.threshold}"),
            (self.block_length is None or int(self.block_length) >= 1,
             f"block_length must be >= 1 or null, got {self.block_length}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(msg)


def draw(
    model,
    path,
    num: int,
    length: int,
    settings: SampleSettings,
    *,
    objective=None,
    generator: torch.Generator | None = None,
    device=None,
    fixed: Tensor | None = None,
    values: Tensor | None = None,
    callback=None,
):
    """(tokens [num, length] or None, stats with `.method` and `.num_calls`): the objective's own sampler when it
    declares one (`Samples`; None when it has none, e.g. an MLM), else `sample` on the path with `settings`.
    `fixed` / `values` [num, length] pin positions (prompts, infilling); `callback(k, t, x)` sees each path step."""
    if isinstance(objective, Samples):
        return objective.sample(
            model, num, length, generator=generator, device=device, settings=settings, fixed=fixed, values=values
        )
    if settings.method in DECODERS or settings.block_length is not None:
        # blocks run the path sampler's law as "ancestral" (for a masked path §6.1 and §6.2 coincide)
        method = settings.method if settings.method in DECODERS else "ancestral"
        return decode(
            model, path, batch_size=num, length=length, num_steps=settings.steps, method=method,
            grid=settings.grid, temperature=settings.temperature, top_p=settings.top_p,
            threshold=settings.threshold, block_length=settings.block_length, final_argmax=settings.final_argmax,
            time_independent=settings.cache and may_cache(model, path), fixed=fixed, values=values,
            generator=generator, device=device, callback=callback,
        )  # fmt: skip
    return sample(
        model,
        path,
        batch_size=num,
        length=length,
        num_steps=settings.steps,
        method=settings.method,
        grid=settings.grid,
        temperature=settings.temperature,
        top_p=settings.top_p,
        final_argmax=settings.final_argmax,
        time_independent=settings.cache and may_cache(model, path),
        fixed=fixed,
        values=values,
        generator=generator,
        device=device,
        return_stats=True,
        callback=callback,
    )
