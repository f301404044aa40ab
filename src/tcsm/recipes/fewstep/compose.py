"""Few-step distillation as a recipe (MATH.md §10): the run config of one step-halving round. A round is an ordinary
run: the teacher run's config (data, path, model) < the `finetune-fewstep` preset < overrides, with `reference.path`
(the frozen teacher) and `train.init_from` (the student's start) the teacher's checkpoint, and `sample.steps` the
student's step count, so that `tcsm sample` of the student uses the steps it was distilled for unless told. With
`target.form=joint` the student is the teacher's denoiser with a step head (`model.step_head_layers`, 1 unless
set; the head new) and the target the teacher's steps over one student step (no window); the head alone is trained
(`model.step_head_only`) unless an override says otherwise."""

from __future__ import annotations

from tcsm.builders.config import load_config, set_values
from tcsm.builders.overrides import parse_overrides
from tcsm.builders.source import source_run
from tcsm.core.errors import ConfigError
from tcsm.recipes.fewstep.builder import student_steps_of

__all__ = ["compose", "fewstep_config"]


def fewstep_config(checkpoint, preset: str | None = "finetune-fewstep", overrides=(), values: dict | None = None):
    """Teacher run's config < preset < overrides < `values` (dotted key → value), the teacher as `reference.path`
    and as the student's start (`train.init_from`), `sample.steps` the student's steps."""
    directory, base = source_run(checkpoint, "fewstep")
    base["train"] = {**base.get("train", {}), "out_dir": None}  # never write into the teacher's run
    cfg = load_config(preset, list(overrides), base=base)
    cfg = set_values(cfg, {"reference.path": str(directory), **(values or {})})
    if cfg.target.name != "fewstep":
        raise ConfigError(f"a few-step distillation needs target.name=fewstep, got {cfg.target.name!r}")
    K, Ks = int(cfg.target.teacher_steps), student_steps_of(cfg.target)
    if Ks < 1 or K % Ks or Ks > K:
        raise ConfigError(f"--student-steps ({Ks}) must divide --teacher-steps ({K})")
    start = {"train.init_from": str(directory), "train.init_weights": "ema" if cfg.reference.ema else "model",
             "sample.steps": Ks}  # fmt: skip
    if cfg.target.form == "joint":  # the joint student: a step head on the teacher's denoiser, one student step
        start["target.window"] = None
        if not cfg.model.get("step_head_layers"):
            start["model.step_head_layers"] = 1
        # measured better than training the denoiser too (docs/benchmarks.md, "... joint rounds with the step head
        # alone trained"), and a round then cannot move the teacher's factorised steps
        if "step_head_only" not in parse_overrides(list(overrides)).get("model", {}):
            start["model.step_head_only"] = True
    return set_values(cfg, {k: v for k, v in start.items() if k not in (values or {})})


def compose(args, config: str, values: dict):
    """`tcsm finetune fewstep`'s run config from its arguments."""
    if not args.checkpoint:
        raise ConfigError("give the teacher: tcsm finetune fewstep --from RUN (or --resume -o DIR)")
    return fewstep_config(args.checkpoint, config, args.overrides, values)
