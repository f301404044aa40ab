"""Few-step distillation, the math (MATH.md §10): `target` (`teacher_rollout`: the teacher's K-step sampler run from
x_t on its grid, with the conditional each token was last drawn from; `MultiStepTarget`: p_{1|t}^{teacher,K} as a
TCSM target on the student's grid, one rollout per x_t cached for the batch) and `joint` (`StepTarget`: the
teacher's steps over one student step, for the joint student with a step head, §10.1) and `replay` (`Replayed`:
each rollout serving several updates from a pool, `target.reuse`). Its recipe (`tcsm finetune fewstep`)
is `tcsm.recipes.fewstep`."""
