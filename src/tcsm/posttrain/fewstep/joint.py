"""The joint student's target (MATH.md §10, "The joint student"): one student step's worth of the teacher's sampler.

A student step t_j → t_{j+1} replaces r = K/K_s teacher steps. Started from x_t at t_j, the teacher's r steps reach
x_{t_{j+1}}: the positions they revealed, R, and their tokens y_R. Reveals compose (a masked position stays masked
through the r steps with probability Π (1 − λ_i) = 1 − λ_{t_j→t_{j+1}}, whatever the tokens), so R has the law of
one student step's reveal set, and the teacher's r-step transition is that law of R times the teacher's law of
y_R given (x_t, R). `StepTarget` hands the objective (x_t, t_j, R, y_R) with R as the loss positions and as
`TargetBatch.reveal`: a model with a step head reads y_R teacher-forced, and the composed objective's Monte Carlo
KL (`loss: distrib`, the drawn tokens) is the step's negative log-likelihood −Σ_k log p_θ(y_{r_k} | x_t, R, y_{r<k}),
whose expectation is KL(teacher's y_R | x_t, R ‖ the student's) + const."""

from __future__ import annotations

import torch
from torch import Tensor

from tcsm.core.batch import as_batch
from tcsm.models.kinds import kind_of
from tcsm.posttrain.fewstep.target import TeacherRounds, teacher_rollout
from tcsm.targets.base import TargetBatch

__all__ = ["StepTarget"]


class StepTarget(TeacherRounds):
    """The teacher's r-step transition from x_t at the student's grid point t_j to t_{j+1} (module doc). A call
    snaps each row's t down to t_j = j/K_s, draws x_t from the batch's clean data, rolls the frozen teacher's
    `teacher_steps`-step sampler from t_{jr} to t_{(j+1)r} once and returns x_t, t_j, the reveal set R (loss
    positions and `reveal`) and its tokens (in `x1`). Masked source. On a block path (a block teacher) t, t_j and
    the rollout are per block: each block's step from its own t_j given its clean prefix, and `clean` the data the
    student reads its prefixes from. Stats: the teacher's calls per row and the mean reveal count."""

    def __call__(self, batch, t, path, generator=None, *, model=None):
        blocks = kind_of(self.teacher).blocks
        if path.mask_id is None or t.dim() != (2 if blocks else 1):
            raise ValueError("the joint step target needs the masked source, and one t per row (a full-sequence "
                             "teacher) or per position (a block teacher on its block path)")  # fmt: skip
        batch = as_batch(batch)
        j, ts, xt, movable = self.start(batch, t, path, generator)
        xs, calls, _ = self.reach(path, xt, j, movable, generator, x1=batch.x1 if blocks else None)
        reveal = movable & (xs != xt)
        tokens = torch.where(reveal, xs, batch.x1)
        stats = {"teacher_calls": calls.float().mean(), "revealed": reveal.float().sum(-1).mean()}
        # a block student reads each block's prefix from the data, as the teacher's rollout did, not from the
        # teacher's draws at the earlier blocks' R
        return TargetBatch(xt=xt, t=ts, x1=tokens, loss_mask=reveal, reveal=reveal, stats=stats,
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
        return f"StepTarget(teacher_steps={self.teacher_steps}, student_steps={self.student_steps})"
