"""The decode engine: a decoder's per-call network work at static shapes, captured as one CUDA graph per shape.

A decoder that calls its network hundreds of times with small inputs spends its time launching kernels on the host,
not running them. The engine removes that cost where the shapes allow it: the caches are preallocated once per decode
and written in place (`CausalLM.new_cache`, `BlockDenoiser.new_cache(..., fixed_shape=True)`), every call reads its
position from a device tensor instead of a Python int, and so one captured graph (`StepGraph`) replays every call of
a decode. Nothing in the loop reads a device value on the host.

`sample.engine` picks it: `auto` (graphs on CUDA, eager elsewhere), `eager`, or `graph` (on CPU: the same
fixed-shape calls run eagerly on static buffers, which is how the tests check the graph path's arithmetic). The
eager path on CPU is the fixed-position path of before, without concatenating caches, and draws the same tokens.
`autocast_weight_cache` keeps the casts of the weights that bf16 autocast makes for one call alive for the whole
decode instead of redoing them in every call whose autocast region opens and closes around it."""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch import Tensor

from tcsm.sampling.common import inverse_cdf, row_streams

__all__ = ["ENGINES", "StepGraph", "autocast_weight_cache", "decode_ar", "resolve_engine"]

ENGINES = ("auto", "eager", "graph")


def resolve_engine(engine: str | None, device) -> str:
    """"eager" or "graph" for a `sample.engine` value on `device` (auto: graph on CUDA only)."""
    engine = "auto" if engine is None else str(engine)
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {list(ENGINES)}, got {engine!r}")
    if engine == "auto":
        return "graph" if torch.device(device).type == "cuda" else "eager"
    return engine


@contextlib.contextmanager
def autocast_weight_cache():
    """Hold autocast's cast cache open for the block: PyTorch drops the cached bf16 copies of the weights whenever
    the outermost autocast region closes, so a decoder whose every call opens its own region re-casts every weight
    in every call. One level of autocast nesting held here keeps them until the decode ends."""
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()


class StepGraph:
    """`fn(*inputs)` replayed from one CUDA graph per input shape: the inputs are copied into static buffers, the
    graph replays, and the outputs are the graph's static outputs (valid until the next call). The first call of a
    shape warms up on a side stream and captures; `fn` must be idempotent for equal inputs (the warm-up calls run it
    on the same inputs) but for the tensors it updates in place named in `preserve`, which are restored after the
    warm-up (a decoder's state carried from call to call). Off CUDA, `fn` runs eagerly on the static buffers. A
    capture that fails falls back to eager calls with a warning when `strict` is False (`sample.engine=auto`)."""

    def __init__(self, fn, device, *, strict: bool = False, warmup: int = 2, preserve: tuple[Tensor, ...] = ()):
        self.fn, self.device, self.strict, self.warmup = fn, torch.device(device), bool(strict), int(warmup)
        self.preserve = tuple(preserve)
        self._entries: dict[tuple, tuple] = {}
        self.captures = 0

    def __call__(self, *inputs: Tensor):
        key = tuple((tuple(t.shape), t.dtype) for t in inputs)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = self._capture(inputs)
        static, graph, out = entry
        for s, t in zip(static, inputs):
            if s is not t:
                s.copy_(t)
        if graph is None:
            return self.fn(*static)
        graph.replay()
        return out

    def _capture(self, inputs):
        static = tuple(t.clone() for t in inputs)
        if self.device.type != "cuda":
            return static, None, None
        try:
            saved = [t.clone() for t in self.preserve]
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(self.warmup):
                    self.fn(*static)
                for t, v in zip(self.preserve, saved):
                    t.copy_(v)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            # cached weight casts made inside a capture would live in the graph's pool and be freed under it
            on = torch.is_autocast_enabled("cuda")
            dtype = torch.get_autocast_dtype("cuda")
            with torch.cuda.graph(graph), torch.autocast("cuda", dtype=dtype, enabled=on, cache_enabled=False):
                out = self.fn(*static)
        except Exception as e:  # any capture failure leaves the eager path, which is exact
            if self.strict:
                raise
            warnings.warn(f"CUDA graph capture failed ({type(e).__name__}: {e}); decoding eagerly", stacklevel=3)
            return static, None, None
        self.captures += 1
        return static, graph, out


@torch.no_grad()
def decode_ar(model, x: Tensor, P: int, generator, adjust=None, *, engine: str = "auto") -> Tensor:
    """Fill x [N, L] (x^{<P} given) left to right from an AR model with a static cache (`new_cache` / `decode`):
    the prompt [BOS, x^{<P}] in one call, then one token per call, x^j ~ softmax(logits) (or the log-probabilities
    `adjust(logits)`) drawn from each row's stream (`generator`: `RowStreams` or a torch.Generator they are drawn
    from) keyed by j, as `tcsm.targets.ar.sample_ar` draws. With the graph engine the per-token call has fixed
    shapes (position as a device tensor) and replays one captured graph. A row's arithmetic does not depend on the
    batch it shares: the model's `decode` runs its linears per sequence (`models.causal._per_sequence`)."""
    N, L = x.shape
    u = row_streams(generator, N, x.device).uniform(0, L)  # x^j of row r: drawn at the uniform keyed (r's seed, j)
    if P >= L:
        return x
    mode = resolve_engine(engine, x.device)
    with autocast_weight_cache():
        cache = model.new_cache(N, x.device)
        bos = torch.full((N, 1), int(model.bos_id), dtype=torch.long, device=x.device)
        logits = model.decode(torch.cat([bos, x[:, :P]], 1), cache)[:, -1]
        step = None
        if mode == "graph":
            position = torch.full((1,), P + 1, dtype=torch.long, device=x.device)  # after [BOS, x^{<P}]
            graph = StepGraph(lambda tok, pos: model.decode(tok, cache, position=pos)[:, -1], x.device,
                              strict=engine == "graph")  # fmt: skip

            def step(tok):
                out = graph(tok, position)
                position.add_(1)
                return out

        for j in range(P, L):
            lp = torch.log_softmax(logits.double(), dim=-1) if adjust is None else adjust(logits)
            x[:, j] = inverse_cdf(lp, u[:, j])
            if j + 1 < L:
                tok = x[:, j : j + 1]
                logits = model.decode(tok, cache)[:, -1] if step is None else step(tok)
    return x
