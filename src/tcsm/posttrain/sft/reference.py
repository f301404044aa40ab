"""The reference supervised fine-tuning recipe of uniform block-diffusion models (the one published for DiffusionGemma),
beside TCSM's objectives on the same uniform block path (MATH.md §9):

    c ~ U(ε, 1) per sequence and block;  x_t^i = u^i ~ U(V) with probability c, else x_1^i   (supervised i only)
    L = mean_{supervised i} −log p^θ(x_1^i | x_t, x_1^{<block(i)})  +  λ · mean_{supervised i} −log q^θ(x_1^i | x_1^{<i})

where q^θ is the model's causal encoder read as a next-token LM, and with probability p per sequence the decoder is
fed its own detached logits of a first pass on the same x_t (self-conditioning). Prompt positions (`cond_mask`) are
conditioning only: never corrupted, never scored. The model declares what it offers (`ModelKind.offers`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tcsm.core.batch import as_batch
from tcsm.models.kinds import kind_of

__all__ = ["ReferenceBlockSFT", "corrupt_uniform"]


def corrupt_uniform(x1, supervised, block_length, vocab_size, eps, generator=None):
    """(x_t, c): c ~ U(ε, 1) per sequence and block [B, L] (constant in a block), each supervised token replaced by
    a uniform random token with probability c. Draws, in order: c, the replace coins, the random tokens."""
    B, L = x1.shape
    k = L if block_length is None else int(block_length)
    dev = x1.device
    u = torch.rand(B, -(-L // k), generator=generator, device=dev)
    c = (eps + (1.0 - eps) * u).repeat_interleave(k, dim=1)[:, :L]
    coins = torch.rand(B, L, generator=generator, device=dev)
    noise = torch.randint(0, vocab_size, (B, L), generator=generator, device=dev)
    replace = (coins < c) & supervised
    return torch.where(replace, noise, x1), c


class ReferenceBlockSFT:
    """`objective(model, batch, generator) → (loss, metrics)`: the reference recipe's loss above. `t` handed to the
    model is α_t = 1 − c of a linear schedule (a time-blind model such as DiffusionGemma ignores it)."""

    def __init__(self, vocab_size: int, block_length: int | None, eps: float = 1e-3, ar_weight: float = 1.0,
                 self_cond_prob: float = 0.5):  # fmt: skip
        if not 0.0 <= eps < 1.0:
            raise ValueError(f"eps must be in [0, 1), got {eps}")
        if not 0.0 <= self_cond_prob <= 1.0:
            raise ValueError(f"self_cond_prob must be in [0, 1], got {self_cond_prob}")
        if ar_weight < 0:
            raise ValueError(f"ar_weight must be >= 0, got {ar_weight}")
        self.V, self.k = int(vocab_size), block_length
        self.eps, self.ar_weight, self.p = float(eps), float(ar_weight), float(self_cond_prob)

    def check(self, model) -> None:
        """One-line ValueError when the model does not offer what the recipe's settings ask for."""
        kind = kind_of(model)
        if not kind.blocks:
            raise ValueError("the reference block-diffusion SFT recipe needs a block denoiser (a DiffusionGemma model)")
        if self.ar_weight > 0 and "encoder_lm" not in kind.offers:
            raise ValueError("this model has no causal encoder LM: set ar_weight=0")
        if self.p > 0 and "self_conditioning" not in kind.offers:
            raise ValueError("this model has no self-conditioning input: set self_cond_prob=0")

    def __call__(self, model, batch, generator=None, **_):
        batch = as_batch(batch)
        x1 = batch.x1
        cond = batch.cond_mask if batch.cond_mask is not None else torch.zeros_like(x1, dtype=torch.bool)
        supervised = ~cond
        xt, c = corrupt_uniform(x1, supervised, self.k, self.V, self.eps, generator)
        t = torch.where(supervised, 1.0 - c, torch.ones_like(c))
        kw = {}
        k = self.k or x1.shape[1]
        if "decode_from" in kind_of(model).offers:  # blocks before the first supervised one are never scored
            first = int(supervised.any(0).float().argmax()) if bool(supervised.any()) else 0
            kw["decode_from"] = first // k * k
        lo = kw.get("decode_from", 0)
        if self.p > 0:
            on = torch.rand(x1.shape[0], generator=generator, device=x1.device) < self.p
            if bool(on.any()):  # a zeroed signal for every sequence is the same as no first pass
                kw.update(self_cond_first_pass=True, self_cond_mask=on)
        want_ar = self.ar_weight > 0
        out = model(xt, t, x1=x1, encoder_logits=True, **kw) if want_ar else model(xt, t, x1=x1, **kw)
        logits, enc = out if want_ar else (out, None)
        sup = supervised[:, lo:]
        ce = F.cross_entropy(logits[sup], x1[:, lo:][sup])
        metrics = {"ce": ce.detach(), "corrupt": c[supervised].mean().detach()}
        loss = ce
        if want_ar:
            nxt = supervised[:, 1:]
            ar = F.cross_entropy(enc[:, :-1][nxt], x1[:, 1:][nxt]) if bool(nxt.any()) else enc.sum() * 0
            loss = ce + self.ar_weight * ar
            metrics["ar"] = ar.detach()
        return loss, metrics

    def __repr__(self) -> str:
        return (f"ReferenceBlockSFT(eps={self.eps}, ar_weight={self.ar_weight}, self_cond_prob={self.p}, "
                f"block_length={self.k})")  # fmt: skip
