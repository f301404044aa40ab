"""An AR model's static KV cache that follows a sequence being drafted and verified (speculative decoding, MATH.md
§6.4): each call asks for the next-token outputs at some positions of the current sequence, and the cache first
rolls back to the longest prefix of inputs it holds that the sequence still has (a rejected draft, and everything
after it, drops out), then feeds only the inputs from there on. The model brings the cache (`new_cache` /
`decode`, `tcsm.models.causal.CausalLM`); nothing here is specific to one model class.

Input position j holds x^{j−1} (BOS at j = 0) and its output is the conditional of x^j. At batch 1 a call is one
prefill of the new inputs against the kept prefix (the cache's `length` rolled back); with several rows each row
starts at its own position (`decode(..., position=[N])`), the rows padded to a common width with scratch positions
past their own that no kept output reads.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["RollbackCache", "has_static_cache"]


def has_static_cache(model) -> bool:
    """Whether `model` decodes against a static KV cache (`new_cache` / `decode`, as `targets.ar.sample_ar` asks)."""
    return hasattr(model, "new_cache") and hasattr(model, "decode")


class RollbackCache:
    """The static cache of `model` for `batch` rows of length `length`; `outputs(x, first, last)` gives the logits of
    positions first..last of each row of x, recomputing only the inputs that changed since the last call."""

    def __init__(self, model, batch: int, length: int, device):
        self.model, self.B, self.L = model, int(batch), int(length)
        capacity = 2 * self.L + 1  # scratch positions of a padded row stay below start + width ≤ 2L
        self.cache = model.new_cache(self.B, device, capacity=capacity)
        self.fed = torch.full((self.B, capacity), -1, dtype=torch.long, device=device)  # input ids held
        self.valid = torch.zeros(self.B, dtype=torch.long, device=device)  # positions held that are still valid
        self.bos = int(model.bos_id)
        self.passes = 0
        self._fed_one: list[int] = []  # batch 1: the ids held, as host ints (no tensor bookkeeping per pass)

    def outputs(self, x: Tensor, first: Tensor, last: Tensor) -> tuple[Tensor, Tensor]:
        """(logits [B, W, V'], start [B]): logits[r, s] is the output at position start[r] + s of row r of x [B, L]
        (ids ≥ the vocabulary: unknown yet, never read before position last[r]), for s ≤ last[r] − start[r];
        start[r] ≤ first[r]. A row with last < first asks for nothing. W = 0: nothing was asked."""
        if self.B == 1:
            return self._outputs_one(x, int(first[0]), int(last[0]))
        ids = torch.cat([torch.full_like(x[:, :1], self.bos), x[:, :-1]], 1)
        width_in = ids.shape[1]
        same = (self.fed[:, :width_in] == ids).long().cumprod(1).sum(1)
        asking = last >= first
        # a row that asks nothing keeps its prefix: its scratch positions go past it
        start = torch.where(asking, torch.minimum(torch.minimum(same, self.valid), first), self.valid)
        count = torch.where(asking, last - start + 1, torch.zeros_like(start))
        W = int(count.max())
        if W == 0:
            return x.new_zeros((self.B, 0, 0), dtype=torch.float32), start
        self.passes += 1
        at = start.unsqueeze(1) + torch.arange(W, device=x.device)  # [B, W]; past count[r]: scratch
        tok = ids.gather(1, at.clamp_max(width_in - 1))
        logits = self.model.decode(tok, self.cache, position=start)
        self.fed.scatter_(1, at, tok)
        self.valid = start + count
        return logits, start

    def _outputs_one(self, x: Tensor, first: int, last: int) -> tuple[Tensor, Tensor]:
        """`outputs` of one row: `outputs_list` of its ids."""
        if last < first:
            return x.new_zeros((1, 0, 0), dtype=torch.float32), x.new_full((1,), len(self._fed_one))
        logits, start = self.outputs_list(x[0, :last].tolist(), first, last)
        return logits, x.new_full((1,), start)

    def outputs_list(self, ids: list[int], first: int, last: int) -> tuple[Tensor, int]:
        """Batch 1 from a host row (ids < the vocabulary up to `last`): (logits [1, n, V'] of positions start..last,
        start ≤ first), one prefill of the inputs past the kept prefix (found on the host; the cache's `length`
        rolled back to it)."""
        held = self._fed_one
        fed = [self.bos, *ids[:last]]
        start, limit = 0, min(len(held), first)
        while start < limit and held[start] == fed[start]:
            start += 1
        self.passes += 1
        self.cache.length = start
        logits = self.model.decode(torch.tensor([fed[start:]], device=self.cache.keys.device), self.cache)
        self._fed_one = fed
        return logits, start
