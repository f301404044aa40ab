"""The strategy-(ii) energy model p^θ_{1|t}(x_1 | x_t) ∝ p^ref_{1|t}(x_1 | x_t) e^{f_θ(x_1, x_t, t)} (MATH.md §5.1, §6.3).

One module holds the frozen factorized reference p^ref (a `Denoiser`) and the trainable log-ratio head f_θ (a
`RatioHead`), so that a run's checkpoint is self-contained: its weights file holds both, and loading it needs no
other run. Only the head has parameters that require grad; the reference stays in eval mode and never trains.
Calling the module gives f_θ(x_1, x_t, t) — the `EnergyFn` of `tcsm.posttrain.dre.losses` and `tcsm.posttrain.dre.sir` — and it is
*not* a denoiser: sample it with `tcsm.posttrain.dre.sir.sample_sir` (SIR over the reference), never with `tcsm.sampling.sample`.
"""

from __future__ import annotations

from torch import Tensor, nn

from tcsm.models.kinds import ENERGY
from tcsm.posttrain.dre.ratio_head import RatioHead

__all__ = ["EnergyModel"]


class EnergyModel(nn.Module):
    """(x_1 [B, L], x_t [B, L], t [B]) → f_θ [B]; `reference` is the frozen p^ref, `head` the trained f_θ."""

    model_kind = ENERGY

    def __init__(self, reference: nn.Module, head: RatioHead):
        super().__init__()
        self.reference = reference.eval().requires_grad_(False)
        self.head = head

    @property
    def cfg(self):
        """The head's config (max_len, time_conditioning): what callers that size inputs ask a model for."""
        return self.head.cfg

    def train(self, mode: bool = True) -> EnergyModel:
        super().train(mode)
        self.reference.eval()  # dropout in p^ref would make its negatives and SIR proposals a different model
        return self

    def forward(self, x1: Tensor, xt: Tensor, t: Tensor | None = None) -> Tensor:
        if t is None:
            raise ValueError(
                "an energy model computes f(x_1, x_t, t) and is not a denoiser; sample it with the SIR sampler "
                "(tcsm sample, or tcsm.sampling.sample_sir(model.reference, model, ...))"
            )
        return self.head(x1, xt, t)
