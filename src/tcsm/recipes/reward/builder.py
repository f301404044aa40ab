"""Reward fine-tuning's builder (MATH.md §5.2): `target.name: reward`, a reward-tilted target around the frozen
pre-trained model, with the checks that the reward is defined on the run's data. Siblings: `targets` (the N^1 /
N^full targets), `tcsm.rewards` (reward functions and their domains, shared by every method), `recipe` (the run config and report)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tcsm.builders.registry import TARGETS, ReferenceUse
from tcsm.core.errors import ConfigError
from tcsm.data.tasks import run_task_options
from tcsm.posttrain.reward.targets import RewardFullTarget, RewardN1Target, RewardTarget
from tcsm.rewards.domain import check_reward_domain
from tcsm.rewards.functions import GridReward, make_reward, reward_specs

__all__ = ["RewardTargetConfig", "build_reward_target", "check_reward_domain"]


# ---------------------------------------------------------------------------------------------------
# registry entry: `target.name: reward`
# ---------------------------------------------------------------------------------------------------


@dataclass
class RewardTargetConfig:
    """The pre-trained diffusion model p_1 is tilted around is the run's frozen model, `reference.path`."""

    name: str = "reward"
    reward: str = field(
        default="grid",
        metadata={"help": f"reward spec: {reward_specs()} (tcsm.rewards.functions)"},
    )
    beta: float = field(default=1.0, metadata={"help": "temperature β of p^R ∝ p_1 e^{R/β}"})
    neighbourhood: str = field(
        default="full", metadata={"help": "full (SNIS, MATH.md §5.2) | n1 (explicit q^{R,i})", "choices": ("full", "n1")}
    )
    num_proposals: int = field(default=8, metadata={"help": "N^full: proposals B per noisy state"})
    reward_floor: float | None = field(
        default=None,
        metadata={"help": "N^full: skip groups whose rewards are all <= this (e.g. -1e4 for R=-1e5)"},
    )
    xt_source: str = field(
        default="pretrained",
        metadata={"help": "x_t from noised: data | pretrained | model samples", "choices": ("data", "pretrained", "model")},
    )
    h: str = field(default="clean", metadata={"help": "N^1: x_1 given x_t: clean | pretrained | model"})
    sample_steps: int = field(default=64, metadata={"help": "sampler steps of the x_t sample pool"})
    pool_size: int = field(default=1024, metadata={"help": "samples in the x_t pool"})
    refresh_every: int = field(
        default=0, metadata={"help": "redraw the pool every this many calls (0: once)"}
    )
    prompt: str | None = field(
        default=None, metadata={"help": "text prompt pinned at the start of every sequence"}
    )
    reward_chunk: int = field(default=8192, metadata={"help": "sequences per reward call (memory)"})


#: The data a reward is defined on: the grid reward scores points of a W × W grid (data.kind=grid), the text rewards
#: score decoded text (data kinds whose tokens are text). Rewards not listed (hf, python) bring their own domain.
def build_reward_target(node: dict, ctx) -> RewardTarget:
    """`target.name: reward`: N^full / N^1 reward-tilted target around a frozen pre-trained checkpoint (§5.2)."""
    node = dict(node)
    pre = ctx.reference
    if pre is None:
        raise ConfigError("reference.path must name the pre-trained checkpoint (tcsm finetune reward --from RUN)")
    check_reward_domain(node["reward"], ctx)
    decode = getattr(ctx.data, "decode", None)
    try:
        reward = make_reward(node["reward"], decode=decode, vocab_size=ctx.vocab_size,
                             task_options=run_task_options(ctx.config.data))
    except (ValueError, ImportError) as e:
        raise ConfigError(f"target.reward: {e}") from None
    if isinstance(reward, GridReward) and reward.width != ctx.vocab_size:
        raise ConfigError(
            f"target.reward: a grid reward of width {reward.width} on a {ctx.vocab_size}×{ctx.vocab_size} grid; "
            "leave width out (it defaults to the data's)"
        )
    if node.get("prompt"):
        from tcsm.data.unknown import warn_unknown_prompt

        warn_unknown_prompt(ctx.data.tokenizer, node["prompt"], f"target.prompt {node['prompt'][:30]!r}")
    prompt = ctx.data.encode(node["prompt"]) if node.get("prompt") else None
    common = {
        "xt_source": node["xt_source"],
        "sample_steps": node["sample_steps"],
        "pool_size": node["pool_size"],
        "refresh_every": node["refresh_every"],
        "prompt": prompt,
        "reward_chunk": node["reward_chunk"],
    }
    try:
        if node["neighbourhood"] == "full":
            target = RewardFullTarget(
                pre,
                reward,
                node["beta"],
                num_proposals=node["num_proposals"],
                reward_floor=node["reward_floor"],
                **common,
            )
        elif node["neighbourhood"] == "n1":
            target = RewardN1Target(pre, reward, node["beta"], h=node["h"], **common)
        else:
            raise ValueError(f"neighbourhood must be full or n1, got {node['neighbourhood']!r}")
    except ValueError as e:
        raise ConfigError(f"target: {e}") from None
    return target


def _register_reward() -> None:
    TARGETS.register(
        "reward",
        build_reward_target,
        schema=RewardTargetConfig,
        overwrite=True,
        reference=ReferenceUse("reference.path (the pre-trained model)"),
        help="reward-tilted target p^R ∝ p_1 e^{R/β} around a frozen pre-trained model (MATH.md §5.2)",
    )


_register_reward()
