"""An n-gram drafter for speculative decoding of AR models (MATH.md §6.4): the next-token law of a back-off n-gram
model counted on token sequences (the target's training data), a table lookup per draft instead of a network pass.

q(· | h) is built from the shortest context up: the add-one unigram, then for c = 1..order−1, when the last c
tokens of h were seen, q_c = (counts_c(·) + β·q_{c−1}) / (n_c + β) (a Dirichlet back-off with strength β). Positions
before a sequence's start read a pad symbol, as the AR model reads BOS there. Any q keeps speculative decoding
exact; a q close to the target's only saves passes.
"""

from __future__ import annotations

import bisect

import torch
from torch import Tensor

from tcsm.sampling.common import adjust_log_probs
from tcsm.sampling.speculative import draft_left_to_right

__all__ = ["NGramDraft"]


class NGramDraft:
    """`NGramDraft(sequences [N, L], vocab_size, order)`: the counts of every context of 1..order−1 tokens."""

    needs_memo = False
    left_to_right = True

    def __init__(self, sequences: Tensor, vocab_size: int, order: int = 4, strength: float = 1.0):
        self.V, self.order, self.strength = int(vocab_size), int(order), float(strength)
        if self.order < 1:
            raise ValueError(f"an n-gram drafter's order must be >= 1, got {order}")
        if (self.V + 1) ** self.order >= 2**62:
            raise ValueError(f"order {order} over {vocab_size} tokens overflows the 64-bit context keys")
        self.tables = self._count(sequences.long())
        self._memo: dict = {}  # batch 1: q by its context, drawn on the host
        self._floats: dict = {}  # batch 1: a memoised q as host floats (log q of a draft without a tensor read)

    def _count(self, seq: Tensor) -> dict[str, Tensor]:
        N, L = seq.shape
        if (seq < 0).any() or (seq >= self.V).any():
            raise ValueError(f"n-gram counts need token ids in [0, {self.V}), got {int(seq.min())}..{int(seq.max())}")
        tables = {"unigram": torch.bincount(seq.flatten(), minlength=self.V).double()}
        padded = torch.cat([torch.full((N, self.order), self.V, dtype=torch.long), seq], 1)
        nxt = seq.flatten()
        for c in range(1, self.order):
            key = torch.zeros(N, L, dtype=torch.long)
            for i in range(c):  # the c tokens before each position, oldest first
                key = key * (self.V + 1) + padded[:, self.order - c + i : self.order - c + i + L]
            pair, count = torch.unique(key.flatten() * self.V + nxt, return_counts=True)  # sorted by (context, token)
            ctx, per = torch.unique_consecutive(pair // self.V, return_counts=True)
            tables[f"keys{c}"] = ctx
            tables[f"ptr{c}"] = torch.cat([torch.zeros(1, dtype=torch.long), per.cumsum(0)])
            tables[f"next{c}"] = pair % self.V
            tables[f"count{c}"] = count.double()
        return tables

    def log_q(self, x: Tensor, p: Tensor) -> Tensor:
        """log q(· | x^{<p}) [N, V] for rows x [N, L] (known before p) at positions p [N]."""
        N, dev = x.shape[0], x.device
        t = self.tables
        uni = t["unigram"].to(dev) + 1.0
        q = (uni / uni.sum()).expand(N, self.V).clone()
        key = torch.zeros(N, dtype=torch.long, device=dev)
        scale = 1
        for c in range(1, self.order):
            j = p - c
            tok = torch.where(j >= 0, x.gather(1, j.clamp_min(0).unsqueeze(1)).squeeze(1), self.V)
            key = key + tok * scale  # the newest token is the lowest digit, as `_count` builds it
            scale *= self.V + 1
            keys, ptr = t[f"keys{c}"].to(dev), t[f"ptr{c}"].to(dev)
            at = torch.searchsorted(keys, key).clamp_max(keys.numel() - 1)
            seen = keys[at] == key
            lo, hi = ptr[at], torch.where(seen, ptr[at + 1], ptr[at])
            n = hi - lo
            counts = torch.zeros(N, self.V, dtype=torch.float64, device=dev)
            if int(n.sum()):
                row = torch.repeat_interleave(torch.arange(N, device=dev), n)
                off = torch.arange(int(n.sum()), device=dev) - torch.repeat_interleave(n.cumsum(0) - n, n)
                e = torch.repeat_interleave(lo, n) + off
                counts.index_put_((row, t[f"next{c}"].to(dev)[e]), t[f"count{c}"].to(dev)[e], accumulate=True)
            total = counts.sum(-1, keepdim=True)
            q = torch.where(seen.unsqueeze(1), (counts + self.strength * q) / (total + self.strength), q)
        return q.log()

    def precompute(self, temperature: float = 1.0, top_p: float = 1.0, limit: int = 2**22) -> int:
        """Fill the batch-1 memo with q of every context of the longest order seen in the counts, in one batched
        lookup, when they hold at most `limit` numbers (contexts × V); the number of contexts filled."""
        c = self.order - 1
        if c < 1:
            return 0
        keys = self.tables[f"keys{c}"]
        if keys.numel() * self.V > limit:
            return 0
        digits = torch.stack([(keys // (self.V + 1) ** i) % (self.V + 1) for i in range(c - 1, -1, -1)], 1)
        pads = (digits == self.V).sum(1)  # pads only lead (a context cut at the sequence's start)
        ctx = torch.zeros(keys.numel(), c + 1, dtype=torch.long)
        for n_pad in range(c + 1):  # the tokens from position 0, then the position they precede
            sel = pads == n_pad
            ctx[sel, : c - n_pad] = digits[sel, n_pad:]
        lp = adjust_log_probs(self.log_q(ctx, c - pads), float(temperature), float(top_p))
        cum = lp.exp().cumsum(1).tolist()
        for i, (row, n_pad) in enumerate(zip(digits.tolist(), pads.tolist())):
            self._memo[(float(temperature), float(top_p), c - n_pad, *row[n_pad:])] = (lp[i], cum[i])
        return keys.numel()

    def _key(self, row: list[int], p: int, shape) -> tuple:
        lo = max(0, p - self.order + 1)
        return (shape.temperature, shape.top_p, p - lo, *row[lo:p])

    def _one(self, row: list[int], p: int, shape, device) -> tuple[Tensor, list[float]]:
        """(adjusted log q [V], its cumulative sums) of one row at position p, memoised by the context."""
        lo = max(0, p - self.order + 1)
        key = self._key(row, p, shape)
        hit = self._memo.get(key)
        if hit is None:
            ctx = torch.tensor([[*row[lo:p], 0]], device=device)
            lp = shape.log_probs(self.log_q(ctx, torch.tensor([p - lo], device=device)))[0]
            hit = self._memo[key] = (lp, lp.exp().cumsum(0).tolist())
        return hit

    def _propose_one(self, x, pos, valid, shape, generator, stats):
        """`propose` for one sequence: `draft_one` at its live positions (a prefix of the k slots)."""
        k = pos.shape[1]
        live = valid[0].tolist()
        n = live.index(False) if False in live else k
        ys, qs, _ = self.draft_one(x[0].tolist(), pos[0, :n].tolist(), k, shape, generator, stats, x.device)
        lq = torch.zeros(1, k, shape.V, dtype=torch.float64, device=x.device)
        if qs:
            lq[0, :n] = torch.stack(qs)
        return torch.tensor([ys + [0] * (k - n)], device=x.device), lq, valid

    def draft_one(self, row: list[int], at: list[int], k: int, shape, generator, stats, device=None):
        """Drafts of one host row at the positions `at`, left to right (each from the memoised q of its context, the
        earlier drafts filled in, by its inverse CDF; k uniforms drawn, the first len(at) used): (drafts, their
        log q rows [V], log q of each draft as a float). The host round of `tcsm.sampling.speculative` at batch 1."""
        row = list(row)
        u = torch.rand(k, dtype=torch.float64, generator=generator).tolist()
        y, qs, qy = [], [], []
        for m, p in enumerate(at):
            key = self._key(row, p, shape)
            lp, cum = self._one(row, p, shape, device)
            d = row[p] = min(bisect.bisect_right(cum, u[m] * cum[-1]), shape.V - 1)
            y.append(d)
            qs.append(lp)
            floats = self._floats.get(key)
            if floats is None:
                floats = self._floats[key] = lp.tolist()
            qy.append(floats[d])
        stats.counts["draft_calls"] += len(at)
        stats.counts["draft_rows"] += len(at)
        return y, qs, qy

    # the drafter protocol of `tcsm.sampling.speculative`
    def reset(self, B, device):
        pass

    def propose(self, x, pos, valid, lo, shape, generator, stats):
        """Drafts left to right, each from its context with the earlier drafts filled in (as `CausalDraft`)."""
        if pos.shape[0] == 1:
            return self._propose_one(x, pos, valid, shape, generator, stats)
        return draft_left_to_right(x, pos, valid, shape, generator, stats, lambda xr, rows, p, live: self.log_q(xr, p))
