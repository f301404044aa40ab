"""Built-in registry entries (the denoiser, the data target, the composed TCSM objective) and the functions
that turn a run config into the objects a run trains: data → path → model → target → objective.

Nothing here knows a method: each component is whatever its registry entry builds from its config section.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from tcsm.errors import ConfigError
from tcsm.registry import MODELS, OBJECTIVES, TARGETS, BuildContext

__all__ = [
    "Components",
    "DataInfo",
    "build_components",
    "build_data",
    "build_model_for_checkpoint",
    "build_objective",
    "build_objective_for_checkpoint",
    "build_path",
    "section",
]


def section(cfg, name: str, key: str = "name") -> tuple[str, dict]:
    """(entry name, the section's other keys as a plain dict) of a component section."""
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(cfg[name], resolve=True)
    return node.pop(key), node


# --------------------------------------------------------------------------------------------------- model


def _denoiser_schema() -> type:
    """`model` keys for the denoiser: a preset plus any DenoiserConfig field as an override (null: preset)."""
    from tcsm.models import DenoiserConfig

    hints = typing.get_type_hints(DenoiserConfig)
    from tcsm.models import PRESETS

    fields = [
        ("name", str, "denoiser"),
        (
            "preset",
            str,
            field(default="tiny", metadata={"help": f"architecture preset: {' | '.join(PRESETS)}"}),
        ),
    ]
    for f in dataclasses.fields(DenoiserConfig):
        if f.name in ("vocab_size", "num_states"):  # from the data and the path
            continue
        # A runtime type for OmegaConf, not a hint: hence Optional[...] rather than `X | None`.
        optional = Optional[hints[f.name]]  # noqa: UP045
        fields.append((f.name, optional, field(default=None, metadata={"help": "null: the preset's"})))
    return dataclasses.make_dataclass("DenoiserModelConfig", fields)


@MODELS.register("denoiser", schema=_denoiser_schema())
def build_denoiser_model(node: dict, ctx: BuildContext):
    """Bidirectional diffusion transformer (tcsm.models.Denoiser): a preset plus overrides."""
    from tcsm.models import PRESETS, build_denoiser

    preset = node.pop("preset")
    if preset not in PRESETS:
        raise ConfigError(f"unknown model.preset {preset!r}; choose one of {sorted(PRESETS)}")
    overrides = {k: v for k, v in node.items() if v is not None}
    max_len = overrides.get("max_len", PRESETS[preset].get("max_len"))
    if max_len is not None and ctx.seq_len > max_len:
        raise ConfigError(
            f"data sequences have length {ctx.seq_len} but the model allows at most {max_len}; "
            f"set model.max_len={ctx.seq_len} or shorten the data's sequence length"
        )
    try:
        return build_denoiser(preset, vocab_size=ctx.vocab_size, num_states=ctx.path.num_states, **overrides)
    except ValueError as e:
        raise ConfigError(f"model: {e}") from None


# --------------------------------------------------------------------------------------------------- target


@dataclass
class DataTargetConfig:
    name: str = "data"


@TARGETS.register("data", schema=DataTargetConfig)
def build_data_target(node: dict, ctx: BuildContext):
    """Monte Carlo target from data samples: x_1 ~ data, x_t ~ p_{t|1} (MATH.md §3.4)."""
    from tcsm.targets import DataTarget

    return DataTarget()


# --------------------------------------------------------------------------------------------------- objective


@dataclass
class TCSMObjectiveConfig:
    name: str = "tcsm"
    loss: str = field(
        default="distrib", metadata={"help": "per-position loss: distrib | score | a LOSSES name"}
    )
    divergence: str | None = field(
        default=None, metadata={"help": "divergence of the loss (null: its default)"}
    )
    weighting: str = field(
        default="kappa", metadata={"help": "time weighting ω(t): kappa | a WEIGHTINGS name"}
    )
    antithetic: bool = field(default=True, metadata={"help": "antithetic t across each micro-batch"})
    kwargs: dict[str, Any] = field(
        default_factory=dict, metadata={"help": "extra loss arguments, e.g. {clamp: -30}"}
    )


@OBJECTIVES.register("tcsm", schema=TCSMObjectiveConfig)
def build_tcsm_objective(node: dict, ctx: BuildContext):
    """The composed N^1 TCSM objective: path × target × loss × divergence × ω(t) (MATH.md §3, §7)."""
    from tcsm.objectives import Objective

    kwargs = dict(node.pop("kwargs") or {})
    divergence = node.pop("divergence")
    if divergence is not None:
        kwargs["divergence"] = divergence
    try:
        return Objective(
            ctx.path,
            ctx.target,
            loss=node["loss"],
            weighting=node["weighting"],
            antithetic=node["antithetic"],
            **kwargs,
        )
    except (ValueError, KeyError) as e:
        raise ConfigError(f"objective: {e}") from None


# --------------------------------------------------------------------------------------------------- assembly


@dataclass
class DataInfo:
    """What a model needs to know about its data when the data itself is not loaded (checkpoint loading)."""

    name: str
    vocab_size: int
    seq_len: int
    label: str = ""
    nats_per_token_floor: float | None = None
    chars: str | None = None  # the character vocabulary, for character-level tokenizers

    @classmethod
    def of(cls, bundle) -> DataInfo:
        floor = getattr(bundle, "nats_per_token_floor", None)
        chars = getattr(getattr(bundle, "tokenizer", None), "chars", None)
        return cls(
            bundle.name,
            int(bundle.vocab_size),
            int(bundle.seq_len),
            getattr(bundle, "label", bundle.name),
            None if floor is None else float(floor),
            chars if isinstance(chars, str) else None,
        )

    def check_compatible(self, bundle, where: str) -> None:
        """Raise CheckpointError unless `bundle` uses the token ids this model was trained on."""
        from tcsm.errors import CheckpointError

        other = DataInfo.of(bundle)
        if other.vocab_size != self.vocab_size or (self.chars and other.chars and other.chars != self.chars):
            hint = f"; pass data.vocab={self.chars!r}" if self.chars else ""
            raise CheckpointError(
                f"the data's vocabulary ({other.vocab_size} tokens) is not the one {where!r} was trained on "
                f"({self.vocab_size} tokens){hint}"
            )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def build_data(cfg):
    """The run's DataBundle from the `data` section (tcsm.data.build_data)."""
    from omegaconf import OmegaConf

    from tcsm.data import build_data as _build_data

    return _build_data(OmegaConf.to_container(cfg.data, resolve=True))


def build_path(cfg, vocab_size: int):
    """The probability path of the `path` section for V = vocab_size clean tokens."""
    from tcsm.paths import make_path

    try:
        return make_path(cfg.path.source, vocab_size, cfg.path.schedule, **dict(cfg.path.schedule_kwargs))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"path: {e}") from None


