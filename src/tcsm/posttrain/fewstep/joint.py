"""The joint student's target (MATH.md §10, "The joint student"): one student step's worth of the teacher's sampler.

A student step t_j → t_{j+1} replaces r = K/K_s teacher steps. Started from x_t at t_j, the teacher's r steps reach
x_{t_{j+1}}: the positions they revealed, R, and their tokens y_R. Reveals compose (a masked position stays masked
through the r steps with probability Π (1 − λ_i) = 1 − λ_{t_j→t_{j+1}}, whatever the tokens), so R has the law of
one student step's reveal set, and the teacher's r-step transition is that law of R times the teacher's law of
y_R given (x_t, R). `StepTarget` hands the objective (x_t, t_j, R, y_R) with R as the loss positions and as
`TargetBatch.reveal`: a model with a step head reads y_R teacher-forced, and the composed objective's Monte Carlo
KL (`loss: distrib`, the drawn tokens) is the step's negative log-likelihood −Σ_k log p_θ(y_{r_k} | x_t, R, y_{r<k}),
whose expectation is KL(teacher's y_R | x_t, R ‖ the student's) + const.

With `fill="left_to_right"` the teacher fills R the way the step head reads it (MATH.md §10.1, "The teacher's
left-to-right fill"): R drawn as one student step draws it, then its tokens one per teacher call in position order,
each from the teacher's conditional at x_t with R's earlier tokens set. Those conditionals are then exactly the
ones the head's factors must match, so they reach the loss whole (`log_q`): the KL of each factor to the
teacher's, not the log-likelihood of one draw — the Rao–Blackwell form of the same objective, minimal at the same
law, with far less variance per rollout."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tcsm.core.batch import as_batch
from tcsm.models.kinds import denoise, kind_of
from tcsm.posttrain.fewstep.target import TeacherRounds, teacher_rollout
from tcsm.sampling.common import adjust_log_probs, categorical
from tcsm.targets.base import TargetBatch

__all__ = ["FILLS", "StepTarget", "fill_left_to_right"]

#: how the teacher fills a student step's reveal set: its sampler's r steps, or one token a call left to right
FILLS = ("sampler", "left_to_right")


@torch.no_grad()
def fill_left_to_right(teacher, xt: Tensor, t: Tensor, s: Tensor, reveal: Tensor, vocab_size: int, *,
                       group: int | None = None, generator: torch.Generator | None = None, temperature: float = 1.0,
                       x1: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(x_t with R = `reveal` filled [B, L], the log conditional each token of R was drawn from [B, L, V] float32 (what
    a loss reads; the draws use float64), uniform off R, and the teacher's calls per row [B]): the k-th position of R
    in each group of `group` positions (a block; None: the whole row) drawn in the k-th call from the teacher's
    conditional there at the state with the group's earlier positions of R set. The teacher reads the (k+1)-th draw's
    state at t + (k + 1)(s − t) / (n + 1), the mean (k+1)-th of the group's n reveal times, uniform on (t, s] under the
    linear schedule. t and s are x_t's time and the step's end, [B], or per position [B, L] on a block path, whose
    clean prefixes come from `x1`. Only the rows with a k-th position take the k-th call, and the teacher's logits are
    asked for there alone."""
    B, L = xt.shape
    g = L if group is None else int(group)
    rank = (reveal.reshape(B, -1, g).long().cumsum(-1) - 1).reshape(B, L)
    rank = torch.where(reveal, rank, -1)
    n = reveal.reshape(B, -1, g).sum(-1, keepdim=True).expand(-1, -1, g).reshape(B, L)
    per_position = t.dim() == 2
    t, s = t.double().reshape(B, -1).expand(B, L), s.double().reshape(B, -1).expand(B, L)
    x = xt.clone()
    log_q = torch.full((B, L, vocab_size), -math.log(vocab_size), dtype=torch.float32, device=xt.device)
    calls = torch.zeros(B, dtype=torch.long, device=xt.device)
    for k in range(int(rank.max()) + 1 if reveal.any() else 0):
        at = rank == k
        rows = at.any(-1).nonzero().squeeze(1)
        calls[rows] += 1
        tk = (t + (k + 1) * (s - t) / (n + 1)).to(torch.get_default_dtype())[rows]
        tk = tk if per_position else tk[:, 0]
        lp = adjust_log_probs(denoise(teacher, x[rows], tk, None if x1 is None else x1[rows], at=at[rows]),
                              temperature)  # fmt: skip
        x[at] = categorical(lp, generator)  # `at`'s positions in row-major order, as `denoise(at=)` returns them
        log_q[at] = lp.float()
    return x, log_q, calls


