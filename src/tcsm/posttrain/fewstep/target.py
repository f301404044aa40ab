"""The multi-step teacher target p_{1|t}^{T,K}(x_1 | x_t) (MATH.md §10): the law of the x_1 that the teacher's K-step
sampler reaches when started from x_t at a point t = t_k of its grid t_k = k/K.

`teacher_rollout` runs that sampler — the ancestral step of `tcsm.sampling.samplers` (MATH.md §6.1 / §6.2: for the
masked source a reveal with probability λ_{t→s}, for other sources the analytic bridge), every row from its own grid
point — and returns the x_1 it reaches and, per position, the teacher's conditional that token was drawn from at the
last step that set it (masked: the step that revealed it; uniform: the last step, which redraws every position).
Given the rollout so far that token is distributed as that conditional, so averaging it over rollouts gives the
per-position marginal of p_{1|t}^{T,K} with less variance than the drawn token (Rao–Blackwell; SDTT's "teacher's
final-step logits"). `MultiStepTarget` draws x_t from data at the student's grid times, rolls the teacher out once
per x_t (the cache every loss term of the batch uses) and hands the objective either form."""

from __future__ import annotations

import torch
from torch import Tensor

from tcsm.core.batch import as_batch
from tcsm.models.kinds import denoise, kind_of
from tcsm.sampling.common import adjust_log_probs, categorical, time_grid
from tcsm.sampling.joint_step import joint_reveal
from tcsm.targets.base import Target, TargetBatch, freeze

__all__ = ["FORMS", "MultiStepTarget", "TeacherRounds", "grid_start", "teacher_rollout"]

#: how the target reaches the loss: the teacher's conditionals (explicit log q) or its drawn tokens (Monte Carlo)
FORMS = ("conditionals", "draws")