@dataclass
class Components:
    data: Any
    path: Any
    model: torch.nn.Module
    target: Any
    objective: Any
    context: BuildContext


def build_components(cfg, device: torch.device, data=None) -> Components:
    """Build data, path, model (on `device`), target and objective from a validated run config."""
    data = build_data(cfg) if data is None else data
    ctx = BuildContext(config=cfg, device=device, data=data)
    ctx.path = build_path(cfg, data.vocab_size)
    name, node = section(cfg, "model")
    ctx.model = MODELS.build(name, node, ctx).to(device)
    name, node = section(cfg, "target")
    target = TARGETS.build(name, node, ctx)
    ctx.target = target.to(device) if hasattr(target, "to") else target
    objective = build_objective(cfg, ctx)
    return Components(data, ctx.path, ctx.model, ctx.target, objective, ctx)


def build_objective(cfg, ctx: BuildContext):
    """The objective of the `objective` section for the context's path, model and target, on ctx.device."""
    name, node = section(cfg, "objective")
    objective = OBJECTIVES.build(name, node, ctx)
    return objective.to(ctx.device) if hasattr(objective, "to") else objective


def build_model_for_checkpoint(cfg, data_info: dict, device) -> torch.nn.Module:
    """The model a checkpoint's config describes, without loading its data."""
    info = DataInfo(**data_info)
    ctx = BuildContext(config=cfg, device=torch.device(device), data=info)
    ctx.path = build_path(cfg, info.vocab_size)
    name, node = section(cfg, "model")
    return MODELS.build(name, node, ctx).to(device)


def build_objective_for_checkpoint(cfg, model: torch.nn.Module, data, device):
    """The objective a checkpoint's run trained `model` with, for its model-scoring hooks (`evaluate`, `sample`).

    No target is built (ctx.target is None): scoring a model needs only the model and the data, and a teacher
    or reward model would be loaded for nothing; builders accept a missing target (the composed objective then
    uses the data target)."""
    device = torch.device(device)
    ctx = BuildContext(config=cfg, device=device, data=data, model=model)
    ctx.path = build_path(cfg, int(data.vocab_size))
    return build_objective(cfg, ctx)