class StepTarget(TeacherRounds):
    """The teacher's r-step transition from x_t at the student's grid point t_j to t_{j+1} (module doc). A call
    snaps each row's t down to t_j = j/K_s, draws x_t from the batch's clean data, rolls the frozen teacher's
    `teacher_steps`-step sampler from t_{jr} to t_{(j+1)r} once and returns x_t, t_j, the reveal set R (loss
    positions and `reveal`) and its tokens (in `x1`). Masked source. On a block path (a block teacher) t, t_j and
    the rollout are per block: each block's step from its own t_j given its clean prefix, and `clean` the data the
    student reads its prefixes from. `fill="left_to_right"`: R drawn with one student step's λ, its tokens from the
    teacher one per call in the head's order (`fill_left_to_right`), their conditionals handed over as `log_q`.
    Stats: the teacher's calls per row and the mean reveal count."""

    def __init__(self, teacher, teacher_steps: int, student_steps: int, temperature: float = 1.0, *,
                 fill: str = "sampler"):  # fmt: skip
        super().__init__(teacher, teacher_steps, student_steps, temperature)
        if fill not in FILLS:
            raise ValueError(f"fill must be one of {list(FILLS)}, got {fill!r}")
        if fill == "left_to_right" and "joint_step" in kind_of(teacher).offers:
            # the fill reads factorised conditionals: a joint teacher's head would not be read, and its left-to-right
            # law is its denoiser's, the earlier round's teacher's, not the K_s-step law a chain would distil
            raise ValueError("fill=left_to_right reads the teacher's factorised conditionals; a joint-step teacher's "
                             "head would be ignored: fill from the factorised teacher, or use fill=sampler")  # fmt: skip
        self.fill = fill

    def __call__(self, batch, t, path, generator=None, *, model=None):
        blocks = kind_of(self.teacher).blocks
        if path.mask_id is None or t.dim() != (2 if blocks else 1):
            raise ValueError("the joint step target needs the masked source, and one t per row (a full-sequence "
                             "teacher) or per position (a block teacher on its block path)")  # fmt: skip
        batch = as_batch(batch)
        j, ts, xt, movable = self.start(batch, t, path, generator)
        log_q = None
        if self.fill == "sampler":
            xs, calls, _ = self.reach(path, xt, j, movable, generator, x1=batch.x1 if blocks else None)
            reveal = movable & (xs != xt)
        else:
            B, L = xt.shape
            s = (j + 1).double() / self.student_steps
            lam = path.jump_prob(ts.double().reshape(B, -1).expand(B, L), s.reshape(B, -1).expand(B, L))
            reveal = movable & (torch.rand(xt.shape, dtype=torch.float64, device=xt.device, generator=generator) < lam)
            xs, log_q, calls = fill_left_to_right(self.teacher, xt, ts, s, reveal, path.vocab_size,
                                                  group=path.block_length if blocks else None,
                                                  generator=generator, temperature=self.temperature,
                                                  x1=batch.x1 if blocks else None)  # fmt: skip
        tokens = torch.where(reveal, xs, batch.x1)
        stats = {"teacher_calls": calls.float().mean(), "revealed": reveal.float().sum(-1).mean()}
        # a block student reads each block's prefix from the data, as the teacher's rollout did, not from the
        # teacher's draws at the earlier blocks' R
        return TargetBatch(xt=xt, t=ts, x1=tokens, loss_mask=reveal, log_q=log_q, reveal=reveal, stats=stats,
                           clean=batch.x1 if blocks else None)  # fmt: skip

    def reach(self, path, xt: Tensor, j: Tensor, movable: Tensor, generator=None, *, conditionals: bool = False,
              x1: Tensor | None = None):
        """(x_{t_{j+1}} [B, L], the teacher's calls per row [B], and with `conditionals` the log conditional each
        revealed token was drawn from [B, L, V] float64, else None): the teacher's r steps from x_t at each row's
        grid point t_j, every row stopped at its own t_{j+1}, all in one rollout of r calls. A block
        teacher (j [B, L] per position, its clean sequences `x1`): every block from its own t_j to its own t_{j+1},
        all in one rollout."""
        r = self.teacher_steps // self.student_steps
        x_end, lc, calls = teacher_rollout(self.teacher, path, xt, j * r, self.teacher_steps, movable=movable,
                                           generator=generator, temperature=self.temperature, x1=x1,
                                           until=(j + 1) * r, conditionals=conditionals)  # fmt: skip
        return x_end, calls, lc

    def __repr__(self) -> str:
        return (f"StepTarget(teacher_steps={self.teacher_steps}, student_steps={self.student_steps}, "
                f"fill={self.fill!r})")
