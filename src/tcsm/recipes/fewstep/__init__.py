"""Few-step distillation, the recipe (MATH.md §10): `builder` (the `target.name: fewstep` schema and registry entry),
`compose` (one round's run config from the teacher run), and `RECIPE`, the command `tcsm finetune fewstep`. The
method's math is `tcsm.posttrain.fewstep`."""

from __future__ import annotations

from tcsm.recipes.spec import Flag, RecipeSpec

DOC = """`tcsm finetune fewstep`: few-step distillation: a K/2-step student learns the teacher's K-step sampler (MATH.md §10).

The student, initialised from the teacher, learns per x_t the law of x_1 that the teacher's K-step sampler reaches
from x_t (p^{T,K}_{1|t}), at the grid times of its own K/2 steps; one teacher rollout per x_t is cached for the
batch. By default the rollout is a window of 1 (one teacher step, then its step to t = 1): the least-biased
per-position target (MATH.md §10, "Why a round trails its teacher"); `target.window=null` rolls the whole K-step grid.
The run is an ordinary `tcsm train` run whose config is the teacher run's (data, path, model), then the
`finetune-fewstep` preset (or `-c`), then key=value overrides, then the flags below; its `sample.steps` is the
student's, so `tcsm sample` of the student uses the steps it was distilled for unless --steps says otherwise.
A round's teacher is the previous round's student:

    tcsm finetune fewstep --from runs/teacher --teacher-steps 16 -o runs/fs8     # 16 -> 8 steps
    tcsm finetune fewstep --from runs/fs8 --teacher-steps 8 -o runs/fs4          # 8 -> 4 steps
    tcsm finetune fewstep --from runs/teacher --teacher-steps 16 --window 2 --form draws --loss score

`--form joint` trains the joint student (MATH.md §10.1): the teacher's denoiser with a new step head that draws a
step's revealed tokens jointly, on the teacher's steps over each student step (masked source; full-sequence and
block models, a block model's head drawing within one block, its steps per block). With `--fill left_to_right`
the teacher fills each student step's reveal set one token a call, left to right as the head reads it, and the
head learns the teacher's whole conditional at every token (MATH.md §10.1, "The teacher's left-to-right fill"):

    tcsm finetune fewstep --from runs/teacher --form joint --fill left_to_right --student-steps 4 -o runs/fs4

Masked and uniform sources; full-sequence and block models (K steps per block, each block's rollout given its clean
prefix), a DiffusionGemma run among them (teacher and student in the model's own class, K steps per canvas).
"""

RECIPE = RecipeSpec(
    name="fewstep",
    source_help="teacher run, checkpoints or step_* directory (the teacher and the student's start)",
    flags=(
        Flag("target.teacher_steps", minimum=2),
        Flag("target.student_steps", minimum=1),
        Flag("target.window", minimum=1),
        Flag("target.form"),
        Flag("target.fill"),
        Flag("objective.loss"),
        Flag("objective.divergence"),
    ),
    marks=("target.name", "fewstep"),
)
