"""AR → diffusion distillation target (MATH.md §5.4, paper App. F): p_1 := p^AR, the student matches
q^i ∝ p^AR(· | x_1^{≠i}) k_t(x_t^i | ·) on proposals x_1 ~ h.

Proposals h (`proposal`; MATH.md §3.1: any h covering p_{1|t} has the same pointwise minimiser, §8 item 19):

* "data": x_1 is the training batch — the paper's choice, a data/teacher hybrid target (MATH.md §4, last line);
* "teacher": x_1 ~ p^AR drawn ancestrally with the teacher's key/value cache — distillation with no data at all,
  and the proposal under which the minimiser is the teacher's own diffusion posterior;
* "student": x_1 ~ p^θ, the model being trained (on-policy; the objective hands it over on every call), drawn
  with the diffusion sampler in `sample_steps` steps.

Every call reports, as `TargetBatch.stats` (logged as `target/<name>`): `seq_scores` and `token_evals`, the
teacher's cost per proposal sequence (MATH.md §8 item 19; the exact marginal needs (V−1)L+1 sequence scores),
`candidates`, the mean candidate-set size |C_i|, and with `audit_rows` > 0 `missed_mass` — the teacher's exact
conditional mass outside C_i — and `tv_to_exact`, both from the exact marginal on the first `audit_rows`
sequences (the audit's own cost is not counted in `seq_scores`).

The Top-K + n-gram estimator needs a right-context n-gram counted from training rows (`ngram_rows`). As a
`TrainerCallback` the target counts it at the start of a run and stores it as `ngram.safetensors` in the run
directory; a resumed run loads that file instead of counting again (and refuses a file that does not fit).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from torch import Tensor

from tcsm.core.batch import as_batch
from tcsm.core.errors import CheckpointError
from tcsm.models.modes import eval_mode
from tcsm.paths import ProbabilityPath
from tcsm.posttrain.distill.ngram import RightContextNgram
from tcsm.targets.ar import ExactARScore, TopKNgramARScore, missed_mass, total_variation
from tcsm.targets.base import Target, TargetBatch

__all__ = ["NGRAM_FILE", "PROPOSALS", "DistillTarget", "rows_fingerprint"]

PROPOSALS = ("data", "teacher", "student")
NGRAM_FILE = "ngram.safetensors"


def rows_fingerprint(rows: Tensor) -> str:
    """sha256 of training rows [N, L] (shape and ids): what an n-gram file was counted from."""
    x = rows.detach().to("cpu", torch.int64).contiguous()
    h = hashlib.sha256(str(tuple(x.shape)).encode())
    h.update(x.numpy().tobytes())
    return h.hexdigest()[:16]


class DistillTarget(Target):
    """N^1 target of an AR teacher (`tcsm.targets.parametric.ARTeacher`) on proposals from `proposal`
    (module docstring; MATH.md §5.4). `ngram_rows` / `ngram_order` feed a Top-K + n-gram estimator."""

    def __init__(
        self,
        teacher,
        proposal: str = "data",
        *,
        sample_steps: int = 16,
        audit_rows: int = 0,
        ngram_rows: Tensor | None = None,
        ngram_order: int = 3,
    ):
        if proposal not in PROPOSALS:
            raise ValueError(f"unknown proposal {proposal!r}; choose one of {list(PROPOSALS)}")
        if int(sample_steps) < 1 or int(audit_rows) < 0:
            raise ValueError("sample_steps must be >= 1 and audit_rows >= 0")
        self.teacher = teacher
        self.proposal = proposal
        self.sample_steps, self.audit_rows = int(sample_steps), int(audit_rows)
        self.ngram_rows, self.ngram_order = ngram_rows, int(ngram_order)
        self.device = None
        if self.needs_ngram:
            RightContextNgram.check_order(self.ngram_order, teacher.vocab_size)
            if ngram_rows is None and self.estimator.ngram is None:
                raise ValueError("a Top-K + n-gram estimator needs training rows to count the n-gram from")

    @property
    def estimator(self):
        return self.teacher.estimator

    @property
    def needs_ngram(self) -> bool:
        return isinstance(self.estimator, TopKNgramARScore)

    # --- the n-gram: counted once per run, stored with it ---------------------------------------------

    def _info(self) -> dict:
        return {
            "order": self.ngram_order,
            "vocab_size": self.teacher.vocab_size,
            "rows": int(self.ngram_rows.shape[0]),
            "data": rows_fingerprint(self.ngram_rows),
        }

    def prepare_ngram(self, run_dir: str | os.PathLike | None = None) -> RightContextNgram | None:
        """Attach the n-gram to the estimator: load `run_dir/ngram.safetensors` if it exists (after checking it
        was counted from these rows with this order), else count it and save it there (rank 0 only)."""
        if not self.needs_ngram:
            return None
        if self.ngram_rows is None:  # the caller attached an n-gram: nothing to count or store
            return self.estimator.ngram
        info = self._info()
        path = Path(run_dir) / NGRAM_FILE if run_dir is not None else None
        if path is not None and path.is_file():
            try:
                ngram, saved = RightContextNgram.load(path)
            except ValueError as e:
                raise CheckpointError(f"{e}; delete it to count the n-gram again") from None
            if saved != info:
                diff = next(k for k in info if saved.get(k) != info[k])
                raise CheckpointError(
                    f"{str(path)!r} was counted with {diff}={saved.get(diff)!r}, this run has {info[diff]!r}; "
                    "resume with the run's own data and target.ngram_order, or start a new run"
                )
        else:
            ngram = RightContextNgram.fit(self.ngram_rows, self.ngram_order, self.teacher.vocab_size)
            if path is not None and os.environ.get("RANK", "0") == "0":
                ngram.save(path, info)
        self.estimator.ngram = ngram.to(self.device) if self.device is not None else ngram
        return ngram

    def on_fit_start(self, info) -> None:
        self.prepare_ngram(info.run_dir)

    def on_step_end(self, info) -> None:
        pass

    # --- proposals --------------------------------------------------------------------------------------

    def propose(self, batch, path: ProbabilityPath, generator=None, model=None) -> Tensor:
        """x_1 ~ h [B, L]: the batch, teacher samples or student samples (module docstring)."""
        x1 = batch.x1
        if self.proposal == "data":
            return x1
        if batch.cond_mask is not None:
            raise ValueError(f"conditioning positions need proposal='data', not {self.proposal!r}")
        B, L = x1.shape
        if self.proposal == "teacher":
            return self.teacher.sample(B, L, generator, device=x1.device)
        if model is None:
            raise ValueError("the student proposal needs the model being trained: pass model= to the target")
        from tcsm.sampling.settings import draw_pool  # lazy: only the on-policy proposal samples the student

        with eval_mode(model), torch.no_grad():
            return draw_pool(model, path, B, L, self.sample_steps, generator=generator)

    # --- the target -------------------------------------------------------------------------------------

    def __call__(self, batch, t: Tensor, path: ProbabilityPath, generator=None, *, model=None):
        if self.teacher.vocab_size != path.vocab_size:
            raise ValueError(
                f"teacher vocabulary V={self.teacher.vocab_size} differs from the path's V={path.vocab_size}"
            )
        if self.needs_ngram and self.estimator.ngram is None:
            self.prepare_ngram(None)  # used outside a trainer: count in memory
        batch = as_batch(batch)
        x1 = self.propose(batch, path, generator, model)
        est = self.teacher.estimate(x1)
        xt = batch.noised(path, x1, t, generator)
        with torch.no_grad():
            log_p1 = torch.log_softmax(est.ell.float(), dim=-1)
            log_q = path.target_conditional(log_p1, xt, t)
            stats = {
                "seq_scores": est.seq_scores.float().mean(),
                "token_evals": est.token_evals.float().mean(),
                "candidates": torch.isfinite(est.ell).sum(-1).float().mean(),
            }
            if self.audit_rows:
                n = min(self.audit_rows, x1.shape[0])
                exact = ExactARScore(max_tokens=getattr(self.estimator, "max_tokens", 1 << 16))
                with self.teacher.frozen(x1.device.type):
                    exact_cond = exact.conditionals(self.teacher.model, x1[:n])
                stats["missed_mass"] = missed_mass(est.ell[:n], exact_cond).mean().float()
                stats["tv_to_exact"] = total_variation(log_p1[:n], exact_cond).mean().float()
        return TargetBatch(xt=xt, t=t, x1=x1, loss_mask=batch.scored(path, xt), log_q=log_q, stats=stats)

    def to(self, device) -> DistillTarget:
        self.device = torch.device(device)
        self.teacher.to(device)
        if self.needs_ngram and self.estimator.ngram is not None:
            self.estimator.ngram.to(device)
        return self

    def __repr__(self) -> str:
        return f"DistillTarget({self.teacher!r}, proposal={self.proposal!r})"
