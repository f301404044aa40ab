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
from tcsm.builders.sampler import sample_settings
from tcsm.evaluation.genppl import sample_entropy
from tcsm.recipes.distill.builder import inspect_teacher, load_distill_teacher
from tcsm.sampling.settings import draw

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
