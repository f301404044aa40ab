"""Exact enumeration on tiny state spaces (V^L ≲ 10^4): the oracle behind the project's tests.

`EnumerableDistribution` holds p_1 as a table over all V^L sequences and computes, exactly, the objects
the library otherwise estimates: single-site conditionals p_1(y | x^{≠i}), the posterior p_{1|t}(· | x_t)
and its per-token marginals (MATH.md §1.3), an exact-posterior denoiser callable and a joint posterior
sampler. Everything goes through `path.log_kernel`, so it works for any path.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from tcsm.models.kinds import ModelKind
from tcsm.paths import ProbabilityPath


class EnumerableDistribution:
    """p_1 over {0..V−1}^L as an explicit probability table (float64)."""

    def __init__(self, probs: Tensor, vocab_size: int, length: int):
        probs = torch.as_tensor(probs, dtype=torch.float64).flatten()
        if probs.numel() != vocab_size**length:
            raise ValueError(f"probs has {probs.numel()} entries, expected V^L = {vocab_size**length}")
        if (probs < 0).any():
            raise ValueError("probs must be non-negative")
        self.probs = probs / probs.sum()
        self.vocab_size, self.length = int(vocab_size), int(length)
        self.states = torch.tensor(list(itertools.product(range(vocab_size), repeat=length)), dtype=torch.long)
        self.log_probs = torch.log(self.probs)
        self._radix = vocab_size ** torch.arange(length - 1, -1, -1)

    @classmethod
    def random(cls, vocab_size: int, length: int, seed: int = 0, concentration: float = 1.0, support=None):
        """A Dirichlet(concentration) draw; `support` (fraction in (0, 1]) zeroes the rest at random."""
        g = torch.Generator().manual_seed(seed)
        n = vocab_size**length
        gamma = torch.distributions.Gamma(torch.full((n,), float(concentration)), 1.0)
        with torch.random.fork_rng(devices=[]):  # Gamma takes no generator; leave the caller's global RNG alone
            torch.manual_seed(seed)
            p = gamma.sample().double() + 1e-12
        if support is not None:
            keep = torch.randperm(n, generator=g)[: max(1, round(support * n))]
            mask = torch.zeros(n, dtype=torch.bool)
            mask[keep] = True
            p = torch.where(mask, p, torch.zeros_like(p))
        return cls(p, vocab_size, length)

    def index(self, x: Tensor) -> Tensor:
        """Row index in `states` of each sequence x [B, L]."""
        return (x.long() * self._radix.to(x.device)).sum(-1)

    def sample(self, n: int, generator: torch.Generator | None = None) -> Tensor:
        idx = torch.multinomial(self.probs, n, replacement=True, generator=generator)
        return self.states[idx]

    def log_prob(self, x: Tensor) -> Tensor:
        return self.log_probs[self.index(x)]

    def conditionals(self, x: Tensor) -> Tensor:
        """log p_1(y | x^{≠i}) for every position i and clean y: [B, L, V] (−inf off the support)."""
        B, L = x.shape
        V = self.vocab_size
        seqs = x.unsqueeze(1).unsqueeze(1).repeat(1, L, V, 1)  # [B, L, V, L]
        pos = torch.arange(L)
        seqs[:, pos, :, pos] = torch.arange(V).expand(B, L, V).permute(1, 0, 2)
        joint = self.log_probs[self.index(seqs)]  # [B, L, V]
        return torch.log_softmax(joint, dim=-1)

    def log_posterior(self, xt: Tensor, t: Tensor, path: ProbabilityPath) -> Tensor:
        """log p_{1|t}(x_1 | x_t) for every x_1 in `states`: [B, V^L] (MATH.md §1.3)."""
        lk = path.log_kernel(xt, t.double()).double()  # [B, L, V]
        S = self.states  # [N, L]
        per_token = lk[:, torch.arange(self.length), :][:, :, S.T]  # [B, L, L, N] -> take diagonal
        per_token = per_token.diagonal(dim1=1, dim2=2).permute(0, 2, 1)  # [B, L, N]
        return torch.log_softmax(self.log_probs + per_token.sum(1), dim=-1)

    def marginals(self, xt: Tensor, t: Tensor, path: ProbabilityPath) -> Tensor:
        """p_{1|t}(x_1^i = y | x_t): [B, L, V]."""
        post = self.log_posterior(xt, t, path).exp()
        onehot = torch.nn.functional.one_hot(self.states, self.vocab_size).double()  # [N, L, V]
        return torch.einsum("bn,nlv->blv", post, onehot)

    def denoiser(self, path: ProbabilityPath, floor: float = -700.0):
        """Exact-posterior denoiser: (x_t, t) → logits = log marginals, floored so they stay finite."""

        def fn(xt: Tensor, t: Tensor) -> Tensor:
            return torch.log(self.marginals(xt, t, path)).clamp_min(floor)

        return fn

    def x1_sampler(self, path: ProbabilityPath):
        """Joint posterior draw (x_t, t, generator) → x̂_1 ~ p_{1|t}(· | x_t) [B, L], for `sample(x1_sampler=...)`
        (MATH.md §1.3, §6.2 oracle e.a)."""

        def fn(xt: Tensor, t: Tensor, generator: torch.Generator | None = None) -> Tensor:
            post = self.log_posterior(xt, t, path).exp()
            return self.states[torch.multinomial(post, 1, generator=generator).squeeze(-1)]

        return fn

    def entropy(self) -> float:
        p = self.probs[self.probs > 0]
        return float(-(p * p.log()).sum())


class ExactBlockDenoiser:
    """p_1's exact block posterior on a block path (MATH.md §9): the logits of block b are
    log p_1(x^b_i = y | x_t^b, x_1^{<b}) by enumeration, floored to stay finite. Called as a block model,
    `model(x_t, t, x1=x_1)` with t per sequence [B] or per position [B, L]."""

    model_kind = ModelKind("denoiser", "blocks", None, "the exact block posterior of an enumerable p_1", blocks=True)

    def __init__(self, dist: EnumerableDistribution, path: ProbabilityPath, block_length: int, floor: float = -700.0):
        self.dist, self.path, self.block_length, self.floor = dist, path, int(block_length), float(floor)

    def block_marginals(self, xt_block: Tensor, t: Tensor, prefix: Tensor) -> Tensor:
        """p_1(x^b_i = y | x_t^b, x^{<b} = prefix) [B, n, V] for one block xt_block [B, n] right after `prefix` [B, p]
        at times t [B]."""
        d = self.dist
        B, n = xt_block.shape
        p = prefix.shape[1]
        S = d.states
        lk = self.path.log_kernel(xt_block, t.double().reshape(-1).expand(B)).double()  # [B, n, V]
        own = S[:, p : p + n]  # [N, n]
        logw = d.log_probs + lk[:, torch.arange(n), :][:, :, own.T].diagonal(dim1=1, dim2=2).sum(-1)  # [B, N]
        if p:
            match = (S[:, :p].unsqueeze(0) == prefix.unsqueeze(1)).all(-1)  # [B, N]
            logw = torch.where(match, logw, torch.full_like(logw, -torch.inf))
        post = torch.softmax(logw, -1)
        return torch.einsum("bn,nkv->bkv", post, torch.nn.functional.one_hot(own, d.vocab_size).double())

    def __call__(self, xt: Tensor, t: Tensor, x1: Tensor | None = None) -> Tensor:
        B, L = xt.shape
        k = self.block_length
        t = t.reshape(B, -1).expand(B, L) if t.dim() else t.expand(B, L)
        parts = [
            self.block_marginals(xt[:, b0 : b0 + k], t[:, b0], x1[:, :b0] if b0 else xt[:, :0])
            for b0 in range(0, L, k)
        ]
        return torch.cat(parts, 1).log().clamp_min(self.floor)
