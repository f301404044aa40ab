"""Pre-training target builders: `target.name` → a Target (data, parametric teacher), loading the frozen models
they need from checkpoints here, so that the target classes take model objects only. The post-training targets
register in their recipe's builder (`tcsm.recipes.reward.builder`, `tcsm.recipes.distill.builder`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tcsm.builders.frozen import load_frozen
from tcsm.builders.registry import TARGETS, BuildContext, ReferenceUse
from tcsm.core.errors import ConfigError, TCSMError
from tcsm.models.kinds import kind_of
from tcsm.targets.parametric import TEACHERS, ParametricTarget, Teacher, make_teacher

__all__ = ["ParametricTargetConfig", "load_teacher"]


# --------------------------------------------------------------------------------------------------- target


@dataclass
class DataTargetConfig:
    name: str = "data"


@TARGETS.register("data", schema=DataTargetConfig)
def build_data_target(node: dict, ctx: BuildContext):
    """Monte Carlo target from data samples: x_1 ~ data, x_t ~ p_{t|1} (MATH.md §3.4)."""
    from tcsm.targets import DataTarget

    return DataTarget()


# --------------------------------------------------------------------------------------------------- registry
# `target.name: parametric` with `reference.path: <checkpoint of an LM run>` (`tcsm train -c mlm | causal-lm | hollow`).


@dataclass
class ParametricTargetConfig:
    """The teacher is the run's frozen model, `reference.path` (an LM run: tcsm train -c mlm | causal-lm | hollow)."""

    name: str = "parametric"
    estimator: str = field(
        default="exact", metadata={"help": "AR teachers: exact | topk | taylor (MATH.md §5.4)"}
    )
    k: int = field(default=8, metadata={"help": "topk: candidates per position"})
    temperature: float = field(default=1.0, metadata={"help": "taylor: ℓ is divided by this"})
    max_tokens: int = field(
        default=1 << 16, metadata={"help": "tokens per teacher forward pass (memory bound)"}
    )
    cache_size: int = field(default=0, metadata={"help": "sequences whose teacher conditionals are memoised"})
    autocast: bool = field(
        default=False, metadata={"help": "run the teacher under the trainer's bf16 autocast"}
    )


def load_teacher(
    path: str, device="cpu", *, ema: bool = True, vocab_size: int | None = None, **options
) -> Teacher:
    """The frozen teacher of an LM checkpoint written by `tcsm train` (EMA weights by default).
    `options` go to the family's teacher (estimator / k / temperature for AR, max_tokens for MLM)."""
    model = load_frozen(
        path, role="reference.path (the teacher)", families=tuple(TEACHERS), ema=ema, device=device, vocab_size=vocab_size
    ).model
    family = kind_of(model).family
    return make_teacher(model, family, **TEACHERS[family].accepted(options))


def _register_parametric() -> None:
    def build(node: dict, ctx):
        node = dict(node)
        if ctx.reference is None:
            raise ConfigError(
                "reference.path must name the teacher: the checkpoint of an LM run (tcsm train -c mlm ...)"
            )
        cache_size = node.pop("cache_size")
        try:
            family = kind_of(ctx.reference).family
            teacher = make_teacher(ctx.reference, family, **TEACHERS[family].accepted(node))
        except TCSMError:
            raise
        except ValueError as e:  # an estimator option out of range
            raise ConfigError(f"target: {e}") from None
        return ParametricTarget(teacher, cache_size=cache_size)

    TARGETS.register(
        "parametric",
        build,
        schema=ParametricTargetConfig,
        overwrite=True,
        reference=ReferenceUse("reference.path (the teacher)", families=tuple(TEACHERS)),
        help="explicit N^1 target from a frozen LM (BERT / AR / Hollow; MATH.md §4)",
    )


_register_parametric()
