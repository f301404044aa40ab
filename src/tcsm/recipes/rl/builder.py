"""GRPO's builder: `objective.name: grpo`, the group-relative clipped policy gradient (`tcsm.posttrain.rl`) with
the run's frozen model as the KL reference, checked against the run's model, path, data and reward before any work."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from typing import Optional

import torch

from tcsm.builders.registry import OBJECTIVES, ReferenceUse
from tcsm.core.errors import ConfigError
from tcsm.data.tasks import run_task_options
from tcsm.models.kinds import kind_of
from tcsm.posttrain.rl.estimators import ESTIMATORS, make_estimator
from tcsm.rewards.domain import check_reward_domain
from tcsm.rewards.functions import evaluate_reward, make_reward, reward_specs

__all__ = ["GRPOObjectiveConfig", "build_grpo_objective"]


@dataclass
class _GRPOConfig:
    """The KL reference is the run's frozen model, `reference.path` (the run it starts from)."""

    name: str = "grpo"
    reward: str | None = field(
        default=None,
        metadata={"help": f"reward spec, as tcsm finetune reward's: {reward_specs()}"},
    )
    estimator: str = field(
        default="one_step",
        metadata={"help": "sequence log-likelihood: " + " | ".join(f"{c.name} ({c.help})" for c in ESTIMATORS.values()),
                  "choices": ESTIMATORS.names()},
    )
    group_size: int = field(default=8, metadata={"help": "rollouts G per prompt (>= 2)"})
    clip_eps: float = field(default=0.2, metadata={"help": "PPO clip range ε of the ratio"})
    kl_coef: float = field(default=0.04, metadata={"help": "weight of the k3 KL to the reference (0: off)"})
    num_iterations: int = field(default=1, metadata={"help": "optimizer steps per rollout batch (GRPO's μ)"})
    per_token: bool = field(default=True, metadata={"help": "divide log-ratios by the completion length (ESPO)"})
    scale_advantages: bool = field(default=True, metadata={"help": "divide advantages by the group's std (d1: false)"})
    prompt_len: int = field(default=0, metadata={"help": "rows without a prompt mask: leading prompt positions"})
    success: float = field(default=1.0, metadata={"help": "the reward counted as solved (accuracy)"})
    reward_chunk: int = field(default=8192, metadata={"help": "sequences per reward call (memory)"})
    eos_id: Optional[int] = field(  # noqa: UP045
        default=None,
        metadata={"help": "end-of-sequence token: completion tokens after its first occurrence are left out of the "
                          "loss, as d1 does (null: sample.eos_id, else the data's end-of-sequence token)"},
    )  # fmt: skip
    keep_after_eos: bool = field(default=False, metadata={"help": "score every completion token, padding included"})


def _estimator_fields() -> list[tuple]:
    """Every registered estimator's options, each once, as keys of the `objective:` section (help: whose it is)."""
    out: dict[str, tuple] = {}
    for cls in ESTIMATORS.values():
        for f in fields(cls.settings_type):
            default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
            meta = {**f.metadata, "help": f"{cls.name}: {f.metadata.get('help', '')}"}
            out.setdefault(f.name, (f.name, f.type, field(default=default, metadata=meta)))
    return list(out.values())


#: the `objective:` section of `objective.name: grpo`: GRPO's keys and every registered estimator's options
GRPOObjectiveConfig = make_dataclass("GRPOObjectiveConfig", _estimator_fields(), bases=(_GRPOConfig,))
GRPOObjectiveConfig.__module__ = __name__


def _estimator(node: dict, path):
    name = node["estimator"]
    if name not in ESTIMATORS:
        raise ConfigError(f"objective.estimator={name!r} is unknown; choose one of {list(ESTIMATORS.names())}")
    if name != "elbo" and node.get("upper", "none") != "none":
        raise ConfigError(f"objective.upper={node['upper']} is SPG's upper bound of the elbo estimate; the {name} "
                          "estimate has none: give --estimator elbo, or drop --upper")  # fmt: skip
    return make_estimator(name, path, node)


