"""Objective builders: `objective.name` → a training objective (TCSM, LM losses, SEDD-style bound)."""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from tcsm.builders.registry import OBJECTIVES, BuildContext
from tcsm.core.errors import ConfigError
from tcsm.models.kinds import kind_of
from tcsm.objectives.lm import LM_LOSSES, MaskedLMLoss

__all__ = ["LMObjectiveConfig", "LossOptions", "SEDDObjectiveConfig", "TCSMObjectiveConfig"]


# --------------------------------------------------------------------------------------------------- objective


@dataclass
class LossOptions:
    """The per-position loss's options (`objectives.losses`), typed keys of the `objective:` section so that they
    show in `tcsm train --help` and can be flags; null leaves the loss's own default. A loss that does not take an
    option given here says so in one line (`Objective` checks the options against the loss)."""

    clamp: Optional[float] = field(  # noqa: UP045 (OmegaConf structured configs need Optional)
        default=None, metadata={"help": "floor of the loss's log-probabilities (null: the loss's default; -inf: none)"}
    )
    bregman: Optional[str] = field(  # noqa: UP045
        default=None, metadata={"help": "score loss: Bregman generator, a BREGMAN name: gkl | squared | is | logistic (null: gkl)"}
    )
    tilt: Optional[bool] = field(  # noqa: UP045
        default=None, metadata={"help": "score loss, Monte Carlo target: the kernel-tilted estimator (null: off)"}
    )
    weight_cap: Optional[str] = field(  # noqa: UP045
        default=None, metadata={"help": "score loss: importance-weight cap c, a number | V | inf (null: V; MATH.md §3.6)"}
    )
    paper_scale: Optional[bool] = field(  # noqa: UP045
        default=None, metadata={"help": "score loss: the paper's scale of the score loss (null: false)"}
    )


@dataclass
class TCSMObjectiveConfig(LossOptions):
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
    t_range: Optional[list[float]] = field(  # noqa: UP045 (OmegaConf structured configs need Optional)
        default=None,
        metadata={
            "help": "train on t ~ U[lo, hi] only (BD3-LM's clipped schedule: mask rates [β, ω] are t ∈ [1−ω, 1−β] "
            "under the linear α_t); not a likelihood bound; null: [0, 1]"
        },
    )
    kwargs: dict[str, Any] = field(
        default_factory=dict,
        metadata={"help": "extra arguments of a user's loss (`loss: module:function`); the built-in losses' options "
                          "are the keys above (objective.kwargs.clamp is read as objective.clamp, with a note)"},
    )


@OBJECTIVES.register("tcsm", schema=TCSMObjectiveConfig)
def build_tcsm_objective(node: dict, ctx: BuildContext):
    """The composed N^1 TCSM objective: path × target × loss × divergence × ω(t) (MATH.md §3, §7)."""
    from tcsm.objectives import Objective

    kwargs = dict(node.pop("kwargs") or {})
    typed = [f.name for f in dataclasses.fields(LossOptions)]
    for key in sorted(set(kwargs) & set(typed)):  # the untyped form of a typed option: read, with a note
        print(f"tcsm: note: objective.kwargs.{key} is now objective.{key} (read as objective.{key}={kwargs[key]!r})",
              file=sys.stderr)  # fmt: skip
    kwargs.update({k: node.pop(k) for k in typed if node.get(k) is not None})
    for k in typed:
        node.pop(k, None)
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
            t_range=None if node.get("t_range") is None else tuple(node["t_range"]),
            **kwargs,
        )
    except (ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"objective: {e}") from None


# --------------------------------------------------------------------------------------------------- registry
# `objective.name: lm` picks the model family's loss; the explicit names check that they fit the model.


@dataclass
class LMObjectiveConfig:
    name: str = "lm"
    mask_rate: float = field(default=0.15, metadata={"help": "MLM: fraction of positions masked"})
    mask_rate_max: float | None = field(
        default=None, metadata={"help": "MLM: draw the rate per sequence from [mask_rate, mask_rate_max]"}
    )
    random_rate: float = field(default=0.0, metadata={"help": "MLM: chosen positions given a random token"})
    keep_rate: float = field(default=0.0, metadata={"help": "MLM: chosen positions left unchanged"})


_OBJECTIVE_FAMILY = {"mlm": "mlm", "autoregressive": "causal", "pseudo_likelihood": "hollow"}


def _register_lm() -> None:
    def make(objective: str):
        def build(node: dict, ctx):
            family = kind_of(ctx.model).family
            want = _OBJECTIVE_FAMILY.get(objective, family)
            if family is None or family not in LM_LOSSES or family != want:
                raise ConfigError(
                    f"objective {objective!r} trains an LM of family {want or 'mlm | causal | hollow'}, but "
                    f"model.name builds a {type(ctx.model).__name__}; use objective.name=lm with model.name="
                    "mlm | causal | hollow (or hf_mlm | hf_causal)"
                )
            if LM_LOSSES[family] is not MaskedLMLoss:
                return LM_LOSSES[family]()
            hi = node["mask_rate_max"]
            rate = node["mask_rate"] if hi is None else (node["mask_rate"], hi)
            try:
                return MaskedLMLoss(rate, node["random_rate"], node["keep_rate"])
            except ValueError as e:
                raise ConfigError(f"objective: {e}") from None

        return build

    helps = {
        "lm": "train an LM (not a diffusion model) with its family's loss (MLM / next-token NLL / pseudo-likelihood)",
        "mlm": "BERT masked-LM loss for model.name=mlm | hf_mlm",
        "autoregressive": "next-token NLL for model.name=causal | hf_causal",
        "pseudo_likelihood": "Σ_i −log p(x^i | x^{≠i}) for model.name=hollow",
    }
    for name, text in helps.items():
        schema = dataclasses.make_dataclass(
            f"{name.title()}Config", [("name", str, name)], bases=(LMObjectiveConfig,)
        )
        OBJECTIVES.register(name, make(name), schema=schema, help=text, overwrite=True)


_register_lm()


# --------------------------------------------------------------------------------------------------- sedd


@dataclass
class SEDDObjectiveConfig:
    name: str = "sedd"
    bound: Optional[str] = field(  # noqa: UP045 (OmegaConf structured configs need Optional)
        default=None,
        metadata={"help": "bound trained on: reversal (SEDD, uniform default) | dfm (uniform) | masked (masked)"},
    )
    antithetic: bool = field(default=True, metadata={"help": "antithetic t across each micro-batch"})


@OBJECTIVES.register("sedd", schema=SEDDObjectiveConfig)
def build_sedd_objective(node: dict, ctx: BuildContext):
    """SEDD-style score entropy (mean-parameterised): train on the path's NELBO integrand (MATH.md §2.3 B)."""
    from tcsm.objectives.sedd import ScoreEntropyObjective
    from tcsm.targets.base import DataTarget

    if ctx.target is not None and not isinstance(ctx.target, DataTarget):
        # The bound needs x_1 ~ data and x_t ~ p_{t|1}(·|x_1); other targets change what x_1 and x_t are.
        raise ConfigError(f"objective sedd trains on data samples: use target.name=data, not {type(ctx.target).__name__}")
    try:
        return ScoreEntropyObjective(ctx.path, ctx.target, bound=node.get("bound"), antithetic=node["antithetic"])
    except ValueError as e:
        raise ConfigError(f"objective sedd: {e}") from None
