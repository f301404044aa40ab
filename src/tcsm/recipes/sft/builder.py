"""Instruction fine-tuning builder: `objective.name: sft` is the composed TCSM objective (`objective.name: tcsm`'s
keys) over the data target, or with `objective.recipe: reference` the reference recipe of uniform block-diffusion
models (`tcsm.posttrain.sft.reference`: uniform corruption at c ~ U(ε, 1), cross-entropy on every supervised canvas
position, the encoder's next-token loss, self-conditioning, the MoE routers frozen); both are evaluated as the bound
of completions given their prompts."""

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
    recipe: str = field(default="tcsm", metadata={
        "help": "tcsm (the composed TCSM objective) | reference (the published SFT recipe of a block-diffusion model "
                "such as DiffusionGemma: uniform corruption, cross-entropy, encoder LM loss, self-conditioning)"})
    eps: float = field(default=1e-3, metadata={"help": "reference recipe (its loss is per supervised token: "
                                                         "normalize does not apply): corruption level c ~ U(eps, 1)"})
    ar_weight: float = field(default=1.0, metadata={"help": "reference recipe: weight of the encoder's next-token loss"})
    self_cond_prob: float = field(default=0.5, metadata={"help": "reference recipe: self-conditioning probability"})
    freeze_router: bool = field(default=True, metadata={"help": "reference recipe: keep the MoE routers fixed"})


@OBJECTIVES.register("sft", schema=SFTObjectiveConfig)
def build_sft_objective(node: dict, ctx: BuildContext):
    """The composed objective on prompt-conditioned data, validated by the completion | prompt bound."""
    from tcsm.posttrain.sft.objective import SFTObjective

    if ctx.target is not None and not isinstance(ctx.target, DataTarget):
        raise ConfigError(f"objective sft learns from the completions: use target.name=data, not {type(ctx.target).__name__}")
    node = dict(node)
    eval_num_t, normalize = node.pop("eval_num_t"), node.pop("normalize")
    if node["recipe"] not in ("tcsm", "reference"):
        raise ConfigError(f"objective.recipe must be tcsm or reference, got {node['recipe']!r}")
    if node["recipe"] == "reference":
        inner = _reference(node, ctx)
    else:
        known = {f.name for f in dataclasses.fields(TCSMObjectiveConfig)}
        inner = build_tcsm_objective({k: v for k, v in node.items() if k in known}, ctx)
    ev = getattr(ctx.config, "eval", None)
    bound, t_max = getattr(ev, "bound", None), getattr(ev, "t_max", None)
    try:
        return SFTObjective(inner, ctx.path, eval_num_t=eval_num_t, bound=bound, normalize=normalize, t_max=t_max)
    except ValueError as e:
        raise ConfigError(f"objective sft: {e}") from None


def _reference(node: dict, ctx: BuildContext):
    """The reference recipe's loss for the run's model, its routers frozen when it declares them."""
    from tcsm.models.kinds import kind_of
    from tcsm.posttrain.sft.reference import ReferenceBlockSFT

    if ctx.path.num_states != ctx.path.vocab_size:
        raise ConfigError("objective.recipe=reference is the published SFT recipe of uniform block-diffusion models "
                          "(DiffusionGemma's); this run is on the masked source: leave objective.recipe=tcsm (the "
                          "default)")  # fmt: skip
    try:
        loss = ReferenceBlockSFT(ctx.path.vocab_size, getattr(ctx.path, "block_length", None), eps=node["eps"],
                                 ar_weight=node["ar_weight"], self_cond_prob=node["self_cond_prob"])  # fmt: skip
        if ctx.model is not None:
            loss.check(ctx.model)
    except ValueError as e:
        raise ConfigError(f"objective sft (recipe=reference): {e}") from None
    if node["freeze_router"] and ctx.model is not None and "router" in kind_of(ctx.model).offers:
        for p in ctx.model.router_parameters():
            p.requires_grad_(False)
    return loss
