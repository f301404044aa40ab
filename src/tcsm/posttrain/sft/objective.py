"""The instruction fine-tuning objective: the composed TCSM objective on prompt-conditioned batches (their
`cond_mask` pins the prompt: never noised, never scored), and as its validation metric the likelihood bound of each
completion given its prompt (MATH.md §2.4 with the prompt positions clean at every t)."""

from __future__ import annotations

from dataclasses import replace

import torch

from tcsm.core.batch import as_batch
from tcsm.core.results import summarise_nats
from tcsm.evaluation.likelihood import nelbo_terms
from tcsm.models.modes import eval_mode
from tcsm.paths.bounds import resolve_bound

__all__ = ["SFTObjective"]


class SFTObjective:
    """`objective(model, batch, generator, **kw)` is `inner`'s; `evaluate` is the completion | prompt bound
    (`nelbo_terms` with the prompt as its `cond_mask`)."""

    def __init__(self, inner, path, eval_num_t: int = 4, bound: str | None = None, normalize: str = "length",
                 t_max: float | None = None):  # fmt: skip
        if int(eval_num_t) < 1:
            raise ValueError(f"eval_num_t must be >= 1, got {eval_num_t}")
        if normalize not in ("length", "response"):
            raise ValueError(f"normalize must be 'length' or 'response', got {normalize!r}")
        self.inner, self.path, self.eval_num_t, self.normalize = inner, path, int(eval_num_t), normalize
        self.bound = resolve_bound(path, bound)
        self.t_max = None if t_max is None else float(t_max)  # the stopped reversal's bound (MATH.md §9)

    def __call__(self, model, batch, generator=None, **kwargs):
        """`inner`'s loss; with normalize="response" each sequence is weighted by L / L_response, so its loss is per
        response token (LLaDA's SFT normaliser) instead of per position of the sequence."""
        batch = as_batch(batch)
        if self.normalize == "response" and batch.cond_mask is not None:
            L = batch.x1.shape[1]
            w = L / (L - batch.cond_mask.sum(-1)).clamp_min(1).to(torch.float32)
            batch = replace(batch, weight=w if batch.weight is None else batch.weight * w)
        return self.inner(model, batch, generator, **kwargs)

    def to(self, device) -> SFTObjective:
        if hasattr(self.inner, "to"):
            self.inner = self.inner.to(device)
        return self

    @torch.no_grad()
    def evaluate(self, model, data, *, batch_size: int = 64, generator=None, device=None, **_) -> dict:
        """E_t[w(t) G(t, x_t)] per record at `eval_num_t` stratified times with the prompt pinned, in nats per
        completion token (padding included: it is part of the response); for the masked source the prompt positions
        contribute nothing, so this is the NELBO of the completion given the prompt."""
        rows = data.to_batch() if hasattr(data, "to_batch") else as_batch(data)
        device = rows.x1.device if device is None else torch.device(device)
        N, L = rows.x1.shape
        K = self.eval_num_t
        nats = []
        with eval_mode(model):
            for s in range(0, N, int(batch_size)):
                x1 = rows.x1[s : s + batch_size].to(device)
                cond = None if rows.cond_mask is None else rows.cond_mask[s : s + batch_size].to(device)
                terms = nelbo_terms(model, x1, self.path, num_t=K, generator=generator, bound=self.bound, cond_mask=cond,
                                    t_max=self.t_max)  # fmt: skip
                total = terms.double().mean(0)
                scored = L - (cond.sum(-1) if cond is not None else 0)
                nats.append((total / torch.as_tensor(scored, device=device).clamp_min(1)).cpu())
        stop = "" if self.t_max is None else f"@t_max={self.t_max:g}"
        return summarise_nats(torch.cat(nats), L, f"{self.bound}{stop}, completion | prompt")

    def __repr__(self) -> str:
        return f"SFTObjective({self.inner!r}, eval_num_t={self.eval_num_t})"
