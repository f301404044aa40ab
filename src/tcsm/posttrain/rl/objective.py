"""GRPO for diffusion LMs on the objective contract: `objective(model, batch, generator) → (loss, metrics)`.

A call takes the batch's prompts (`Batch.cond_mask`; none: unconditional groups), draws G rollouts per prompt with
the run's sampler (`sampling.settings.draw`, prompt pinned through `fixed` / `values`), scores them with the reward
(a reward function of `rewards.functions`: tokens [B, L] → [B]), turns the rewards into group-relative
advantages and returns the clipped GRPO loss on the estimator's sequence log-likelihoods (`loss.grpo_loss`).

Inner updates: a rollout group serves `num_iterations` consecutive optimizer steps (GRPO's μ). It is drawn on steps
s with s mod μ = 0 and kept in a buffer, one group per micro-batch of the step; the old policy's ℓ for iteration
k ≥ 1 is computed when the group is drawn, with iteration k's noise seed, so that each ratio compares the same
noise; at k = 0 the old policy is the current one (ρ = 1 exactly). The step count comes from the trainer's
callbacks (`TrainerCallback`), the buffer travels with checkpoints (`KeepsState`), and every draw uses the
generator the trainer hands to the call (seeded by run seed, step and micro-batch), so a resumed run replays the
uninterrupted one exactly (one process: the checkpoint holds rank 0's buffer).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from tcsm.core.batch import as_batch
from tcsm.core.errors import TrainingError
from tcsm.core.protocols import StepInfo
from tcsm.core.results import summarise_nats
from tcsm.evaluation.likelihood import nelbo
from tcsm.models.kinds import kind_of
from tcsm.models.modes import eval_mode
from tcsm.posttrain.rl.advantages import group_advantages
from tcsm.posttrain.rl.estimators import ExactEstimate, SequenceLogLikelihood, through_first_eos
from tcsm.posttrain.rl.loss import grpo_loss
from tcsm.rewards.functions import RewardFn, evaluate_reward
from tcsm.sampling.settings import draw

__all__ = ["GRPOObjective", "LeftToRightGRPOObjective", "RolloutGroup"]

_SEED_RANGE = 2**62


@dataclass
class RolloutGroup:
    """One micro-batch's rollouts: tokens [N, L] (N = prompts × G), prompt mask [N, L], rewards and advantages [N],
    the noise seed of each inner iteration [μ], the old policy's ℓ per iteration [μ, N] (row 0 unused: on-policy)
    and the reference's [μ, N] (empty when there is no reference)."""

    tokens: Tensor
    cond: Tensor
    rewards: Tensor
    advantages: Tensor
    seeds: Tensor
    old_logp: Tensor
    ref_logp: Tensor

    def state(self) -> dict:
        return {f.name: getattr(self, f.name).detach().cpu() for f in fields(self)}

    @classmethod
    def from_state(cls, state: dict, device) -> RolloutGroup:
        return cls(**{f.name: torch.as_tensor(state[f.name]).to(device) for f in fields(cls)})