@torch.no_grad()
def teacher_rollout(teacher, path, xt: Tensor, start: Tensor, num_steps: int, *, movable: Tensor | None = None,
                    window: int | None = None, generator: torch.Generator | None = None, temperature: float = 1.0,
                    x1: Tensor | None = None, until: int | Tensor | None = None,
                    conditionals: bool = True) -> tuple[Tensor, Tensor | None, Tensor]:  # fmt: skip
    """(x̂_1 [B, L], log conditionals [B, L, V] float64, teacher calls per row [B]): the teacher's sampler on the
    uniform grid of `num_steps` steps from x_t = `xt` at t_{start} to 1 (MATH.md §10). `start` is per row [B], or on a
    block path per position [B, L] (constant within a block): every block runs its own rollout, all in lock step (the
    i-th steps of all blocks in one call), the block model reading each block's clean prefix from `x1` (MATH.md §9). `movable` [B, L]: positions the sampler may
    change (default `path.free(xt)`; conditioning positions are not). `window`: at most this many steps of the grid,
    then the step to t = 1 (SDTT's window is 2; None: the whole remaining grid). `until`: stop at the grid point
    t_until instead (the state x_{t_until}, masks kept: one student step's worth of teacher steps, MATH.md §10 "The
    joint student"); like `start` an int, per row [B] or on a block path per position [B, L]: each block stopped at
    its own point). Off `movable` the conditionals are uniform (no loss is taken there); `conditionals=False`
    returns None for them and skips their [B, L, V] record. Every row takes the i-th step of its own rollout in the
    i-th call, so a batch of rows at different grid points costs the longest rollout's calls, not the grid's; on a
    masked path a row whose step reveals nothing is left out of that call (its state does not change), and the calls
    returned are those each row took part in. A
    full-sequence teacher with a step head (a previous round's joint student) draws each step's revealed tokens
    jointly (`sampling.joint_step`)."""
    B, L = xt.shape
    V = path.vocab_size
    K = int(num_steps)
    grid = time_grid(K, device=xt.device)
    start = start.to(device=xt.device, dtype=torch.long)
    if ((start < 0) | (start >= K)).any():
        raise ValueError(f"grid starts must lie in [0, {K}), got {start.unique().tolist()}")
    blocks = kind_of(teacher).blocks
    if blocks and x1 is None:
        raise ValueError("a block teacher reads each block's clean prefix: pass x1")
    start = start.reshape(B, -1).expand(B, L) if start.dim() == 2 else start.reshape(B, 1).expand(B, L)
    if until is not None:
        until = torch.as_tensor(until, device=xt.device, dtype=torch.long)
        until = until.reshape(B, -1).expand(B, L) if until.dim() == 2 else until.reshape(-1, 1).expand(B, L)
        if window is not None or bool(((until <= 0) | (until > K) | (start >= until)).any()):
            raise ValueError(f"until ({until.unique().tolist()}) takes no window and must lie after every start, at "
                             f"most {K}")  # fmt: skip
    if window is not None:
        end = torch.clamp(start + int(window) + 1, max=K)
    else:
        end = torch.full_like(start, K) if until is None else until.clone()
    joint = "joint_step" in kind_of(teacher).offers
    movable = path.free(xt) if movable is None else movable & path.free(xt)
    x = xt.clone()
    log_cond = None
    if conditionals:
        log_cond = torch.full((B, L, V), -float(torch.log(torch.tensor(float(V)))), dtype=torch.float64,
                              device=xt.device)  # fmt: skip
    calls = torch.zeros(B, dtype=torch.long, device=xt.device)
    time_dtype = torch.get_default_dtype()
    # the denoiser reads a time per row (per position on a block path), so the i-th steps of every row's (every
    # block's) rollout share one call whatever their grid points
    for i in range(int((end - start).max())):
        k = start + i  # [B, L]: the grid step each position takes in this call
        on = k < end  # [B, L]: the positions whose rollout is not over
        rows = on.any(-1).nonzero().squeeze(1)
        if rows.numel() == 0:
            continue
        on_r, st_r, en_r, k_r = on[rows], start[rows], end[rows], k[rows]
        # the rollout's last step: to t = 1, where every movable token takes its draw (`until`: to t_until)
        last = (en_r == k_r + 1) & ((en_r == K) if until is not None else True)
        t = grid[torch.clamp(k_r, st_r, en_r - 1)]  # off `on`: any time of that block's grid
        s = torch.where(last, torch.ones_like(t), grid[(k_r + 1).clamp(max=K)])
        xr = x[rows]
        t_in = t if blocks else t[:, 0]
        free = movable[rows] & path.free(xr) & on_r
        if joint or path.absorbing or bool(last[on_r].all()):
            # reveal with probability λ_{t→s} (λ = 1 at s = 1), the drawn token from m^i (MATH.md §6.1 = §6.2); the
            # reveal set is drawn before the call, so a row that reveals nothing in this step makes none
            lam = path.jump_prob(t, s)
            u = torch.rand((2, *xr.shape) if joint else xr.shape, dtype=torch.float64, device=xt.device,
                           generator=generator)  # fmt: skip
            move = free & ((u[0] if joint else u) < lam)
            act = move.any(-1).nonzero().squeeze(1)
            if act.numel() == 0:
                continue
            calls[rows[act]] += 1
            xa, ta, ma = xr[act], t_in[act].to(time_dtype), move[act]
            keep = log_cond is not None  # the joint step's [n, L, V] record only when a loss reads it
            if joint:  # the masked step with its tokens drawn jointly over the reveal set
                if blocks:  # every block of every row a row of its own, all blocks' steps in one pass
                    k_len = teacher.block_length
                    drawn, _, lp = joint_reveal(_EveryBlock(teacher, x1[rows[act]]), xa.reshape(-1, k_len), ta,
                                                ma.reshape(-1, k_len), u[1][act].reshape(-1, k_len),
                                                temperature=temperature, keep_log_probs=keep)  # fmt: skip
                    drawn = drawn.reshape(xa.shape)
                    lp = lp.reshape(*xa.shape, -1) if keep else None
                else:
                    drawn, _, lp = joint_reveal(teacher, xa, ta, ma, u[1][act], temperature=temperature,
                                                keep_log_probs=keep)  # fmt: skip
                lp = lp[ma] if keep else None
                drawn = drawn[ma]
            else:
                # float64 log m^i(· | x_t), where revealed only (a teacher that offers "positions" projects only there)
                lp = adjust_log_probs(denoise(teacher, xa, ta, x1[rows[act]] if blocks else None, at=ma), temperature)
                drawn = categorical(lp, generator)
            new = xr.clone()
            new[move] = drawn
        else:
            # the analytic bridge x_s^i ~ Σ_a m^i(a) B(· | x_t^i, a) (MATH.md §6.2); rows at their last step take x̂
            calls[rows] += 1
            logits = denoise(teacher, xr, t_in.to(time_dtype), x1[rows] if blocks else None)
            lp = adjust_log_probs(logits, temperature)
            bridge = path.bridge(xr, t if blocks else t[:, 0], s if blocks else s[:, 0], lp.exp())
            new = torch.where(free, categorical(torch.log(bridge), generator), xr)
            move = free & last  # the last step redraws every movable token; earlier ones are overwritten
            lp = lp[move]
        if log_cond is not None:  # the conditional a token was drawn from at the last step that set it: its m^i
            moved = torch.zeros_like(movable)
            moved[rows] = move
            log_cond[moved] = lp
        x[rows] = new
    if until is None and (x >= V).any():
        raise RuntimeError("the teacher's rollout left noise-only ids (masks): its grid must end at t = 1")
    return x, log_cond, calls


