"""Preference fine-tuning builders (MATH.md §5.3): the pairwise objectives and their frozen reference.

`objective.name: preference` declares a use of the run's frozen model (`reference.path`), which the build loads
once into `ctx.reference` (`tcsm.builders.frozen.load_reference`) and this builder gives the objective; the student
itself starts from the same weights through `train.init_from` (tcsm.recipes.preference.compose sets both).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tcsm.builders.registry import OBJECTIVES, BuildContext, ReferenceUse
from tcsm.core.errors import ConfigError
from tcsm.targets.base import DataTarget

__all__ = ["PreferenceObjectiveConfig"]


@dataclass
class PreferenceObjectiveConfig:
    """The frozen pre-trained reference is the run's frozen model, `reference.path`."""

    name: str = "preference"
    loss: str = field(
        default="paper",
        metadata={"help": "paper (BCE, logits Δ − log β) | dpo (−log σ(β_dpo (Δ_w − Δ_l)))", "choices": ("paper", "dpo")},
    )
    beta: float = field(
        default=1.0, metadata={"help": "paper loss: the margin β of r = p^θ/(β p^ref) (MATH.md §5.3)"}
    )
    beta_dpo: float = field(default=0.1, metadata={"help": "dpo loss: inverse temperature β_DPO"})
    num_t: int = field(default=2, metadata={"help": "times t (and x_t draws) per pair and step"})
    weighting: str = field(
        default="none", metadata={"help": "ω(t) multiplying each pair's loss: none | kappa | ..."}
    )
    noise: str = field(
        default="independent",
        metadata={"help": "x_t^w, x_t^l: independent (MATH.md §5.3) | shared random draws"},
    )
    antithetic: bool = field(default=True, metadata={"help": "antithetic t across each micro-batch"})
    eval_num_t: int = field(
        default=4, metadata={"help": "stratified times per held-out pair in the evaluation"}
    )


@OBJECTIVES.register(
    "preference", schema=PreferenceObjectiveConfig, reference=ReferenceUse("reference.path", scoring=True)
)
def build_preference_objective(node: dict, ctx: BuildContext):
    """Pairwise preference loss (paper BCE or DPO-style) against a frozen pre-trained reference (MATH.md §5.3)."""
    from tcsm.posttrain.preference.objective import PreferenceObjective

    if ctx.target is not None and not isinstance(ctx.target, DataTarget):
        raise ConfigError(
            f"objective preference noises the pairs itself: use target.name=data, not {type(ctx.target).__name__}"
        )
    if ctx.reference is None:
        raise ConfigError("reference.path must name the pre-trained checkpoint (tcsm finetune preference --from RUN)")
    try:
        return PreferenceObjective(
            ctx.path,
            loss=node["loss"],
            beta=node["beta"],
            beta_dpo=node["beta_dpo"],
            num_t=node["num_t"],
            weighting=node["weighting"],
            noise=node["noise"],
            antithetic=node["antithetic"],
            reference=ctx.reference,
            eval_num_t=node["eval_num_t"],
        )
    except ValueError as e:
        raise ConfigError(f"objective preference: {e}") from None
