"""BERT-style masked language model over clean tokens: a parametric model of p_1(x^i | x^{≠i}) (MATH.md §4).

Input alphabet {0..V−1} ∪ {[MASK] = V}; bidirectional attention; logits over the V clean tokens at every position.
Trained with the masked-LM loss (`tcsm.objectives.lm.MaskedLMLoss`). As a teacher, replacing x^i by [MASK] and reading
position i gives p_1(· | x^{≠i}) (`tcsm.targets.parametric.MLMTeacher`, one pass per position).
"""

from __future__ import annotations

from torch import Tensor

from tcsm.models.kinds import MLM
from tcsm.models.lm import LMConfig, LMTransformer

__all__ = ["MaskedLM"]


class MaskedLM(LMTransformer):
    """x [B, L] with ids in {0..V} (V = [MASK]) → logits [B, L, V] of p(x^i = · | unmasked tokens)."""

    model_kind = MLM

    def __init__(self, cfg: LMConfig):
        super().__init__(cfg, causal=False)
        self.mask_id = cfg.vocab_size

    def forward(self, x: Tensor) -> Tensor:
        """Logits [B, L, V] over clean tokens; meaningful at [MASK] positions (MATH.md §4, BERT/MLM)."""
        self._check(x)
        return self._trunk(self.embed(x))