def _reward(node: dict, ctx):
    spec = node["reward"]
    if not spec:
        raise ConfigError("objective.reward is not set; give the task's reward: tcsm finetune rl --reward task:NAME")
    check_reward_domain(spec, ctx, "objective.reward=")
    try:
        reward = make_reward(spec, decode=getattr(ctx.data, "decode", None), vocab_size=ctx.vocab_size,
                             task_options=run_task_options(ctx.config.data))
        rows = ctx.data.split("train")
        rows = getattr(rows, "x1", rows)[:2].long()  # prompted kinds hold rows with their prompt mask
        r = evaluate_reward(reward, rows)
    except (ValueError, ImportError, TypeError, RuntimeError, AttributeError) as e:
        raise ConfigError(f"objective.reward={spec}: {e}") from None
    if r.dtype == torch.bool or not bool(torch.isfinite(r).all()):
        raise ConfigError(
            f"objective.reward={spec} returned {r.tolist()} for two training sequences; a reward must be a finite "
            "number per sequence"
        )
    return reward


def _eos(node: dict, ctx) -> int | None:
    """The end-of-sequence id after which completion tokens leave the loss: objective.eos_id, sample.eos_id, the
    data's; checked against the vocabulary."""
    sample = ctx.config.sample
    eos = node.get("eos_id")
    if eos is None:
        eos = sample.get("eos_id") if hasattr(sample, "get") else getattr(sample, "eos_id", None)
    if eos is None:
        eos = getattr(ctx.data, "eos_id", None)
    if eos is not None and not 0 <= int(eos) < int(ctx.vocab_size):
        raise ConfigError(f"objective.eos_id={eos} is not a token id of the {ctx.vocab_size}-token vocabulary")
    return None if eos is None else int(eos)


def build_grpo_objective(node: dict, ctx):
    """`objective.name: grpo` (MATH.md §5.2's link to RL; `tcsm.posttrain.rl`)."""
    from tcsm.posttrain.rl.objective import GRPOObjective, LeftToRightGRPOObjective
    from tcsm.sampling.settings import sample_settings

    node = dict(node)
    if int(node["group_size"]) < 2:
        raise ConfigError(
            f"objective.group_size={node['group_size']}: GRPO compares each prompt's rollouts with each other, so it "
            "needs at least 2 (--group-size 8 is usual)"
        )
    estimator = _estimator(node, ctx.path)
    why = estimator.supports(ctx.model, ctx.path)
    if why is not None:
        raise ConfigError(f"objective.estimator={node['estimator']} does not fit this run: {why}")
    kind = kind_of(ctx.model)
    if not (kind.is_denoiser or kind.is_autoregressive):
        raise ConfigError(f"GRPO draws rollouts from the policy, and {kind.description} has no sampler")
    owner = None
    if kind.is_autoregressive:
        from tcsm.objectives.lm import make_lm_loss

        owner = make_lm_loss("causal")
    # A saved run is scored (tcsm eval / sample: no target is built) without its reward: it draws no rollouts.
    reward = _reward(node, ctx) if ctx.target is not None else None
    cls = GRPOObjective if owner is None else LeftToRightGRPOObjective
    return cls(
        ctx.path, estimator, reward, settings=sample_settings(ctx.config.sample), group_size=node["group_size"],
        clip_eps=node["clip_eps"], kl_coef=node["kl_coef"], reference=ctx.reference,
        num_iterations=node["num_iterations"], per_token=node["per_token"],
        scale_advantages=node["scale_advantages"], sampler_owner=owner, reward_chunk=node["reward_chunk"],
        success=node["success"], prompt_len=node["prompt_len"], eos_id=_eos(node, ctx),
        keep_after_eos=node["keep_after_eos"],
    )  # fmt: skip


OBJECTIVES.register(
    "grpo", build_grpo_objective, schema=GRPOObjectiveConfig, overwrite=True,
    reference=ReferenceUse("reference.path (the KL reference)", families=("denoiser", "causal")),
    help="GRPO for diffusion LMs: group-relative advantages, clipped ratio, k3 KL (tcsm.posttrain.rl)",
)  # fmt: skip
