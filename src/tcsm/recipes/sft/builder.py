"""Instruction fine-tuning builder: `objective.name: sft` is the composed TCSM objective (`objective.name: tcsm`'s
keys) over the data target, evaluated as the bound of completions given their prompts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from tcsm.builders.objectives import TCSMObjectiveConfig, build_tcsm_objective
from tcsm.builders.registry import OBJECTIVES, BuildContext
from tcsm.core.errors import ConfigError
from tcsm.targets.base import DataTarget

__all__ = ["SFTObjectiveConfig"]


@dataclass
class SFTObjectiveConfig(TCSMObjectiveConfig):
    name: str = "sft"
    eval_num_t: int = field(default=4, metadata={"help": "stratified times per held-out record in the evaluation"})
    normalize: str = field(
        default="length",
        metadata={"help": "length: loss per sequence position | response: per response token (LLaDA's SFT)"},
    )


@OBJECTIVES.register("sft", schema=SFTObjectiveConfig)
def build_sft_objective(node: dict, ctx: BuildContext):
    """The composed objective on prompt-conditioned data, validated by the completion | prompt bound."""
    from tcsm.posttrain.sft.objective import SFTObjective

    if ctx.target is not None and not isinstance(ctx.target, DataTarget):
        raise ConfigError(f"objective sft learns from the completions: use target.name=data, not {type(ctx.target).__name__}")
    node = dict(node)
    eval_num_t, normalize = node.pop("eval_num_t"), node.pop("normalize")
    known = {f.name for f in dataclasses.fields(TCSMObjectiveConfig)}
    inner = build_tcsm_objective({k: v for k, v in node.items() if k in known}, ctx)
    bound = getattr(getattr(ctx.config, "eval", None), "bound", None)
    try:
        return SFTObjective(inner, ctx.path, eval_num_t=eval_num_t, bound=bound, normalize=normalize)
    except ValueError as e:
        raise ConfigError(f"objective sft: {e}") from None
