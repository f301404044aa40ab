"""Right-context n-gram candidates for AR distillation (MATH.md §5.4, `alg:topk_ngram_log_density_ratio`).

p(x^i = y | x^{i+1 : i+c}) = n(y, x^{i+1:i+c}) / n(x^{i+1:i+c}), counted from training rows [N, L] for every
context length c = 0..N−1 (c = 0 is the unigram). A row's context is cut at the row's end, so the counts see
the same truncated contexts the student's sequences have. Queries use the longest context available at i that
occurs in the counts and back off to shorter ones; `topk` fills K candidates in that order (most frequent
first within a context), skipping repeats. The candidates cover tokens that fit the *future* context but are
unlikely given the past, which the AR teacher's own Top-K misses.

Storage: one table per c — sorted context keys, segment offsets, tokens (by count, descending) and counts —
so a batch is looked up with `searchsorted`; `save` / `load` write one safetensors file (atomic rename).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from tcsm.storage.fileio import atomic_path
from tcsm.targets.ar import first_occurrence

__all__ = ["NGRAM_FORMAT", "NgramTable", "RightContextNgram"]

NGRAM_FORMAT = "tcsm-right-context-ngram-1"


@dataclass
class NgramTable:
    """Counts for one context length c: context keys Σ_{j=1..c} x^{i+j} V^{j−1}, sorted and unique [M];
    `offsets` [M+1] delimit each context's entries in `tokens` / `counts` [E] (count descending, id ascending)."""

    keys: Tensor
    offsets: Tensor
    tokens: Tensor
    counts: Tensor

    def lookup(self, key: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(found, segment start, segment length) for context keys of any shape."""
        if self.keys.numel() == 0:
            zero = torch.zeros_like(key)
            return torch.zeros_like(key, dtype=torch.bool), zero, zero
        idx = torch.searchsorted(self.keys, key).clamp_max(self.keys.numel() - 1)
        found = self.keys[idx] == key
        start = self.offsets[idx]
        length = torch.where(found, self.offsets[idx + 1] - start, torch.zeros_like(start))
        return found, start, length


def _context_keys(x: Tensor, c: int, vocab_size: int) -> Tensor:
    """Key of x^{i+1:i+c} for i = 0..L−1−c: [N, L−c] (key 0 for c = 0)."""
    n = x.shape[1] - c
    key = torch.zeros(x.shape[0], n, dtype=torch.long, device=x.device)
    for j in range(c, 0, -1):  # Horner: the nearest token has weight V^0
        key = key * vocab_size + x[:, j : j + n]
    return key


class RightContextNgram:
    """Counts n(y, x^{i+1:i+c}) for c = 0..order−1 and the backed-off Top-K candidates (module docstring)."""

    def __init__(self, order: int, vocab_size: int, tables: Sequence[NgramTable], rows: int = 0):
        self.order, self.vocab_size, self.rows = int(order), int(vocab_size), int(rows)
        self.tables = list(tables)
        if len(self.tables) != self.order:
            raise ValueError(f"an order-{order} n-gram needs {order} tables, got {len(self.tables)}")

    @staticmethod
    def check_order(order: int, vocab_size: int) -> None:
        """An int64 key must hold a context and its token: V^order < 2^62."""
        if int(order) < 1:
            raise ValueError(f"the n-gram order N must be >= 1 (N−1 context tokens), got {order}")
        if int(order) * math.log2(max(2, int(vocab_size))) >= 62:
            raise ValueError(f"n-gram order {order} is too large for a {vocab_size}-token vocabulary (V^N >= 2^62)")

    @classmethod
    @torch.no_grad()
    def fit(cls, rows: Tensor, order: int, vocab_size: int) -> RightContextNgram:
        """Count every (context, token) pair of `rows` [N, L] (ids < vocab_size) for c = 0..order−1 (§5.4)."""
        cls.check_order(order, vocab_size)
        x = torch.as_tensor(rows).long().cpu()
        if x.dim() != 2:
            raise ValueError(f"rows must be [N, L], got shape {tuple(x.shape)}")
        if x.numel() and (int(x.min()) < 0 or int(x.max()) >= vocab_size):
            raise ValueError(f"token ids must lie in [0, {vocab_size})")
        V = int(vocab_size)
        tables = []
        for c in range(int(order)):
            n = x.shape[1] - c
            if n <= 0:
                empty = torch.zeros(0, dtype=torch.long)
                tables.append(NgramTable(empty, torch.zeros(1, dtype=torch.long), empty, empty))
                continue
            pair = (_context_keys(x, c, V) * V + x[:, :n]).reshape(-1)
            uniq, counts = torch.unique(pair, return_counts=True)  # sorted by (context, token)
            ctx, tok = uniq // V, uniq % V
            # Count descending inside each context; stable sorts keep ids ascending among equal counts.
            by_count = torch.argsort(-counts, stable=True)
            perm = by_count[torch.argsort(ctx[by_count], stable=True)]
            ctx, tok, counts = ctx[perm], tok[perm], counts[perm]
            keys, per_ctx = torch.unique_consecutive(ctx, return_counts=True)
            offsets = torch.cat([torch.zeros(1, dtype=torch.long), per_ctx.cumsum(0)])
            tables.append(NgramTable(keys, offsets, tok, counts))
        return cls(order, V, tables, rows=x.shape[0])

    # --- queries ---------------------------------------------------------------------------------------

    def count(self, token: int, context: Sequence[int] = ()) -> int:
        """n(x^i = token, x^{i+1:i+c} = context), c = len(context) < order."""
        c = len(context)
        if c >= self.order:
            raise ValueError(f"an order-{self.order} n-gram has contexts of at most {self.order - 1} tokens")
        key = torch.tensor([[0, *context]], dtype=torch.long)
        found, start, length = self.tables[c].lookup(_context_keys(key, c, self.vocab_size)[:, 0])
        if not bool(found[0]):
            return 0
        seg = slice(int(start[0]), int(start[0] + length[0]))
        hit = (self.tables[c].tokens[seg] == int(token)).nonzero()
        return int(self.tables[c].counts[seg][hit[0, 0]]) if hit.numel() else 0

    def _segments(self, x: Tensor):
        """For c = order−1..0: (c, found [B, L−c], start, length) of the context at every position it fits."""
        x = x.long().to(self.tables[0].keys.device)
        for c in range(self.order - 1, -1, -1):
            if x.shape[1] - c > 0:
                yield c, *self.tables[c].lookup(_context_keys(x, c, self.vocab_size))

    @torch.no_grad()
    def log_probs(self, x: Tensor) -> Tensor:
        """log p(x^i = · | longest seen context x^{i+1:i+c}) [B, L, V], dense (for small V and tests)."""
        B, L = x.shape
        dev = self.tables[0].keys.device
        out = torch.full((B, L, self.vocab_size), -math.inf, dtype=torch.float64, device=dev)
        done = torch.zeros(B, L, dtype=torch.bool, device=dev)
        for c, found, start, length in self._segments(x):
            n = L - c
            use = found & ~done[:, :n]
            for b, i in use.nonzero().tolist():
                s, e = int(start[b, i]), int(start[b, i] + length[b, i])
                cnt = self.tables[c].counts[s:e].double()
                out[b, i, self.tables[c].tokens[s:e]] = (cnt / cnt.sum()).log()
            done[:, :n] |= use
        return out

    @torch.no_grad()
    def topk(self, x: Tensor, k: int) -> Tensor:
        """K candidate ids [B, L, k] per position: the most frequent tokens after the longest seen right context,
        then after shorter ones, without repeats; −1 where fewer than k tokens were ever seen (§5.4)."""
        B, L = x.shape
        k = int(k)
        dev = self.tables[0].keys.device
        ar = torch.arange(k, device=dev)
        blocks = []
        for c, found, start, length in self._segments(x):
            table = self.tables[c]
            take = (start.unsqueeze(-1) + ar).clamp_max(max(0, table.tokens.numel() - 1))
            ok = ar < length.unsqueeze(-1)
            toks = torch.where(ok, table.tokens[take] if table.tokens.numel() else take, torch.full_like(take, -1))
            block = torch.full((B, L, k), -1, dtype=torch.long, device=dev)
            block[:, : L - c] = toks
            blocks.append(block)
        allc = torch.cat(blocks, dim=-1)  # priority order: longest context first
        keep = first_occurrence(allc)
        rank = keep.long().cumsum(-1) - 1
        keep &= rank < k
        out = torch.full((B, L, k + 1), -1, dtype=torch.long, device=dev)  # slot k collects everything not kept
        out.scatter_(-1, torch.where(keep, rank, torch.full_like(rank, k)), torch.where(keep, allc, -1))
        return out[..., :k].to(x.device)

    def to(self, device) -> RightContextNgram:
        """Move the tables (lookups then run where the sequences are)."""
        self.tables = [NgramTable(*(getattr(t, n).to(device) for n in ("keys", "offsets", "tokens", "counts"))) for t in self.tables]
        return self

    # --- storage ---------------------------------------------------------------------------------------

    def state(self) -> tuple[dict[str, Tensor], dict[str, str]]:
        tensors = {}
        for c, t in enumerate(self.tables):
            for name in ("keys", "offsets", "tokens", "counts"):
                tensors[f"c{c}.{name}"] = getattr(t, name).contiguous().cpu()
        meta = {"format": NGRAM_FORMAT, "order": str(self.order), "vocab_size": str(self.vocab_size), "rows": str(self.rows)}
        return tensors, meta

    def save(self, path: str | os.PathLike, info: dict | None = None) -> Path:
        """Write one safetensors file (tables + metadata, `info` as JSON), atomically: a reader sees the old
        file or the new one, never a partial write."""
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors, meta = self.state()
        meta["info"] = json.dumps(info or {}, sort_keys=True)
        with atomic_path(path) as tmp:
            save_file(tensors, str(tmp), metadata=meta)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> tuple[RightContextNgram, dict]:
        """(n-gram, the `info` it was saved with); ValueError naming the file if it is not a readable n-gram."""
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                if meta.get("format") != NGRAM_FORMAT:
                    raise ValueError(f"{str(path)!r} is not a tcsm n-gram file (format {meta.get('format')!r})")
                order = int(meta["order"])
                tables = [
                    NgramTable(*(f.get_tensor(f"c{c}.{n}") for n in ("keys", "offsets", "tokens", "counts")))
                    for c in range(order)
                ]
            return cls(order, int(meta["vocab_size"]), tables, int(meta.get("rows", 0))), json.loads(meta.get("info", "{}"))
        except ValueError:
            raise
        except Exception as e:  # noqa: BLE001 (safetensors raises its own error types for corrupt files)
            raise ValueError(f"cannot read the n-gram file {str(path)!r}: {type(e).__name__}: {e}") from None

    def __repr__(self) -> str:
        sizes = [int(t.keys.numel()) for t in self.tables]
        return f"RightContextNgram(order={self.order}, V={self.vocab_size}, rows={self.rows}, contexts={sizes})"