class _EveryBlock:
    """A block model with a step head as `joint_reveal` sees a full-sequence one: rows of one block each ([B·nb, k]),
    every block's step opened in one pass over the whole rows (`open_blocks_step`), its clean prefixes from `x1`."""

    def __init__(self, model, x1: Tensor):
        self.model, self.x1, self.cfg = model, x1, model.cfg

    def open_step(self, x_blocks: Tensor, t: Tensor, reveal: Tensor):
        return self.model.open_blocks_step(x_blocks.reshape(self.x1.shape), t, self.x1, reveal)


def grid_start(t: Tensor, student_steps: int) -> Tensor:
    """j = ⌊t·K_s⌋ ∈ [0, K_s): the student's grid point at or below each t (MATH.md §10)."""
    Ks = int(student_steps)
    return (t.double() * Ks).floor().clamp(0, Ks - 1).long()


class TeacherRounds(Target):
    """What a round's targets share: the frozen teacher's `teacher_steps`-step sampler, the student's
    `student_steps` grid, and the student's start — each row's t snapped down to its grid point t_j = j/K_s and
    x_t drawn there from the batch's clean data (the proposal h of the data)."""

    def __init__(self, teacher, teacher_steps: int, student_steps: int, temperature: float = 1.0):
        K, Ks = int(teacher_steps), int(student_steps)
        if Ks < 1 or K < Ks or K % Ks:
            raise ValueError(f"teacher_steps ({K}) must be a multiple of student_steps ({Ks}) >= 1")
        self.teacher = freeze(teacher)
        self.teacher_steps, self.student_steps = K, Ks
        self.temperature = float(temperature)

    def start(self, batch, t, path, generator):
        """(grid points j [B], times t_j [B], x_t [B, L], the positions a loss may score [B, L])."""
        j = grid_start(t, self.student_steps)
        ts = (j.double() / self.student_steps).to(t.dtype)
        xt = batch.noised(path, batch.x1, ts, generator)
        return j, ts, xt, batch.scored(path, xt)

    def to(self, device):
        if isinstance(self.teacher, torch.nn.Module):
            self.teacher.to(device)
        return self


class MultiStepTarget(TeacherRounds):
    """p_{1|t}^{T,K} at the student's grid times (MATH.md §10). A call snaps each row's t down to the student's grid
    t_j = j/K_s, draws x_t from the batch's clean data (the proposal h of the data), runs the frozen teacher's
    `teacher_steps`-step sampler from x_t once (`teacher_rollout`: K/K_s of its steps per student step) and returns
    its x̂_1 with, for `form="conditionals"`, the conditionals the tokens were drawn from as `log_q`. Stats: the
    teacher's network calls per row."""

    def __init__(self, teacher, teacher_steps: int, student_steps: int, *, window: int | None = None,
                 form: str = "conditionals", temperature: float = 1.0):  # fmt: skip
        super().__init__(teacher, teacher_steps, student_steps, temperature)
        if form not in FORMS:
            raise ValueError(f"form must be one of {list(FORMS)}, got {form!r}")
        if window is not None and int(window) < 1:
            raise ValueError(f"window must be >= 1 or null, got {window}")
        self.window = None if window is None else int(window)
        self.form = form

    def __call__(self, batch, t, path, generator=None, *, model=None):
        batch = as_batch(batch)
        j, ts, xt, movable = self.start(batch, t, path, generator)
        ratio = self.teacher_steps // self.student_steps
        x1, log_cond, calls = teacher_rollout(self.teacher, path, xt, j * ratio, self.teacher_steps, movable=movable,
                                              window=self.window, generator=generator, temperature=self.temperature,
                                              x1=batch.x1, conditionals=self.form == "conditionals")  # fmt: skip
        x1 = torch.where(movable, x1, batch.x1)
        log_q = None if log_cond is None else log_cond.float()
        stats = {"teacher_calls": calls.float().mean().detach()}
        return TargetBatch(xt=xt, t=ts, x1=x1, loss_mask=movable, log_q=log_q, stats=stats)

    def __repr__(self) -> str:
        return (f"MultiStepTarget(teacher_steps={self.teacher_steps}, student_steps={self.student_steps}, "
                f"window={self.window}, form={self.form!r})")
