"""The strategy-(ii) log-ratio head f_θ(x_1, x_t, t) (MATH.md §5.1, §6.3, §8 item 13).

p^θ_{1|t}(x_1 | x_t) ∝ p^ref_{1|t}(x_1 | x_t) e^{f_θ(x_1, x_t, t)}: one scalar per sequence pair. The trunk is the
`Denoiser`'s (same block, rotary positions and adaLN time conditioning, bidirectional attention) run over the
pair: per position, emb_t(x_t^i) + emb_1(x_1^i), so every token of x_1 can attend to every token of x_t. The
hidden states are mean-pooled and a zero-initialised linear layer reads out f, so f ≡ 0 at initialisation
and p^θ starts exactly at p^ref. `RatioHead.from_denoiser(reference)` copies the reference's trunk.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from tcsm.models.config import TrunkConfig
from tcsm.models.layers import build_trunk, init_weights, run_trunk, zero_init_

__all__ = ["RatioHead", "RatioHeadConfig", "head_config"]

#: depth of a head over a reference with no tcsm trunk (a Hugging Face model): two layers of its hidden width
_FOREIGN_DEPTH = 2


def head_config(reference_cfg: Any, **overrides: Any) -> RatioHeadConfig:
    """The head's config from its reference's: the trunk's fields where the reference is a tcsm denoiser; over a
    model with no such trunk (it declares only `hidden_size`), a `_FOREIGN_DEPTH`-layer trunk of its hidden width
    with the most heads (≤ 8) that split it into an even head dimension. `overrides` win."""
    ref = reference_cfg.to_dict()
    known = {f.name for f in fields(RatioHeadConfig)}
    kw = {k: v for k, v in ref.items() if k in known}
    if "d_model" not in kw and ref.get("hidden_size"):
        kw["d_model"] = int(ref["hidden_size"])
    kw.update(overrides)
    if "d_model" not in kw:
        raise ValueError("the reference model declares no width (d_model or hidden_size): set model.d_model, "
                         "model.n_layers and model.n_heads of the ratio head")  # fmt: skip
    kw.setdefault("n_layers", _FOREIGN_DEPTH)
    if "n_heads" not in kw:
        d = int(kw["d_model"])
        kw["n_heads"] = next((h for h in (8, 4, 2, 1) if d % h == 0 and (d // h) % 2 == 0), 1)
    return RatioHeadConfig(**kw)


@dataclass
class RatioHeadConfig(TrunkConfig):
    """Architecture of a `RatioHead`: the denoiser's trunk (`TrunkConfig`; the fields mean the same thing)."""

    label: ClassVar[str] = "RatioHeadConfig"

    def __post_init__(self) -> None:
        self.check_trunk()


class RatioHead(nn.Module):
    """(x_1 [B, L] clean ids < V, x_t [B, L] ids < num_states, t [B]) → f [B] (float32), f ≡ 0 at init."""

    def __init__(self, cfg: RatioHeadConfig):
        super().__init__()
        self.cfg = cfg
        # `embed` (x_t) and the trunk use the Denoiser's names, so `from_denoiser` can copy by name.
        build_trunk(self, cfg, embed_clean=cfg.vocab_size)
        self.out = zero_init_(nn.Linear(cfg.d_model, 1, bias=True))
        self.apply(init_weights)

    @classmethod
    def from_denoiser(cls, reference: nn.Module, **overrides: Any) -> RatioHead:
        """A head whose trunk starts as a copy of `reference`'s (a `Denoiser`) wherever names and shapes match;
        emb_1 starts as the reference's embedding of the clean tokens. The readout stays zero (f ≡ 0), and no
        tensor is shared, so training the head never moves the reference."""
        head = cls(head_config(reference.cfg, **overrides))
        own = head.state_dict()
        src = reference.state_dict()
        copied = {
            k: v for k, v in src.items() if k in own and own[k].shape == v.shape and not k.startswith("out.")
        }
        emb = src.get("embed.weight")
        if emb is not None and emb.shape[0] >= head.cfg.vocab_size and emb.shape[1] == head.cfg.d_model:
            copied["embed_clean.weight"] = emb[: head.cfg.vocab_size]
        with torch.no_grad():
            for k, v in copied.items():
                own[k].copy_(v)
        return head

    def forward(self, x1: Tensor, xt: Tensor, t: Tensor | None = None) -> Tensor:
        if x1.shape != xt.shape or x1.dim() != 2:
            raise ValueError(
                f"x1 and xt must both be [batch, length], got {tuple(x1.shape)} and {tuple(xt.shape)}"
            )
        if x1.shape[1] > self.cfg.max_len:
            raise ValueError(f"sequence length {x1.shape[1]} exceeds max_len={self.cfg.max_len}")
        h = self.embed(xt) + self.embed_clean(x1)
        rope = self.rotary(xt.shape[1])
        if self.time_embed is not None and t is None:
            raise ValueError("this ratio head is time-conditioned: pass t of shape [batch]")
        h = run_trunk(self, h, rope, t)
        # Mean pooling keeps f's scale independent of L; float32 because f enters exp() in every loss.
        return self.out(h.mean(dim=1)).squeeze(-1).float()
