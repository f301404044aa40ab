"""Reward-tilted targets: fine-tune toward p^R_1 ∝ p_1 · e^{R/β} with a frozen pre-trained denoiser (MATH.md §5.2).

Two neighbourhoods, both plain `Target`s, so the objectives and the trainer are unchanged:

* `RewardN1Target` (N^1): explicit conditionals q^{R,i}(y) ∝ m^pre_i(y | x_t) · e^{R([y, x_1^{≠i}])/β} at every
  loss position, with the V reward calls of a position batched. Use with L_distrib (KL or any f-divergence)
  or the explicit-target score loss.
* `RewardFullTarget` (N^full): B proposals x_{1,b} ~ p^pre_{1|t}(· | x_t) per noisy state (factorized draws with
  carry-over), self-normalised weights w_b = softmax_b(R(x_{1,b})/β) per x_t group. The batch repeats x_t B times
  with `x1` = proposals and `weight` = B·w_b, so L_distrib's Monte Carlo form with the mean reduction gives
  −Σ_b w_b log p^θ(x_{1,b} | x_t) per group (MATH.md §5.2 step 3; the unknown log p^R term is dropped).

Where x_t comes from (`xt_source`; MATH.md §5.2: every full-support choice has the same pointwise minimiser):
"data" noises the batch; "pretrained" (the default) noises samples of the frozen pre-trained model;
"model" noises samples of the model being trained (on-policy; the objective hands it over on every call). The default is "pretrained"
because (1) it needs no dataset — a fine-tune is "checkpoint + reward"; (2) it is a fixed distribution, so the
fine-tuning loss is an ordinary stationary objective (resume, LR schedules and loss curves mean what they
mean in pre-training); (3) it covers where the fine-tuned model will go: p^R_t ≤ p^pre_t · max e^{R/β} / Z, so
for moderate tilts (Z = E_pre e^{R/β} not tiny) on-policy states are well represented. On-policy is better for
strong tilts (small Z), at the price of sampler runs while training and a moving objective.
Samples for "pretrained"/"model" come from a pool of `pool_size` sequences, redrawn every `refresh_every`
calls (0: drawn once), so the sampler's cost is amortised over many steps. The pool is not checkpointed: after
a resume it is redrawn (exact resume holds for xt_source="data"). Rows with their own prompts (`Batch.cond_mask`:
task and instruction data) are not pooled unless the target has its own `prompt`: each call draws one completion of
each row's prompt, so x'_1 has the batch's prompts, as an RL rollout does, and the prompt stays conditioning.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from tcsm.core.batch import Batch, as_batch
from tcsm.models.kinds import denoise
from tcsm.models.modes import eval_mode
from tcsm.paths import ProbabilityPath
from tcsm.rewards.functions import RewardFn, evaluate_reward
from tcsm.targets.base import Target, TargetBatch, freeze

__all__ = [
    "XT_SOURCES",
    "RewardFullTarget",
    "RewardN1Target",
    "RewardTarget",
    "factorized_proposals",
    "snis_weights",
    "tilted_conditionals",
]

XT_SOURCES = ("data", "pretrained", "model")

#: (x_t [N, L], t [N], num B, generator) -> proposals [N, B, L] drawn from p^pre_{1|t}(· | x_t).
Proposal = Callable[[Tensor, Tensor, int, "torch.Generator | None"], Tensor]
#: (x_1 [N, L], x_t [N, L], t [N]) -> log p^pre(x_1^i = y | x_1^{≠i}, x_t) [N, L, V] (a joint model's conditionals).
PreConditional = Callable[[Tensor, Tensor, Tensor], Tensor]


# ---------------------------------------------------------------------------------------------------
# pure math
# ---------------------------------------------------------------------------------------------------


def tilted_conditionals(
    log_pre: Tensor,
    x1: Tensor,
    loss_mask: Tensor,
    reward: RewardFn,
    beta: float,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor]:
    """N^1 reward target: log q^{R,i}(y) = log_softmax_y[log m^pre_i(y) + R([y, x_1^{≠i}])/β] (MATH.md §5.2).

    `log_pre` [N, L, V] holds the pre-trained conditionals (a factorized denoiser's log m^pre_i(· | x_t), or a
    joint model's log p^pre(· | x_1^{≠i}, x_t)). Only loss positions are tilted (V reward calls each, batched);
    other positions get the point mass δ_{x_1^i}. Returns (log_q [N, L, V], loss_mask): positions where every
    candidate has zero target mass (R = −∞ throughout) are dropped from the mask instead of producing NaN.
    """
    N, L, V = log_pre.shape
    log_q = torch.full((N, L, V), -torch.inf, dtype=torch.float32, device=log_pre.device)
    log_q.scatter_(-1, x1.unsqueeze(-1), 0.0)
    b_idx, i_idx = loss_mask.nonzero(as_tuple=True)
    n = b_idx.numel()
    if n == 0:
        return log_q, loss_mask
    ys = torch.arange(V, device=x1.device)
    variants = x1[b_idx].unsqueeze(1).repeat(1, V, 1)  # [n, V, L]: position i of row n set to every y
    variants[torch.arange(n, device=x1.device).unsqueeze(1), ys.unsqueeze(0), i_idx.unsqueeze(1)] = ys
    r = evaluate_reward(reward, variants, chunk_size).double()
    if torch.isposinf(r).any():
        raise ValueError("the reward returned +inf; rewards must be finite or -inf")
    r = torch.where(torch.isnan(r), -torch.inf, r)  # (nan_to_num would also make −inf finite)
    # Subtracting the row maximum first keeps R/β finite for huge |R| and tiny β; it cancels in the softmax.
    r_max = r.max(-1, keepdim=True).values
    shift = torch.where(torch.isfinite(r_max), r - r_max, torch.full_like(r, -torch.inf))
    logits = log_pre[b_idx, i_idx].double() + shift / float(beta)
    ok = torch.isfinite(logits).any(-1)
    tilted = torch.log_softmax(torch.where(ok.unsqueeze(-1), logits, torch.zeros_like(logits)), -1)
    log_q[b_idx[ok], i_idx[ok]] = tilted[ok].float()
    mask = loss_mask.clone()
    mask[b_idx[~ok], i_idx[~ok]] = False
    return log_q, mask


def snis_weights(rewards: Tensor, beta: float, floor: float | None = None) -> tuple[Tensor, Tensor]:
    """Self-normalised weights w_b = softmax_b(R_b/β) within each group [G, B] (MATH.md §5.2 step 2).

    Computed in log space (float64), so R = −10^5 with small β stays finite. A group is skipped (all weights 0,
    `valid` False) when every reward is −∞/NaN, or every reward is ≤ `floor` — e.g. the grid task's −10^5
    is "impossible", and a softmax over equal impossible rewards would otherwise be uniform over them.
    Returns (weights [G, B], valid [G]).
    """
    r = rewards.double()
    if torch.isposinf(r).any():
        raise ValueError("the reward returned +inf; rewards must be finite or -inf")
    r = torch.where(torch.isnan(r), -torch.inf, r)  # (nan_to_num would also make −inf finite)
    usable = torch.isfinite(r)
    if floor is not None:
        usable = usable & (r > float(floor))
    valid = usable.any(-1)
    logits = torch.where(valid.unsqueeze(-1), r / float(beta), torch.zeros_like(r))
    w = torch.softmax(logits, dim=-1)
    w = torch.where(valid.unsqueeze(-1), w, torch.zeros_like(w))
    return w, valid


def factorized_proposals(
    logits: Tensor, xt: Tensor, free: Tensor, num: int, generator: torch.Generator | None = None
) -> Tensor:
    """B draws x_{1,b} ~ Π_{i free} m^i(· | x_t), carrying x_t over elsewhere (MATH.md §5.2 step 1, §6.3 step 1).

    `logits` [N, L, V] from the pre-trained denoiser; `free` [N, L] marks the positions that are drawn (masked:
    the masked positions; uniform: all but pinned ones). Returns LongTensor[N, B, L].
    """
    N, L, V = logits.shape
    probs = torch.softmax(logits.double(), dim=-1).reshape(N * L, V)
    draws = torch.multinomial(probs, int(num), replacement=True, generator=generator)  # [N·L, B]
    draws = draws.reshape(N, L, int(num)).permute(0, 2, 1)
    return torch.where(free.unsqueeze(1), draws, xt.unsqueeze(1))


# ---------------------------------------------------------------------------------------------------
# targets
# ---------------------------------------------------------------------------------------------------


class RewardTarget(Target):
    """Common part of the reward targets: the frozen pre-trained denoiser, R, β, where x_t comes from, prompts.

    `pretrained`: (x_t, t) → logits [N, L, V]; frozen here (eval mode, no grad).
    `sampler`: (denoiser, n, length, path, generator) → LongTensor[n, L]; default `tcsm.sampling.sample` with
    `sample_steps` steps (and the prompt). `prompt` (LongTensor[P]) pins the first P positions of every x_1 and
    x_t: they are conditioning, never a loss position.
    """

    def __init__(
        self,
        pretrained,
        reward: RewardFn,
        beta: float = 1.0,
        *,
        xt_source: str = "pretrained",
        sampler: Callable | None = None,
        sample_steps: int = 64,
        pool_size: int = 1024,
        refresh_every: int = 0,
        prompt: Tensor | None = None,
        reward_chunk: int | None = 8192,
    ):
        if not beta > 0:
            raise ValueError(f"beta must be > 0, got {beta}")
        if xt_source not in XT_SOURCES:
            raise ValueError(f"unknown xt_source {xt_source!r}; choose one of {list(XT_SOURCES)}")
        self.pretrained = freeze(pretrained)
        self.reward, self.beta = reward, float(beta)
        self.xt_source = xt_source
        self.sampler = sampler
        self.sample_steps, self.pool_size, self.refresh_every = (
            int(sample_steps),
            int(pool_size),
            int(refresh_every),
        )
        self.prompt = None if prompt is None else torch.as_tensor(prompt, dtype=torch.long)
        self.reward_chunk = reward_chunk
        self._pool: Tensor | None = None
        self._pool_calls = 0

    # --- plumbing -----------------------------------------------------------------------------------
    def to(self, device) -> RewardTarget:
        if isinstance(self.pretrained, torch.nn.Module):
            self.pretrained.to(device)
        if self.prompt is not None:
            self.prompt = self.prompt.to(device)
        self._pool = None if self._pool is None else self._pool.to(device)
        return self

    def _denoise(self, denoiser, xt: Tensor, t: Tensor, x1: Tensor) -> Tensor:
        """Logits of a denoiser without grad, in eval mode (restoring a training model's mode afterwards); a block
        model reads the clean blocks before each noisy one from x1 (MATH.md §9)."""
        with eval_mode(denoiser), torch.no_grad():
            return denoise(denoiser, xt, t, x1).float()

    def _source_model(self, which: str, model):
        if which == "model":
            if model is None:
                raise ValueError("on-policy sampling needs the model being trained: pass model= to the target")
            return model
        return self.pretrained

    def _pin(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Write the prompt into x [N, L]; returns (x, pinned mask)."""
        pinned = torch.zeros_like(x, dtype=torch.bool)
        if self.prompt is None:
            return x, pinned
        P = self.prompt.numel()
        if P > x.shape[1]:
            raise ValueError(f"prompt of {P} tokens is longer than the sequence length {x.shape[1]}")
        x = x.clone()
        x[:, :P] = self.prompt.to(x.device)
        pinned[:, :P] = True
        return x, pinned

    def _draw_samples(self, denoiser, n: int, length: int, path: ProbabilityPath, generator) -> Tensor:
        with eval_mode(denoiser), torch.no_grad():
            if self.sampler is not None:
                return self.sampler(denoiser, n, length, path, generator)
            from tcsm.sampling.settings import draw_pool  # lazy: only the sample-pool sources draw

            return draw_pool(denoiser, path, n, length, self.sample_steps, prompt=self.prompt, generator=generator,
                             chunk_size=512)  # fmt: skip

    def _rows_prompted(self, cond: Tensor | None) -> bool:
        """Whether sampled x'_1 complete the batch's own prompts: rows with prompts and no `prompt` of the target's
        (which, when given, is what every sample continues)."""
        return self.prompt is None and cond is not None and bool(cond.any())

    def _complete_prompts(self, denoiser, x1: Tensor, cond: Tensor, path: ProbabilityPath, generator) -> Tensor:
        """One draw per row of x1 [N, L] with its prompt positions (cond) fixed to x1's: the run's default sampler
        with `sample_steps` steps (a block model block by block through its KV cache)."""
        from tcsm.sampling.settings import draw, sample_settings  # lazy: only the sampling sources draw

        with eval_mode(denoiser), torch.no_grad():
            tokens, _ = draw(denoiser, path, x1.shape[0], x1.shape[1], sample_settings({}, steps=self.sample_steps),
                             generator=generator, device=x1.device, fixed=cond, values=x1)  # fmt: skip
        return torch.where(cond, x1, tokens.to(x1.device).long())

    def _clean_for_xt(self, x1: Tensor, path: ProbabilityPath, generator, model, cond: Tensor | None = None) -> Tensor:
        """The clean sequences that are noised into x_t (MATH.md §5.2: data, pre-trained or current samples; the
        samples complete the batch's prompts where its rows have them)."""
        if self.xt_source == "data":
            return x1
        if self._rows_prompted(cond):
            return self._complete_prompts(self._source_model(self.xt_source, model), x1, cond, path, generator)
        expired = self.refresh_every > 0 and self._pool_calls >= self.refresh_every
        if self._pool is None or expired or self._pool.shape[1] != x1.shape[1]:
            size = max(self.pool_size, x1.shape[0])
            self._pool = self._draw_samples(
                self._source_model(self.xt_source, model), size, x1.shape[1], path, generator
            )
            self._pool = self._pool.to(x1.device)
            self._pool_calls = 0
        self._pool_calls += 1
        idx = torch.randint(
            0,
            self._pool.shape[0],
            (x1.shape[0],),
            generator=generator,
            device=generator.device if generator is not None else None,
        ).to(self._pool.device)
        return self._pool[idx]

    def noisy_states(
        self, batch: Batch | Tensor, t: Tensor, path: ProbabilityPath, generator=None, model=None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(x'_1, x_t, loss_mask): x'_1 from the x_t source (prompt pinned), x_t ~ p_{t|1}(· | x'_1) with the
        prompt and the batch's conditioning positions kept clean, loss positions = the path's minus those."""
        batch = as_batch(batch)
        clean, pinned = self._pin(self._clean_for_xt(batch.x1, path, generator, model, batch.cond_mask))
        if batch.cond_mask is not None and (self.xt_source == "data" or self._rows_prompted(batch.cond_mask)):
            pinned = pinned | batch.cond_mask
        xt = path.draw_xt(clean, t, generator)
        xt = torch.where(pinned, clean, xt)
        return clean, xt, path.loss_mask(xt) & ~pinned

    def proposals(self, denoiser, xt: Tensor, t: Tensor, free: Tensor, num: int, generator=None, *, x1) -> Tensor:
        """Factorized draws [N, num, L] from a denoiser's p_{1|t}(· | x_t) with carry-over (a block model's blocks
        given the clean blocks of x1 before them)."""
        return factorized_proposals(self._denoise(denoiser, xt, t, x1), xt, free, num, generator)


class RewardN1Target(RewardTarget):
    """N^1 reward target for L_distrib (MATH.md §5.2, corrected order, §8 item 15).

    (1) t given; (2) x'_1 from the x_t source; (3) x_t ~ p_{t|1}(· | x'_1); (4) x_1 ~ h(· | x_t) with
    `h` = "clean" (x_1 = x'_1), "pretrained" (factorized redraw from p^pre_{1|t}) or "model" (on-policy);
    (5) log_q = tilted_conditionals(log m^pre(· | x_t), x_1). `pre_conditional(x_1, x_t, t)` replaces the
    factorized m^pre by a joint model's conditionals p^pre(· | x_1^{≠i}, x_t) (with which a joint student
    recovers p^R_{1|t} exactly; a factorized student converges to E_h[q^{R,i}], biased unless h is on-policy).
    With `divergence="reverse_kl"` the per-site loss is KL(m_θ ‖ m^pre) − E_{m_θ}[R]/β + const (App. E's RL
    form), summed exactly over the V tokens, so no score-function gradient is needed (MATH.md §8 item 17).
    """

    def __init__(
        self,
        pretrained,
        reward,
        beta=1.0,
        *,
        h: str = "clean",
        pre_conditional: PreConditional | None = None,
        **kw,
    ):
        super().__init__(pretrained, reward, beta, **kw)
        if h not in ("clean", "pretrained", "model"):
            raise ValueError(f"unknown N^1 proposal h {h!r}; choose clean, pretrained or model")
        self.h, self.pre_conditional = h, pre_conditional

    def __call__(self, batch, t, path, generator=None, *, model=None):
        clean, xt, mask = self.noisy_states(batch, t, path, generator, model)
        if self.h != "clean":
            clean = self.proposals(self._source_model(self.h, model), xt, t, mask, 1, generator, x1=clean)[:, 0]
        if self.pre_conditional is not None:
            with torch.no_grad():
                log_pre = self.pre_conditional(clean, xt, t).float()
        else:
            log_pre = torch.log_softmax(self._denoise(self.pretrained, xt, t, clean), -1)
        log_q, mask = tilted_conditionals(log_pre, clean, mask, self.reward, self.beta, self.reward_chunk)
        stats = {"reward_positions": mask.float().mean()}
        return TargetBatch(xt=xt, t=t, x1=clean, loss_mask=mask, log_q=log_q, stats=stats)


class RewardFullTarget(RewardTarget):
    """N^full reward target with self-normalised importance sampling (MATH.md §5.2 `alg:reward_guided_training`,
    corrected, §8 item 16).

    Per noisy state x_t: B = `num_proposals` draws from `proposal` (default: factorized p^pre_{1|t} with
    carry-over), w = softmax_b(R/β) per group (`snis_weights`, groups with no usable reward skipped, weight 0).
    The returned batch has N·B rows: x_t repeated, x1 = proposals, weight = B·w, Monte Carlo target (log_q None).
    """

    def __init__(
        self,
        pretrained,
        reward,
        beta=1.0,
        *,
        num_proposals: int = 8,
        reward_floor: float | None = None,
        proposal: Proposal | None = None,
        **kw,
    ):
        super().__init__(pretrained, reward, beta, **kw)
        if int(num_proposals) < 1:
            raise ValueError(f"num_proposals must be >= 1, got {num_proposals}")
        self.num_proposals, self.reward_floor, self.proposal = int(num_proposals), reward_floor, proposal

    def __call__(self, batch, t, path, generator=None, *, model=None):
        clean, xt, mask = self.noisy_states(batch, t, path, generator, model)
        N, L = xt.shape
        B = self.num_proposals
        if self.proposal is not None:
            with torch.no_grad():
                props = self.proposal(xt, t, B, generator).long()
        else:
            props = self.proposals(self.pretrained, xt, t, mask, B, generator, x1=clean)
        rewards = evaluate_reward(self.reward, props, self.reward_chunk)  # [N, B]
        w, valid = snis_weights(rewards, self.beta, self.reward_floor)
        with torch.no_grad():
            ess = torch.where(valid, 1.0 / (w**2).sum(-1).clamp_min(1e-300), torch.zeros_like(w[:, 0]))
            finite = torch.isfinite(rewards)
            # Means over possibly empty selections are NaN by design (no finite reward / no usable group).
            stats = {
                "reward_mean": rewards[finite].mean(),
                "reward_weighted": (w * torch.nan_to_num(rewards.double(), neginf=0.0)).sum(-1)[valid].mean(),
                "groups_skipped": 1.0 - valid.double().mean(),
                "ess_fraction": torch.nan_to_num(ess[valid].mean() / B, nan=0.0),
            }
        rep = lambda v: v.repeat_interleave(B, dim=0)
        return TargetBatch(
            xt=rep(xt),
            t=rep(t),
            x1=props.reshape(N * B, L),
            loss_mask=rep(mask),
            weight=(w * B).reshape(N * B).to(torch.float32),
            stats=stats,
        )