def _generator(seed: Tensor | int, device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(int(seed))


class GRPOObjective:
    """Group-relative policy optimisation with clipped ratios (see the module docstring). `reference`: the frozen
    model of the KL term (None: no KL, reported as 0); `sampler_owner`: an objective that declares its own sampler
    (`core.protocols.Samples`, e.g. left to right for an AR policy), None for the run's path sampler; `success`:
    the reward counted as a solved problem by the accuracy metric (`reward` None: an objective that only scores a
    saved run, `evaluate`); `prompt_len`: for batches without a
    `cond_mask`, the leading positions taken as the prompt (0: unconditional groups); `eos_id`: the end-of-sequence
    token after whose first occurrence in a completion the tokens are left out of the loss, as d1 does (None, or
    `keep_after_eos`: every completion token counts)."""

    def __init__(self, path, estimator: SequenceLogLikelihood, reward: RewardFn, *, settings, group_size: int,
                 clip_eps: float = 0.2, kl_coef: float = 0.0, reference=None, num_iterations: int = 1,
                 per_token: bool = True, scale_advantages: bool = True, sampler_owner=None,
                 reward_chunk: int | None = None, success: float = 1.0, prompt_len: int = 0,
                 eos_id: int | None = None, keep_after_eos: bool = False):  # fmt: skip
        if int(group_size) < 2:
            raise ValueError(f"group_size must be >= 2 (advantages compare a prompt's rollouts), got {group_size}")
        if int(num_iterations) < 1:
            raise ValueError(f"num_iterations must be >= 1, got {num_iterations}")
        if not 0.0 < float(clip_eps) < 1.0:
            raise ValueError(f"clip_eps must be in (0, 1), got {clip_eps}")
        if float(kl_coef) < 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef}")
        self.path, self.estimator, self.reward, self.settings = path, estimator, reward, settings
        self.group_size, self.clip_eps, self.kl_coef = int(group_size), float(clip_eps), float(kl_coef)
        self.reference, self.num_iterations, self.per_token = reference, int(num_iterations), bool(per_token)
        self.scale_advantages, self.sampler_owner = bool(scale_advantages), sampler_owner
        self.reward_chunk, self.success, self.prompt_len = reward_chunk, float(success), int(prompt_len)
        self.eos_id = None if eos_id is None or keep_after_eos else int(eos_id)
        self.step, self._calls = 0, 0
        self.buffer: list[RolloutGroup] = []
        self.device = torch.device("cpu")  # where a restored buffer goes

    def to(self, device) -> GRPOObjective:
        self.device = torch.device(device)
        return self

    # ------------------------------------------------------------------------------------------ trainer hooks

    def on_fit_start(self, info: StepInfo) -> None:
        self.step, self._calls = int(info.step), 0

    def on_step_end(self, info: StepInfo) -> None:
        self.step, self._calls = int(info.step), 0
        if self.step % self.num_iterations == 0:  # the next step draws afresh
            self.buffer = []

    def training_state(self) -> dict:
        return {"step": self.step, "groups": [g.state() for g in self.buffer]}

    def load_training_state(self, state: dict) -> None:
        self.step, self._calls = int(state["step"]), 0
        self.buffer = [RolloutGroup.from_state(g, self.device) for g in state["groups"]]

    def _keep(self, tokens: Tensor, cmask: Tensor | None) -> Tensor | None:
        """The completion tokens the loss scores: through the first end-of-sequence token (None: all)."""
        return None if self.eos_id is None else through_first_eos(tokens, cmask, self.eos_id)

    # ------------------------------------------------------------------------------------------ rollouts

    @torch.no_grad()
    def rollouts(self, model, x1: Tensor, cond: Tensor, generator) -> RolloutGroup:
        """G draws per prompt row of x1 [B, L] (prompt = cond), their rewards, advantages, noise seeds and the old
        and reference log-likelihoods."""
        B, L = x1.shape
        G, mu = self.group_size, self.num_iterations
        xs, cs = x1.repeat_interleave(G, 0), cond.repeat_interleave(G, 0)
        pinned = bool(cs.any())
        with eval_mode(model):
            tokens, _ = draw(model, self.path, B * G, L, self.settings, objective=self.sampler_owner,
                             generator=generator, device=x1.device, fixed=cs if pinned else None,
                             values=xs if pinned else None)  # fmt: skip
        if tokens is None:
            raise TrainingError("the policy has no sampler for rollouts; choose a model with one (a denoiser or an AR LM)")
        if self.reward is None:
            raise TrainingError("this GRPO objective was built without a reward (to score a saved run); it cannot train")
        tokens = torch.where(cs, xs, tokens.to(x1.device).long())
        rewards = evaluate_reward(self.reward, tokens, self.reward_chunk)
        if not bool(torch.isfinite(rewards).all()):
            bad = rewards[~torch.isfinite(rewards)][0].item()
            raise TrainingError(f"the reward returned {bad} for a rollout; a GRPO reward must be a finite number per sequence")
        adv = group_advantages(rewards.view(B, G), scale=self.scale_advantages).reshape(-1)
        seeds = torch.randint(0, _SEED_RANGE, (mu,), generator=generator, device=x1.device).cpu()
        cmask = cs if pinned else None
        sign = torch.sign(adv)
        keep = self._keep(tokens, cmask)
        old = torch.zeros(mu, B * G, device=x1.device)
        for k in range(1, mu):
            old[k] = self.estimator(model, tokens, cmask, _generator(seeds[k], x1.device), sign, keep=keep).float()
        ref = torch.zeros(0, B * G, device=x1.device)
        if self.reference is not None:
            ref = torch.stack([self.estimator(self.reference, tokens, cmask, _generator(s, x1.device), sign,
                                              keep=keep).float() for s in seeds])  # fmt: skip
        return RolloutGroup(tokens, cs, rewards, adv, seeds, old, ref)

    # ------------------------------------------------------------------------------------------ the loss

    def __call__(self, model, batch, generator=None) -> tuple[Tensor, dict[str, Tensor]]:
        b = as_batch(batch)
        x1 = b.x1.long()
        if b.cond_mask is not None:
            cond = b.cond_mask.to(torch.bool)
        else:  # rows without a prompt mask: their first `prompt_len` tokens are the prompt
            cond = torch.zeros_like(x1, dtype=torch.bool)
            cond[:, : self.prompt_len] = True
        k, it = self._calls, self.step % self.num_iterations
        self._calls += 1
        if it == 0:
            group = self.rollouts(model, x1, cond, generator)
            self.buffer = self.buffer[:k] + [group]
        elif k < len(self.buffer):
            group = self.buffer[k]
        else:
            raise TrainingError(
                f"no buffered rollouts for micro-batch {k} at inner iteration {it} of {self.num_iterations}: the "
                "run was resumed from a checkpoint without its rollout buffer; resume from a step that is a multiple "
                "of num_iterations"
            )
        pinned = bool(group.cond.any())
        cmask = group.cond if pinned else None
        sign = torch.sign(group.advantages)
        keep = self._keep(group.tokens, cmask)
        logp = self.estimator(model, group.tokens, cmask, _generator(group.seeds[it], x1.device), sign,
                              keep=keep).float()  # fmt: skip
        old = logp.detach() if it == 0 else group.old_logp[it]
        ref = group.ref_logp[it] if group.ref_logp.shape[0] else None
        scored = ~group.cond if keep is None else ~group.cond & keep
        n = scored.sum(-1) if self.per_token else None
        terms = grpo_loss(logp, old, group.advantages, clip_eps=self.clip_eps, ref_logp=ref, kl_coef=self.kl_coef,
                          num_tokens=n)  # fmt: skip
        r = group.rewards
        groups = r.view(-1, self.group_size)
        flat = (groups == groups[:, :1]).all(-1).float()  # all rewards of the group equal: zero advantage, no gradient
        if it == 0 and bool(flat.all()):
            warnings.warn(f"GRPO step {self.step + 1}: every group's rewards are equal (zero advantages, no policy "
                          "gradient); a harder or easier task, a larger --group-size or a denser reward gives signal",
                          RuntimeWarning, stacklevel=2)  # fmt: skip
        metrics = {
            "loss": terms.loss.detach(),
            "reward": r.mean(),
            "reward_std": r.std() if r.numel() > 1 else torch.zeros((), device=r.device),
            "accuracy": (r == self.success).float().mean(),
            "flat_groups": flat.mean(),
            "kl": terms.kl,
            "clip_fraction": terms.clip_fraction,
            "adv_std": group.advantages.std() if r.numel() > 1 else torch.zeros((), device=r.device),
            "ratio": terms.ratio,
        }
        return terms.loss, metrics

    def log_line(self, row: dict) -> str:
        """The figures a user watches, from a log row of this objective's metrics (averaged over the log window)."""
        return (f"reward {row['reward']:.4g} (std {row['reward_std']:.3g}), accuracy {row['accuracy']:.3f}, flat "
                f"groups {100 * row['flat_groups']:.0f}%, kl {row['kl']:.3g}, clip fraction {row['clip_fraction']:.3f}")

    # ------------------------------------------------------------------------------------------ validation

    def _prompt(self, x1: Tensor, cond: Tensor | None) -> Tensor:
        if cond is not None:
            return cond.to(device=x1.device, dtype=torch.bool)
        mask = torch.zeros_like(x1, dtype=torch.bool)
        mask[:, : self.prompt_len] = True
        return mask

    @torch.no_grad()
    def evaluate(self, model, data, *, batch_size: int = 64, generator=None, device=None, **_) -> dict:
        """The policy's −log p(completion | prompt) per completion token on held-out rows: the completion | prompt
        bound with 4 stratified times for a denoiser (MATH.md §2.4), the exact NLL for an autoregressive model."""
        rows = data.to_batch() if hasattr(data, "to_batch") else as_batch(data)
        device = rows.x1.device if device is None else torch.device(device)
        N, L = rows.x1.shape
        exact = kind_of(model).is_autoregressive
        nats = []
        with eval_mode(model):
            for s in range(0, N, int(batch_size)):
                x1 = rows.x1[s : s + batch_size].to(device).long()
                cond = self._prompt(x1, None if rows.cond_mask is None else rows.cond_mask[s : s + batch_size])
                cmask = cond if bool(cond.any()) else None
                if exact:
                    nll = -ExactEstimate(self.path)(model, x1, cmask).double()
                else:
                    nll = nelbo(model, x1, self.path, num_t=4, generator=generator, cond_mask=cmask).double()
                nats.append((nll / (~cond).sum(-1).clamp_min(1)).cpu())
        label = "exact NLL" if exact else "bound"
        return summarise_nats(torch.cat(nats), L, f"{label}, completion | prompt")

    def __repr__(self) -> str:
        return (f"GRPOObjective({self.estimator.name}, G={self.group_size}, clip_eps={self.clip_eps}, "
                f"kl_coef={self.kl_coef}, num_iterations={self.num_iterations})")  # fmt: skip


class LeftToRightGRPOObjective(GRPOObjective):
    """GRPO on an autoregressive policy: the run samples it left to right, so the objective declares that sampler
    (`core.protocols.Samples`, as the LM objective does) by handing over to `sampler_owner`."""

    sampler = "left_to_right"

    def sample(self, model, num: int, length: int, generator=None, device=None, *, settings=None, fixed=None,
               values=None):  # fmt: skip
        return self.sampler_owner.sample(model, num, length, generator, device, settings=settings, fixed=fixed,
                                         values=values)  # fmt: skip
