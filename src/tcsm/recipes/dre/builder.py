"""Density-ratio post-training builders (MATH.md §5.1): the energy model, the DRE objective.

* `model.name: energy` — frozen reference p^ref (the run's `reference.path`, a tcsm checkpoint) + `RatioHead` f_θ,
  trained as the strategy-(ii) energy model. The reference's weights are part of the run's own weights, so a
  checkpoint loads without the reference run (its architecture is `model.reference_model`, which `tcsm finetune
  dre` copies from the reference run).
* `objective.name: dre` — strategy i (the student denoiser against the frozen `reference.path`, or
  `objective.reference` = `ema` | `previous`) or ii (an energy model), with the Bregman generator `bregman` = lsif | bce | gkl (formerly `objective.loss`) and `num_negatives` reference draws per x_t.

A reference whose vocabulary or noise source differs from the run's is refused with a one-line CheckpointError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from tcsm.builders.components import DataInfo
from tcsm.builders.config import to_dict
from tcsm.builders.registry import MODELS, OBJECTIVES, BuildContext, ReferenceUse
from tcsm.core.errors import CheckpointError, ConfigError
from tcsm.models.kinds import ENERGY, kind_of
from tcsm.posttrain.dre.energy import EnergyModel
from tcsm.posttrain.dre.ratio_head import RatioHead, head_config
from tcsm.targets.base import freeze

__all__ = ["DREObjectiveConfig", "EnergyModelConfig"]


# --------------------------------------------------------------------------------------------------- model

_HEAD_KEYS = ("d_model", "n_layers", "n_heads", "cond_dim", "mlp_ratio", "dropout", "time_conditioning")


@dataclass
class EnergyModelConfig:
    name: str = "energy"
    reference_model: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "the reference's model section (tcsm finetune dre copies it; {}: read the checkpoint)"
        },
    )
    init_from_reference: bool = field(
        default=True, metadata={"help": "start the head's trunk as a copy of the reference's (readout f ≡ 0)"}
    )
    d_model: Optional[int] = field(default=None, metadata={"help": "head width (null: the reference's)"})  # noqa: UP045
    n_layers: Optional[int] = field(default=None, metadata={"help": "head depth (null: the reference's)"})  # noqa: UP045
    n_heads: Optional[int] = None  # noqa: UP045
    cond_dim: Optional[int] = None  # noqa: UP045
    mlp_ratio: Optional[float] = None  # noqa: UP045
    dropout: Optional[float] = None  # noqa: UP045
    time_conditioning: Optional[bool] = field(  # noqa: UP045
        default=None, metadata={"help": "condition f on t (null: as the reference)"}
    )


def _reference_architecture(node: dict, ctx: BuildContext):
    """The reference denoiser with its architecture only (weights follow from the energy run's checkpoint)."""
    arch = dict(node["reference_model"])
    if not arch:
        if not ctx.config.reference.path:
            raise ConfigError("model.reference_model (or reference.path) must describe the reference denoiser")
        from tcsm.storage.checkpoint import read_state, resolve_checkpoint

        arch = dict(read_state(resolve_checkpoint(ctx.config.reference.path))[1]["config"]["model"])
    name = arch.pop("name", "denoiser")
    return MODELS.build(name, arch, ctx)


@MODELS.register("energy", schema=EnergyModelConfig, reference=ReferenceUse("reference.path"), kind=ENERGY)
def build_energy_model(node: dict, ctx: BuildContext) -> EnergyModel:
    """Strategy-(ii) energy model p^ref · e^{f_θ}: a frozen reference and a trainable ratio head (MATH.md §5.1)."""
    if isinstance(ctx.data, DataInfo):
        # Loading a checkpoint: only the architecture is needed, the checkpoint holds both sets of weights.
        reference = freeze(_reference_architecture(node, ctx))
    else:
        if ctx.reference is None:
            raise ConfigError("reference.path must name the reference checkpoint (tcsm finetune dre --from RUN sets it)")
        reference, ck = ctx.reference, ctx.reference_checkpoint
        saved = {k: v for k, v in node["reference_model"].items() if v is not None}
        stored = {k: v for k, v in to_dict(ck.config.model).items() if v is not None}
        if saved and saved != stored:
            raise CheckpointError(
                f"model.reference_model does not describe the reference checkpoint {str(ck.directory)!r}; "
                "remove it (it is read from the checkpoint) or point reference.path at the matching run"
            )
    overrides = {k: node[k] for k in _HEAD_KEYS if node.get(k) is not None}
    try:
        if node["init_from_reference"]:
            head = RatioHead.from_denoiser(reference, **overrides)
        else:
            head = RatioHead(head_config(reference.cfg, **overrides))
    except ValueError as e:
        raise ConfigError(f"model: {e}") from None
    return EnergyModel(reference, head)


# --------------------------------------------------------------------------------------------------- objective


@dataclass
class DREObjectiveConfig:
    name: str = "dre"
    strategy: str = field(
        default="ii",
        metadata={"help": "i: the student denoiser over p^ref | ii: energy model p^ref·e^f", "choices": ("i", "ii")},
    )
    bregman: str = field(
        default="bce",
        metadata={
            "help": "Bregman generator of the DRE loss: lsif | bce (EDLM's NCE) | gkl (MATH.md §5.1)",
            "choices": ("lsif", "bce", "gkl"),
        },
    )
    num_negatives: int = field(default=1, metadata={"help": "reference draws x̂_1 ~ p^ref_{1|t} per x_t"})
    level: str = field(default="token", metadata={"help": "strategy i: token (N^1 conditionals) | sequence"})
    reference: Optional[str] = field(  # noqa: UP045
        default=None,
        metadata={"help": "strategy i: ema | previous | null (the frozen reference.path); ii: null"},
    )
    refresh_every: int = field(default=100, metadata={"help": "reference=previous: steps between refreshes"})
    antithetic: bool = field(default=True, metadata={"help": "antithetic t across each micro-batch"})
    log_z_samples: list[int] = field(
        default_factory=lambda: [1, 4, 16],
        metadata={
            "help": "strategy ii evaluation: reference draws for log Ẑ (the estimate is given for each)"
        },
    )
    eval_max_rows: int = field(default=8192, metadata={"help": "strategy ii evaluation: head rows per call"})


@OBJECTIVES.register("dre", schema=DREObjectiveConfig, reference=ReferenceUse("reference.path"))
def build_dre_objective(node: dict, ctx: BuildContext):
    """Density-ratio post-training, strategy (i) or (ii), Bregman DRE loss (MATH.md §5.1)."""
    from tcsm.posttrain.dre.objective import DensityRatioObjective, EnergyObjective

    strategy, reference = node["strategy"], node["reference"]
    common = {
        "loss": node["bregman"],
        "num_negatives": node["num_negatives"],
        "target": ctx.target,
        "antithetic": node["antithetic"],
    }
    is_energy = kind_of(ctx.model) is ENERGY
    try:
        if strategy == "ii":
            if not is_energy:
                raise ConfigError("objective.strategy=ii trains an energy model: set model.name=energy")
            if reference is not None:
                raise ConfigError(
                    f"objective.reference={reference} is strategy i's; strategy ii's reference is reference.path"
                )
            return EnergyObjective(
                ctx.path,
                eval_num_t=ctx.config.eval.num_t,
                log_z_samples=list(node["log_z_samples"]),
                eval_max_rows=node["eval_max_rows"],
                **common,
            )
        if strategy != "i":
            raise ConfigError(f"objective.strategy must be i or ii, got {strategy!r}")
        if is_energy:
            raise ConfigError(
                "objective.strategy=i trains the student denoiser itself: use model.name=denoiser"
            )
        if reference not in (None, "ema", "previous"):
            raise ConfigError(f"objective.reference must be ema, previous or null (reference.path), got {reference!r}")
        if reference is None and not ctx.config.reference.path:
            raise ConfigError("strategy i needs a reference: reference.path (a checkpoint), or objective.reference=ema | previous")
        if reference == "ema" and not ctx.config.train.ema > 0:
            raise ConfigError("objective.reference=ema needs the trainer's EMA: set train.ema > 0")
        if reference is None:
            # Scoring a saved run loads no reference (the entry's use is not for scoring): strategy i is then
            # evaluated as a denoiser.
            reference = ctx.reference
        return DensityRatioObjective(
            ctx.path, reference, level=node["level"], refresh_every=node["refresh_every"], **common
        )
    except ValueError as e:
        if isinstance(e, (ConfigError, CheckpointError)):
            raise
        raise ConfigError(f"objective: {e}") from None
