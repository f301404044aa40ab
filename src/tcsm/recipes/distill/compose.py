"""AR → diffusion distillation as a recipe (MATH.md §5.4, paper App. F): the run config of a student, and a
report of what it learned from its teacher.

A distillation run is an ordinary run of the one Trainer: the teacher run's `data` section (a Hugging Face
teacher brings none: give `data.*`) < the `distill` preset < overrides < values, with `reference.path`
pointing at the teacher's resolved checkpoint (so a resumed run keeps the same teacher even if the teacher's
run trains on). The student is whatever the `model` section describes; it starts from scratch unless
`train.init_from` says otherwise.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from tcsm.builders.config import load_config, set_values
from tcsm.builders.loading import load_checkpoint
from tcsm.core.errors import ConfigError
from tcsm.evaluation.genppl import sample_entropy
from tcsm.recipes.distill.builder import inspect_teacher, load_distill_teacher
from tcsm.recipes.spec import lazy_report
from tcsm.sampling.settings import draw, sample_settings

__all__ = ["distill_config", "distill_report", "teacher_nll"]


def distill_config(teacher, preset: str | None = "distill", overrides=(), values: dict | None = None):
    """The student's config: teacher data < preset < overrides < `values` (dotted key → value), with
    `reference.path` set to the teacher (a tcsm run resolved to its checkpoint, or a HF directory). An override
    `target.name=data` gives the baseline: the same student on the teacher's data, without the teacher."""
    spec = inspect_teacher(teacher)
    base = {"data": dict(spec.state["config"]["data"])} if spec.kind == "tcsm" else None
    cfg = load_config(preset, list(overrides), base=base)
    own = {"reference.path": str(spec.path)} if cfg.target.name == "distill" else {}
    return set_values(cfg, {**own, **(values or {})})


@torch.no_grad()
def teacher_nll(teacher, x: torch.Tensor, batch_size: int = 64) -> torch.Tensor:
    """−log p^AR(x) / L per sequence [N] in nats per token: the teacher's judgement of samples (gen-PPL)."""
    out = []
    for chunk in x.split(batch_size):
        logp = torch.log_softmax(teacher(chunk).float(), dim=-1)
        out.append(-logp.gather(-1, chunk.unsqueeze(-1)).squeeze(-1).mean(-1).cpu())
    return torch.cat(out)


def distill_report(
    run_dir, num_samples: int, sample_steps=(8, 32, 128), seed: int = 0, device="cpu", teacher: str | None = None
) -> dict:
    """Gen-PPL under the teacher and unigram sample entropy of the student's (EMA) samples for each number of
    sampling steps (MATH.md §6), next to the same numbers for the teacher's own samples. `teacher` defaults to
    the run's reference.path (give it for a student trained without one, e.g. on data alone)."""
    from tcsm.targets.ar import sample_ar

    student = load_checkpoint(run_dir, device=device)
    cfg = student.config
    V, L = int(student.data_info["vocab_size"]), int(student.data_info["seq_len"])
    own = cfg.target.name == "distill"
    ema = cfg.reference.ema if own else True
    spec = inspect_teacher(teacher or cfg.reference.path, ema=ema)
    teacher = load_distill_teacher(
        spec, device, vocab_size=V, ema=ema,
        bos_token_id=cfg.target.bos_token_id if own else None,
    )  # fmt: skip
    path = student.build_path()

    def judge(x) -> dict:
        nll = teacher_nll(teacher, x)
        return {
            "gen_ppl": math.exp(float(nll.mean())),
            "nll_stderr": float(nll.std() / max(1, nll.numel()) ** 0.5),
            "entropy": sample_entropy(x.cpu())["entropy_mean"],
        }

    decode = _decoder(student)
    out = {"run": str(Path(run_dir)), "step": student.step, "num_samples": int(num_samples), "steps": {}}
    for k in sample_steps:
        g = torch.Generator(device=device).manual_seed(seed)
        settings = sample_settings(student.config.sample, steps=int(k))
        x, _ = draw(student.model, path, num_samples, L, settings, generator=g, chunk_size=256)
        out["steps"][int(k)] = {**judge(x), "example": decode(x[0]) if decode else None}
    g = torch.Generator(device=device).manual_seed(seed)
    out["teacher"] = judge(sample_ar(teacher, num_samples, L, g, device))
    return out


def _decoder(ck):
    """The run's detokenizer when its data can be rebuilt (the report must not fail because data moved)."""
    try:
        return ck.build_data().decode
    except (ValueError, OSError):
        return None


def compose(args, config: str, values: dict):
    """`tcsm distill`'s run config from its arguments."""
    if not args.checkpoint:
        raise ConfigError("give the teacher: tcsm distill --teacher RUN_OR_HF_DIR (or --resume -o DIR)")
    return distill_config(args.checkpoint, config, args.overrides, values)


def _eval_steps(text: str) -> list[int]:
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        steps = []
    if not steps or min(steps) < 1:
        raise ConfigError(f"--eval-steps must be positive integers separated by commas, got {text!r}")
    return steps


def report_of(args):
    return lazy_report("tcsm.recipes.distill.compose:distill_report", args.eval_samples, _eval_steps(args.eval_steps))


def cost_summary(run_dir, cfg) -> str | None:
    """One line: the teacher's mean sequence scores per student step, against the exact marginal's."""
    import json
    from pathlib import Path

    rows = []
    path = Path(run_dir) / "metrics.jsonl"
    if path.is_file():
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    per_seq = [r["target/seq_scores"] for r in rows if "target/seq_scores" in r]
    if not per_seq:
        return None
    mean = sum(per_seq) / len(per_seq)
    text = f"teacher cost: {mean:.1f} sequence scores per sequence, {mean * cfg.train.batch_size:.0f} per student step"
    missed = [r["target/missed_mass"] for r in rows if "target/missed_mass" in r]
    if missed:
        text += f"; candidate sets miss {sum(missed) / len(missed):.3f} of the teacher's mass"
    return text
