"""Few-step distillation's builder (MATH.md §10): `target.name: fewstep`, the multi-step teacher target around the
run's frozen model (the teacher, `reference.path`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tcsm.builders.registry import TARGETS, ReferenceUse
from tcsm.core.errors import ConfigError
from tcsm.posttrain.fewstep.joint import FILLS, StepTarget
from tcsm.posttrain.fewstep.replay import Replayed
from tcsm.posttrain.fewstep.target import FORMS, MultiStepTarget
from tcsm.targets.base import Target

__all__ = ["FewStepTargetConfig", "build_fewstep_target", "student_steps_of"]


@dataclass
class FewStepTargetConfig:
    """The teacher is the run's frozen model, `reference.path`; the student samples with `student_steps`."""

    name: str = "fewstep"
    teacher_steps: int = field(default=16, metadata={"help": "K: the teacher's sampler steps whose law the student learns"})
    student_steps: int | None = field(default=None, metadata={
        "help": "the student's sampler steps, a divisor of teacher_steps (null: teacher_steps / 2, one step-halving round)"})
    window: int | None = field(default=None, metadata={
        "help": "teacher steps per rollout before its step to t = 1 (null: its whole grid from x_t; 2: SDTT's window)"})
    form: str = field(default="conditionals", metadata={
        "help": "conditionals (the teacher's conditional of each reached token: explicit q, any divergence) | draws "
                "(the reached tokens: Monte Carlo, distrib KL or the score losses) | joint (the joint student: the "
                "teacher's steps over one student step, their revealed tokens learnt jointly by a step head, "
                "model.step_head_layers; masked source, full-sequence or block models, distrib KL, no window)",
        "choices": (*FORMS, "joint")})
    fill: str = field(default="sampler", metadata={
        "help": "form joint: how the teacher fills a student step's reveal set — sampler (its teacher_steps-step "
                "sampler over the step: that sampler's law, learnt from its drawn tokens) | left_to_right (one token a "
                "teacher call in the head's order: the law of the teacher filling each student step left to right, "
                "learnt from the teacher's whole conditionals; teacher_steps is not read)",
        "choices": FILLS})
    temperature: float = field(default=1.0, metadata={"help": "the teacher sampler's temperature"})
    reuse: int = field(default=1, metadata={
        "help": "updates each teacher rollout serves on average: a batch rolls out 1/reuse of its rows and takes the "
                "others from a pool of earlier rollouts (unbiased: the target does not depend on the student; 1: "
                "every row rolled out fresh)"})


def student_steps_of(node) -> int:
    """The student's step count a `target.fewstep` section asks for."""
    K = int(node["teacher_steps"])
    Ks = node.get("student_steps")
    return K // 2 if Ks is None else int(Ks)


def build_fewstep_target(node: dict, ctx) -> Target:
    """`target.name: fewstep`: p^{T,K}_{1|t} of the frozen teacher at the student's grid times, or with `form:
    joint` the teacher's transition over one student step (MATH.md §10)."""
    teacher = ctx.reference
    if teacher is None:
        raise ConfigError("reference.path must name the teacher run (tcsm finetune fewstep --from RUN)")
    if int(node["teacher_steps"]) < 2:
        raise ConfigError(f"target.teacher_steps must be >= 2, got {node['teacher_steps']}")
    reuse = int(node.get("reuse", 1))  # a run saved before the option: no pool
    if reuse < 1:
        raise ConfigError(f"target.reuse must be >= 1, got {reuse}")
    if node["form"] == "joint":
        if node["window"] is not None:
            raise ConfigError("target.form=joint learns one student step of teacher steps: set target.window=null")
        target = StepTarget(teacher, int(node["teacher_steps"]), student_steps_of(node),
                            temperature=float(node["temperature"]), fill=node.get("fill", "sampler"))  # fmt: skip
    else:
        if node.get("fill", "sampler") != "sampler":
            raise ConfigError(f"target.fill={node['fill']} fills a joint student's step: it needs target.form=joint")
        target = MultiStepTarget(teacher, int(node["teacher_steps"]), student_steps_of(node), window=node["window"],
                                 form=node["form"], temperature=float(node["temperature"]))  # fmt: skip
    return Replayed(target, reuse) if reuse > 1 else target


TARGETS.register(
    "fewstep", build_fewstep_target, schema=FewStepTargetConfig, overwrite=True,
    reference=ReferenceUse("reference.path (the teacher)"),
    help="the law of x_1 the teacher's K-step sampler reaches from x_t, at the student's grid times (MATH.md §10)",
)  # fmt: skip
