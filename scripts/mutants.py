#!/usr/bin/env python3
"""Mutation testing of the math modules: plant one realistic bug at a time and check that the tests catch it.

Every mutant is an exact source-text replacement (`old` → `new`) in one file. A pattern must occur exactly once
in its file, or the run stops before testing anything: the list stays valid as the code moves, and a mutant can
never silently test nothing. Each mutant runs in a private copy of the tree (never in your files; nothing to
restore here), with the test files registered for its module (`module_tests`: derived from the layout, or the mutant's own), `pytest -x`
and a timeout. The tests failing (or timing out) kill the mutant; passing lets it survive. A survivor is a bug
the suite would let through — or an equivalent mutant (no behaviour change), which the list marks with the reason
(`equivalent=`) so that the report tells the two apart.

    .venv/bin/python scripts/mutants.py --check          # every pattern found exactly once (a second or two)
    .venv/bin/python scripts/mutants.py -j 2             # every mutant, two at a time (see CONTRIBUTING.md)
    .venv/bin/python scripts/mutants.py -k sir -k dre    # the mutants whose id contains "sir" or "dre"
    .venv/bin/python scripts/mutants.py --rev HEAD~1     # a committed tree (e.g. the suite before new tests)
    .venv/bin/python scripts/mutants.py --list           # ids, files and what each one plants

Copies come from `git ls-files` (tracked and untracked-but-not-ignored files) or, with --rev, `git archive`;
the copy's `src` goes first on PYTHONPATH, so the editable install is shadowed. Exit status: 0 when every
non-equivalent mutant was killed, 1 otherwise, 2 on a bad list or a failing unmutated suite.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str  # relative to the repository root
    old: str
    new: str
    why: str  # the bug it plants, in words
    tests: tuple[str, ...] = ()  # overrides module_tests(file) (files or node ids)
    equivalent: str = ""  # why it cannot change behaviour, if it cannot


def M(id, file, old, new, why, tests=(), equivalent=""):  # a table row, kept short
    return Mutant(id, file, old, new, why, tuple(tests), equivalent)


S = "src/tcsm/"

#: Tests of a module from another folder than its own: the oracles that check a module through its users (a path's
#: bound integrand through the likelihood estimator, a target through the objective). Keyed by source folder.
ORACLES: dict[str, tuple[str, ...]] = {
    "paths": ("tests/evaluation/test_likelihood.py", "tests/objectives/test_sedd.py", "tests/sampling/test_samplers.py"),
    "core": ("tests/evaluation/test_likelihood.py",),
    "objectives": ("tests/objectives/test_sedd.py",),
    "targets": ("tests/paths/test_paths.py", "tests/objectives/test_composed.py", "tests/models/test_lm.py"),
    "posttrain/distill": ("tests/targets/test_parametric.py", "tests/recipes/distill/test_distill_cli.py"),
    # a method's recipe runs (tests/recipes/<m>/) exercise its math end to end
    "posttrain/dre": ("tests/recipes/dre/test_dre_cli.py",),
    "posttrain/preference": ("tests/recipes/preference/test_preference_cli.py",),
    "posttrain/sft": ("tests/recipes/sft/test_sft_cli.py",),
}


def module_tests(file: str, root: Path = ROOT) -> tuple[str, ...]:
    """The tests of `src/tcsm/<folder>/<module>.py`, derived from the layout (tests mirror the packages): its own
    `tests/<folder>/test_<module>.py` first, then the rest of `tests/<folder>/`, then the folder's ORACLES."""
    rel = Path(file).relative_to(S)
    folder = rel.parent.as_posix()
    tests_dir = root / "tests" / folder
    own = tests_dir / f"test_{rel.stem}.py"
    rest = sorted(tests_dir.glob("test_*.py")) if tests_dir.is_dir() else []
    found = ([own] if own.is_file() else []) + [f for f in rest if f != own]
    names = [f.relative_to(root).as_posix() for f in found]
    return tuple(dict.fromkeys(names + [o for o in ORACLES.get(folder, ()) if (root / o).is_file()]))


# fmt: off
SCH, PBASE, PMASK, PUNI, BND = (S + "paths/" + f for f in ("schedules.py", "base.py", "masked.py", "uniform.py",
                                                          "bounds.py"))
RES, LIK = S + "core/results.py", S + "evaluation/likelihood.py"
OLOSS, OWT, DIV = (S + "objectives/" + f for f in ("losses.py", "weighting.py", "divergences.py"))
TBASE, TPAR, TAR = S + "targets/base.py", S + "targets/parametric.py", S + "targets/ar.py"
DLOSS, DOBJ, DSIR, DLIK = (S + "posttrain/dre/" + f for f in ("losses.py", "objective.py", "sir.py",
                                                                "likelihood.py"))
PREF, DIST = S + "posttrain/preference/objective.py", S + "posttrain/distill/target.py"

BLK, BDEC, DG, HFB = (S + f for f in ("models/blocks.py", "sampling/blocks.py", "models/diffusion_gemma.py",
                                        "models/hf_block.py"))
LORA, BLORA = S + "models/lora.py", S + "builders/lora.py"
RADV, REST, RLOSS, ROBJ = (S + "posttrain/rl/" + f for f in ("advantages.py", "estimators.py", "loss.py",
                                                              "objective.py"))
#: Test sets of the modules added since the first pass, named explicitly: their folders' whole test sets hold
#: end-to-end runs (LoRA trainings, Hugging Face round trips) that would multiply the pass's time.
T_BLK, T_BDEC = ("tests/models/test_blocks.py",), ("tests/sampling/test_block_decoding.py",)
T_BPATH = ("tests/objectives/test_block_objective.py", "tests/evaluation/test_block_bound.py",
           "tests/paths/test_paths.py")
T_DG, T_HFB = ("tests/models/test_diffusion_gemma.py",), ("tests/models/test_hf_block.py",)
T_LORA, T_ADV = ("tests/models/test_lora.py",), ("tests/posttrain/rl/test_advantages.py", "tests/posttrain/rl/test_loss.py")
T_EST, T_RLOSS = ("tests/posttrain/rl/test_estimators.py",), ("tests/posttrain/rl/test_loss.py",)
T_ROBJ, T_CAP = ("tests/posttrain/rl/test_objective.py",), ("tests/objectives/test_score_cap.py",)
T_DRE, T_LIK = ("tests/posttrain/dre/test_dre_objective.py",), ("tests/evaluation/test_likelihood.py",)

SPEC, FEW, ENG = S + "sampling/speculative.py", S + "posttrain/fewstep/target.py", S + "sampling/engine.py"
T_SPEC, T_FEW = ("tests/sampling/test_speculative.py",), ("tests/posttrain/fewstep/test_target.py",)
T_ENG = ("tests/sampling/test_engine.py",)
FILL, T_FILL = S + "posttrain/fewstep/joint.py", ("tests/posttrain/fewstep/test_fill.py",)

# One row per mutant (the formatter's one argument per line would make the table five times as long).
MUTANTS: list[Mutant] = [
    # --- schedules (MATH.md §0) ---
    M("sched.kappa_times", SCH, "return self.alpha_dot(t) / denom", "return self.alpha_dot(t) * denom",
      "κ_t = α̇_t · (1 − α_t) instead of α̇_t / (1 − α_t)"),
    M("sched.kappa_eps", SCH, "denom = self.one_minus_alpha(t).clamp_min(torch.finfo(t.dtype).tiny)",
      "denom = self.one_minus_alpha(t) + 1e-3", "a 'stabilising' epsilon in κ_t's denominator"),
    M("sched.cosine_dot", SCH, "return 0.5 * math.pi * torch.sin(0.5 * math.pi * t)",
      "return 0.5 * math.pi * torch.cos(0.5 * math.pi * t)", "cosine α̇ with cos for sin"),
    M("sched.cosine_time", SCH, "torch.sin(0.5 * math.pi * (1.0 - t)).clamp_min(0.0)",
      "torch.sin(0.5 * math.pi * t).clamp_min(0.0)", "cosine 1 − α_t at t instead of 1 − t"),
    M("sched.poly_dot_exp", SCH, ".pow(p - 1.0)", ".pow(p)", "polynomial α̇ = p t^p (exponent off by one)"),
    M("sched.poly_oma_sign", SCH, "return -torch.expm1(self.exponent", "return torch.expm1(self.exponent",
      "polynomial 1 − α_t with the wrong sign"),
    M("sched.loglinear_time", SCH, "return (1.0 - self.eps) * (1.0 - t)", "return (1.0 - self.eps) * t",
      "log-linear 1 − α_t at t instead of 1 − t"),
    # --- paths (MATH.md §1, §2.2, §2.3, §6.2) ---
    M("paths.masked_noise_swap", PMASK,
      "# An unmasked token at s survives to t with probability α_t / α_s.\n        a_s, a_t = self.alpha(s), self.alpha(t)",
      "# An unmasked token at s survives to t with probability α_t / α_s.\n        a_s, a_t = self.alpha(t), self.alpha(s)",
      "masked noising chain with s and t swapped"),
    M("paths.masked_kernel_weight", PMASK,
      "return torch.where(is_mask, torch.log(onem).expand(hit.shape), out)",
      "return torch.where(is_mask, torch.log(a).expand(hit.shape), out)", "masked kernel: P(mask) = α_t"),
    M("paths.uniform_corrupt_prob", PUNI,
      "return self.schedule.one_minus_alpha(t).clamp(0.0, 1.0) * (V - 1) / V",
      "return self.schedule.one_minus_alpha(t).clamp(0.0, 1.0)",
      "uniform corruption probability without the 1/V chance of redrawing x_1"),
    M("paths.uniform_corrupt_shift", PUNI, "shift = torch.randint(1, V,", "shift = torch.randint(0, V,",
      "uniform corruption may return x_1 itself (off by one)"),
    M("paths.uniform_kernel_norm", PUNI, "base = _col(self.schedule.one_minus_alpha(t), xt).unsqueeze(-1) / V",
      "base = _col(self.schedule.one_minus_alpha(t), xt).unsqueeze(-1)", "uniform kernel without 1/V"),
    M("paths.masked_bound_weight", PMASK, "return self.kappa(t), g.sum(-1)",
      "return self.schedule.alpha_dot(t), g.sum(-1)", "masked bound weighted by α̇_t instead of κ_t"),
    M("paths.masked_bound_detach", PMASK, "nll = lse - lg.gather", "nll = lse.detach() - lg.gather",
      "masked bound with a detached log-partition: right value, wrong gradient (issue 26, gap 1)"),
    M("paths.masked_bound_unmasked", PMASK, "g = torch.where(xt == self.mask_id, nll.to(wd)",
      "g = torch.where(xt >= 0, nll.to(wd)", "masked bound counts carried (unmasked) positions"),
    M("paths.masked_bridge_time", PMASK, "out = torch.cat([lam * probs, (1.0 - lam).expand(",
      "out = torch.cat([(1.0 - lam) * probs, lam.expand(", "masked bridge with λ and 1 − λ swapped"),
    M("paths.uniform_bridge_kernel", PUNI, "k_t = a_t * hit + (1.0 - a_t) / V",
      "k_t = a_s * hit + (1.0 - a_s) / V", "uniform bridge divides by the kernel at s instead of t"),
    M("paths.uniform_prior_kl", PUNI,
      "kl = hit * math.log(V * hit) + (V - 1) * (1.0 - a0) / V * math.log1p(-a0)",
      "kl = hit * math.log(V * hit)", "uniform prior KL without the off-diagonal terms"),
    M("paths.jump_prob_time", PBASE, "onem = self.schedule.one_minus_alpha(t)\n        lam",
      "onem = self.schedule.one_minus_alpha(s)\n        lam", "λ_{t→s} normalised by 1 − α_s"),
    M("paths.target_kernel_sign", PBASE, "log_p1_cond + self.log_kernel(xt, t)",
      "log_p1_cond - self.log_kernel(xt, t)", "N^1 target divides by the kernel"),
    M("paths.dfm_sign", PUNI, "-log_mz - log_mx.exp())", "-log_mz + log_mx.exp())", "DFM integrand: + m(x_t)"),
    M("paths.reversal_rate_norm", PUNI, "c = adot / (V * alpha.clamp_min(tiny))",
      "c = adot / alpha.clamp_min(tiny)", "reversal weight c_t without 1/V"),
    M("paths.reversal_r_offby1", PUNI, "torch.where(is_z, 1.0 + b3, one)", "torch.where(is_z, b3, one)",
      "reversal ratio r at y = x_1 is b instead of 1 + b"),
    M("paths.reversal_gkl_sign", PUNI, "s_minus_r - r * log_ratio)", "s_minus_r + r * log_ratio)",
      "generalised KL with + r log(ŝ/r)"),
    # --- likelihood (MATH.md §2) ---
    M("lik.integrand_weight", BND, "torch.where(G > 0, w * G, torch.zeros_like(G))",
      "torch.where(G > 0, G, torch.zeros_like(G))", "bound integrand without the weight w(t)"),
    M("lik.is_weight", LIK, "weight = torch.where(event, p_event / q,",
      "weight = torch.where(event, torch.ones_like(q),",
      "x_t split on E without the importance weight P(E)/q"),
    M("lik.first_pos_ceil", LIK, "j = torch.floor(torch.log1p(-u[1] * p_event) / log_keep)",
      "j = torch.ceil(torch.log1p(-u[1] * p_event) / log_keep)", "first corrupted position off by one"),
    M("lik.later_direction", LIK, "((rank > j.unsqueeze(-1)) & later)", "((rank < j.unsqueeze(-1)) & later)",
      "later corrupted positions drawn before the first one"),
    M("lik.p_event_L", LIK, "p_event = -torch.expm1(n_free * log_keep)", "p_event = -torch.expm1(log_keep)",
      "P(E) for one token instead of L"),
    M("lik.prior_sign", LIK, "**draws).mean(0) + prior", "**draws).mean(0) - prior",
      "prior term subtracted"),
    M("lik.row_sequence", LIK, "z = rows_x1[torch.arange(done, done + n, device=device) % n_rows]",
      "z = rows_x1[torch.arange(done, done + n, device=device) // n_rows]",
      "row j scored against x_1 of j // n_rows, not j mod n_rows"),
    M("lik.later_from_first", LIK, "((rank > j.unsqueeze(-1)) & later)", "((rank >= j.unsqueeze(-1)) & later)",
      "later corrupted positions from the first one on",
      equivalent="position j is already in the set through `rank == j`: the union is the same"),
    M("lik.bpt_length", RES, "return nats / (length * _LN2)", "return nats / _LN2",
      "bits per token not divided by L"),
    # --- objectives (MATH.md §3, §7) ---
    M("obj.reduce_per_token", OWT, "return per_seq.mean() / L", "return per_seq.mean()",
      "loss per sequence, not per token"),
    M("obj.reduce_weight_div", OWT, "per_seq = per_seq * time_weight.to(per_seq.dtype)",
      "per_seq = per_seq / time_weight.to(per_seq.dtype)", "time weight divides"),
    M("obj.reduce_mask", OWT, "per_seq = _masked(per_pos, batch.loss_mask).sum(-1) if",
      "per_seq = per_pos.sum(-1) if", "reduction sums positions off the loss mask"),
    M("obj.place_mask", OLOSS, "return torch.where(mask, values.reshape(mask.shape), values.new_zeros(()))",
      "return values.reshape(mask.shape)", "per-position values kept off the loss mask"),
    M("obj.distrib_axis", OLOSS, "value = -_gather(_floor(torch.log_softmax(rows, -1), clamp), z)",
      "value = -_gather(_floor(torch.log_softmax(rows, 0), clamp), z)",
      "clamped MC cross-entropy on the wrong axis"),
    M("obj.score_explicit_norm", OLOSS, "log_w = log_q - log_q_z.unsqueeze(-1)", "log_w = log_q",
      "explicit score target q_y instead of q_y / q_z"),
    M("obj.score_explicit_swap", OLOSS, "gen.divergence_log(log_w, log_m - log_m_z.unsqueeze(-1))",
      "gen.divergence_log(log_m - log_m_z.unsqueeze(-1), log_w)", "Bregman divergence arguments swapped"),
    M("obj.tilt_min", OLOSS, "log_k = log_k - log_k.min(-1, keepdim=True).values",
      "log_k = log_k - log_k.max(-1, keepdim=True).values", "kernel tilt normalised by k_max"),
    M("obj.tilt_direction", OLOSS, "torch.log_softmax(rows - log_k, -1)", "torch.log_softmax(rows + log_k, -1)",
      "tilted model m·k instead of m/k"),
    M("obj.kappa_weight", OWT, "return path.kappa(t)", "return path.schedule.alpha_dot(t)",
      "'kappa' weighting returns α̇_t"),
    M("obj.paper_scale", OLOSS, "value = value / path.vocab_size", "value = value * path.vocab_size",
      "paper scale multiplies by V"),
    # --- divergences (MATH.md §3.5) ---
    M("div.gkl_box_sign", DIV, "torch.exp(-log_m_z) + log_m.sum(-1)", "torch.exp(-log_m_z) - log_m.sum(-1)",
      "GKL boxed score loss: − Σ log m_y"),
    M("div.gkl_div_typo", DIV, "- u + lv.exp()", "- u + lu.exp()", "GKL divergence_log: e^{lu} for e^{lv}"),
    M("div.squared_conj", DIV, "return 0.5 * torch.expm1(2.0 * lu)", "return 0.5 * torch.expm1(lu)",
      "LSIF conjugate (u² − 1)/2 with u for u²"),
    M("div.logistic_dphi", DIV, "def dphi_log(self, lu):\n        return F.logsigmoid(lu)",
      "def dphi_log(self, lu):\n        return F.logsigmoid(-lu)", "logistic φ' with the wrong sign"),
    M("div.kl_swap", DIV, "q * (log_q - log_m)).sum(-1)", "q * (log_m - log_q)).sum(-1)", "KL with log(m/q)"),
    M("div.reverse_kl", DIV, "return kl(log_m, log_q)", "return kl(log_q, log_m)",
      "reverse KL is forward KL"),
    M("div.js_log2", DIV, "log_a = torch.logaddexp(log_q, log_m) - _LOG2",
      "log_a = torch.logaddexp(log_q, log_m)", "JS midpoint not halved"),
    M("div.mc_score_recip", DIV, "- self.dphi_log(-log_rho).sum(-1)", "- self.dphi_log(log_rho).sum(-1)",
      "generic MC score loss with φ'(ρ) for φ'(1/ρ)"),
    # --- targets (MATH.md §1.3, §4, §5.4) ---
    M("targets.conditional_time", TBASE, "log_q = path.target_conditional(log_p1, xt, t)",
      "log_q = path.target_conditional(log_p1, xt, 1 - t)", "parametric target with the kernel at 1 − t"),
    M("targets.weight_product", TBASE, "weight=weight if self.weight is None else self.weight * weight",
      "weight=weight", "TargetBatch.with_weight drops the existing weights"),
    M("targets.mlm_mask_pos", TPAR, "copies[:, pos, pos] = model.mask_id",
      "copies[:, pos, pos - 1] = model.mask_id", "MLM teacher masks position i − 1 in copy i"),
    M("targets.mlm_read", TPAR, "logits[:, pos, pos].float()", "logits[:, 0, pos].float()",
      "MLM teacher reads every position from copy 0"),
    M("ar.cached_offby1", TAR, "(lp - base_tok[bb, i + 1 :]).sum(-1)", "(lp - base_tok[bb, i:-1]).sum(-1)",
      "prefix-reuse scores compare against the wrong positions (off by one)"),
    M("ar.naive_base", TAR, "out[b, i, c] = scores - base[b]", "out[b, i, c] = scores",
      "naive scores not relative to log p(x)"),
    M("ar.topk_drop_x", TAR, "return torch.cat([top, x.unsqueeze(-1)], dim=-1)", "return top",
      "Top-K candidates without x^i"),
    M("ar.taylor_temp", TAR, "/ self.temperature\n", "* self.temperature\n",
      "Taylor estimate multiplied by τ"),
    M("ar.sample_pos", TAR, "cache, j + 1, return_cache=True)", "cache, j, return_cache=True)",
      "KV-cached sampling at the wrong position"),
    # --- density ratio (MATH.md §5.1, §6.3) ---
    M("dre.loss_sign", DLOSS, "return ref_terms.mean() - data_terms.mean()",
      "return data_terms.mean() - ref_terms.mean()", "DRE loss with the sign flipped"),
    M("dre.factorized_mask", DLOSS,
      "per_pos = torch.where(mask, per_pos, torch.zeros((), dtype=per_pos.dtype, device=per_pos.device))",
      "per_pos = per_pos", "factorized log-ratio counts carry-over positions (issue 26, gap 3)"),
    M("dre.factorized_sign", DLOSS, "diff = _lift(student_log_probs, d) - _lift(",
      "diff = _lift(student_log_probs, d) + _lift(", "log m^θ + log m^ref"),
    M("dre.negatives_carry", DLOSS, "keep = ~path.loss_mask(xt)", "keep = path.loss_mask(xt)",
      "negatives redraw carried positions and keep the masked ones"),
    M("dre.negatives_layout", DLOSS, ".reshape(B, L, n).transpose(1, 2)", ".reshape(B, n, L)",
      "negatives' (position, sample) axes mixed up"),
    M("dre.log_mean_exp", DLOSS, "return torch.logsumexp(values, dim=dim) - math.log(values.shape[dim])",
      "return torch.logsumexp(values, dim=dim)", "log-mean-exp without 1/n"),
    M("dre.energy_tile", DLOSS, "flat_xt = xt.unsqueeze(1).expand(B, n, L).reshape(B * n, L)",
      "flat_xt = xt.repeat(n, 1)", "candidates paired with the wrong x_t (tiled, not interleaved)"),
    M("dre.token_norm", DOBJ, "w_data = tb.loss_mask.float() * w[:, None] / (B * tb.xt.shape[1])",
      "w_data = tb.loss_mask.float() * w[:, None] / B", "token-level DRE loss per sequence, not per token"),
    M("dre.seq_neg_norm", DOBJ, "(w / (B * n)).unsqueeze(1).expand_as(l_ref)",
      "(w / B).unsqueeze(1).expand_as(l_ref)", "sequence-level negatives summed over n, not averaged"),
    M("dre.ref_time", DOBJ, "ref_lp = reference_log_probs(reference, tb.xt, tb.t, tb.x1)",
      "ref_lp = reference_log_probs(reference, tb.xt, 1 - tb.t, tb.x1)", "reference evaluated at 1 − t"),
    M("sir.cache_stale", DSIR, "                valid &= (x == x_prev).all(-1)\n", "                pass\n",
      "SIR pick never invalidated when x_t changes (issue 26, gap 2)"),
    M("sir.select_sign", DSIR, "torch.log_softmax(f.double() / temperature",
      "torch.log_softmax(-f.double() / temperature", "SIR picks ∝ e^{−f} (EDLM's code sign)"),
    M("sir.window_open", DSIR, "use_sir = lo <= float(alphas[step]) <= hi",
      "use_sir = lo < float(alphas[step]) < hi", "SIR window open instead of closed"),
    M("sir.ignore_pick", DSIR, "chosen[rows] = cands[torch.arange(rows.numel(), device=device), j]",
      "chosen[rows] = cands[:, 0]", "SIR ignores the selection (no reweighting)"),
    M("sir.no_cache", DSIR, "need = active & ~valid", "need = active",
      "SIR never reuses its pick (cost only)"),
    M("dre.lik_corr_sign", DLIK, "log_z[rows] - log_mean_exp(f_sub", "-log_z[rows] + log_mean_exp(f_sub",
      "energy estimate's correction log Ẑ − log Ẑ_i with the sign flipped"),
    M("dre.lik_no_subst", DLIK,
      "subst[torch.arange(rows.numel(), device=device), :, pos] = x1[rows, pos].unsqueeze(-1)",
      "subst = subst", "Ẑ_i(y) without substituting y (Ẑ_i = Ẑ)"),
    M("dre.lik_nested", DLIK, "log_z = log_mean_exp(f_base[:, :k].to(wd), dim=-1)",
      "log_z = log_mean_exp(f_base.to(wd), dim=-1)", "log Ẑ from every draw for every n"),
    M("dre.lik_weight", DLIK, "torch.where(g != 0, w * g, torch.zeros_like(g))",
      "torch.where(g != 0, g, torch.zeros_like(g))", "energy estimate without κ_t"),
    # --- preference (MATH.md §5.3) ---
    M("pref.neutral_rows", PREF, "rows = torch.log_softmax(neutral_rows(logits, loss_mask).to(dtype), -1)",
      "rows = torch.log_softmax(logits.to(dtype), -1)", "Δ reads the student's logits off the loss mask"),
    M("pref.paper_sign", PREF, "F.softplus(shift - delta_w) + F.softplus(delta_l - shift)",
      "F.softplus(delta_w - shift) + F.softplus(shift - delta_l)", "paper loss rewards the rejected side"),
    M("pref.paper_log_beta", PREF, "shift = math.log(beta)", "shift = beta", "margin β used without its log"),
    M("pref.dpo_beta", PREF, "F.softplus(-beta * (delta_w - delta_l))",
      "F.softplus(-(delta_w - delta_l) / beta)", "DPO temperature divides"),
    M("pref.pair_times", PREF, "return t.view(num_t, num_pairs).T.reshape(-1)", "return t",
      "a pair's K times within one 1/B window"),
    M("pref.shared_noise", PREF, "        generator.set_state(state)\n", "        pass\n",
      "shared noise not replayed for the rejected side"),
    M("pref.swap_sides", PREF, "dw, dl = draw.delta.chunk(2)", "dl, dw = draw.delta.chunk(2)",
      "chosen and rejected swapped"),
    M("pref.kl_direction", PREF, "per = (lp.exp() * (lp - lr)).sum(-1)",
      "per = (lr.exp() * (lr - lp)).sum(-1)", "KL(ref ‖ θ) reported as KL(θ ‖ ref)"),
    M("pref.delta_unmasked", PREF, "return torch.where(loss_mask, per, 0.0).sum(-1)", "return per.sum(-1)",
      "Δ sums every position",
      equivalent="off the mask both rows are the same neutral zeros, so their log-ratio is exactly 0 there"),
    # --- distillation target (MATH.md §5.4) ---
    M("distill.kernel_time", DIST, "log_q = path.target_conditional(log_p1, xt, t)",
      "log_q = path.target_conditional(log_p1, xt, 1 - t)",
      "distillation target's kernel at 1 − t (issue 26, gap 4)"),
    M("distill.noise_data", DIST, "xt = batch.noised(path, x1, t, generator)",
      "xt = batch.noised(path, batch.x1, t, generator)", "x_t noised from the data, not from the proposal"),
    M("distill.loss_mask", DIST, "loss_mask=batch.scored(path, xt), log_q=log_q, stats=stats)",
      "loss_mask=path.loss_mask(xt), log_q=log_q, stats=stats)", "prompt positions scored"),
    # --- block model and its KV cache (MATH.md §9) ---
    M("blk.mask_noisy_sees_own_clean", BLK, "before = block[:, None] > block[None, :]",
      "before = block[:, None] >= block[None, :]", "a noisy block reads its own clean block (x_1^b leaks)", T_BLK),
    M("blk.mask_clean_not_own", BLK, "clean_q = clean[:, None] & clean[None, :] & (same | before)",
      "clean_q = clean[:, None] & clean[None, :] & before", "a clean block does not read itself", T_BLK),
    M("blk.flex_noisy_sees_own_clean", BLK, "earlier_clean = kv_clean & (kv_block < q_block)",
      "earlier_clean = kv_clean & (kv_block <= q_block)", "the flex mask lets a noisy block read its own clean block",
      T_BLK),
    M("blk.flex_halves_mixed", BLK, "same_half_block = (q_clean == kv_clean) & (q_block == kv_block)",
      "same_half_block = q_block == kv_block", "the flex mask joins a block's noisy and clean halves", T_BLK),
    M("blk.flops_clean_rows", BLK, "pairs = noisy_pairs + k * k * (nb * (nb - 1) // 2)",
      "pairs = noisy_pairs + k * k * (nb * (nb + 1) // 2)", "the FLOP count includes the unused last clean block",
      T_BLK),
    M("blk.cache_grow", BLK, "min(c.capacity, max(2 * size, start + n, 64))",
      "min(c.capacity, max(2 * size, 64))", "the buffer grows without room for one long extension", T_BLK),
    M("blk.cache_grow_copy", BLK,
      "grown[0][:, :, :start], grown[1][:, :, :start] = c.keys[i][:, :, :start], c.values[i][:, :, :start]",
      "pass", "a grown buffer drops what it held", T_BLK),
    M("blk.prefill_rope", BLK, "rope = self.rotary(n, offset=start,", "rope = self.rotary(n, offset=0,",
      "extend_cache rotates new keys from position 0, not from the cache's end", T_BLK),
    M("blk.denoise_rope", BLK, "rope = self.rotary(n, offset=cache.length,", "rope = self.rotary(n, offset=0,",
      "denoise rotates the block from position 0", T_BLK),
    M("blk.prefill_mask", BLK, "mask = pos[None, :] // k <= pos[start:, None] // k",
      "mask = pos[None, :] // k < pos[start:, None] // k", "a prefill block does not read itself", T_BLK),
    M("blk.prefill_mask_none", BLK, "if n > self.block_length:  # earlier", "if n > 2 * self.block_length:  # earlier",
      "a prefill of two blocks runs without its block-causal mask (off by one block)", T_BLK),
    M("blk.cache_length", BLK, "        cache.length = end\n", "        cache.length = end - 1\n",
      "the cache's length one short after extend_cache", T_BLK),
    M("blk.clean_time", BLK, "tb = torch.cat([tb, torch.ones_like(tb[:, 1:])], 1)",
      "tb = torch.cat([tb, torch.zeros_like(tb[:, 1:])], 1)", "clean blocks conditioned on t = 0 (1 − t)", T_BLK),
    M("blk.noisy_cond_rows", BLK, "(c[:, :nb] for c in (gate1, shift2, scale2, gate2))",
      "(c[:, -nb:] for c in (gate1, shift2, scale2, gate2))", "noisy blocks modulated with the clean blocks' times",
      T_BLK),
    # --- block paths (per-block times) and the block bound ---
    M("bpath.shared_time", PBASE, "return self.position_times(draw(batch_size * nb).view(batch_size, nb), length)",
      "return self.position_times(draw(batch_size).view(batch_size, 1).expand(batch_size, nb), length)",
      "every block of a sequence at one time", T_BPATH),
    M("bpath.tile_times", PBASE, "return t_blocks.repeat_interleave(self.block_size(length), dim=-1)",
      "return t_blocks.repeat(*([1] * (t_blocks.dim() - 1)), self.block_size(length))",
      "block times tiled over positions, not repeated per block", T_BPATH),
    M("bpath.block_bpc_norm", LIK, "blocks = torch.cat(per_block) / (L // path.num_blocks(L))",
      "blocks = torch.cat(per_block) / L", "per-block bits per token divided by L, not by the block length",
      T_BPATH),
    # --- block decoding (sampling/blocks.py) ---
    M("bdec.eos_over_pinned", BDEC, "return torch.where((pos > first) & ~fixed, torch.full_like(x, eos_id), x)",
      "return torch.where(pos > first, torch.full_like(x, eos_id), x)", "EOS fill overwrites pinned positions", T_BDEC),
    M("bdec.eos_from_first", BDEC, "return torch.where((pos > first) & ~fixed,", "return torch.where((pos >= first) & ~fixed,",
      "EOS fill from the first EOS itself", T_BDEC,
      equivalent="at pos == first x is already eos_id (first is where a generated eos_id is), and first = L selects "
                 "no position, so the filled tensor is the same"),
    M("bdec.last_eos", BDEC, ".min(-1, keepdim=True).values\n    return torch.where((pos > first)",
      ".max(-1, keepdim=True).values\n    return torch.where((pos > first)", "fill after the last EOS, not the first",
      T_BDEC),
    M("bdec.prompt_eos_stops", BDEC, "stopped |= ((xb == eos_id) & ~fixed[:, lo:hi]).any(-1)",
      "stopped |= (xb == eos_id).any(-1)", "an EOS in the prompt stops the row", T_BDEC),
    M("bdec.prefill_one_block", BDEC, "model.extend_cache(cache, x[:, cache.length : lo])",
      "model.extend_cache(cache, x[:, lo - k : lo])", "only the last pending block enters the cache", T_BDEC),
    M("bdec.rows_time", BDEC, "        t_all[rows] = t\n", "", "a row subset evaluated at the first row's time",
      T_BDEC),
    M("bdec.pinned_values", BDEC, "block_values = torch.where(fixed[:, lo:hi], values[:, lo:hi], eos)",
      "block_values = torch.where(fixed[:, lo:hi], eos, values[:, lo:hi])", "pinned and EOS values swapped", T_BDEC),
    # --- DiffusionGemma adapter ---
    M("dg.encoder_causal", DG, "causal = k <= q", "causal = k < q", "encoder tokens do not read themselves", T_DG),
    M("dg.encoder_window", DG, "(k > q - self.sliding_window)", "(k >= q - self.sliding_window)",
      "sliding window one key too wide in the encoder", T_DG),
    M("dg.decoder_prefix", DG, "prefix = k < start", "prefix = k <= start",
      "a canvas reads the clean key at its own first position", T_DG),
    M("dg.decoder_window", DG, "(k >= start - (self.sliding_window - 1))", "(k >= start - self.sliding_window)",
      "decoder's sliding window one key too wide", T_DG),
    M("dg.cache_length", DG, "        cache.length += n\n", "        cache.length = n\n",
      "cache length is the last extension's, not the total", T_DG),
    M("dg.softcap", DG, "torch.tanh(logits / cap) * cap", "torch.tanh(logits) * cap",
      "encoder logits soft-capped without 1/cap", T_DG),
    M("dg.self_cond_stale", DG, "        cache.previous_logits = None\n", "",
      "self-conditioning carries the previous canvas's logits into the next", T_DG),
    # --- Hugging Face block adapter ---
    M("hfb.clean_blocks", HFB, 'return (pos - 1).div(k, rounding_mode="floor")', 'return pos.div(k, rounding_mode="floor")',
      "clean position p's block from p, not from its token p − 1", T_HFB),
    M("hfb.anchor", HFB, "anchors = torch.cat([bos, x1[:, k - 1 : L - 1 : k]], 1)",
      "anchors = torch.cat([bos, x1[:, k : L : k]], 1)", "anchor is the block's own first token (leak)", T_HFB),
    M("hfb.anchor_time", HFB, "t_noisy = torch.cat([tt[:, ::k, None], tt.view(B, nb, k)], -1)",
      "t_noisy = torch.cat([torch.ones_like(tt[:, ::k, None]), tt.view(B, nb, k)], -1)",
      "the anchor at t = 1 in the one pass, at the block's t in the cache", T_HFB),
    M("hfb.clean_time", HFB, "t_clean = torch.ones(B, L + 1, device=dev)", "t_clean = torch.zeros(B, L + 1, device=dev)",
      "clean stream at t = 0 (1 − t)", T_HFB),
    M("hfb.prefill_pos", HFB, "pos = torch.arange(end + 1 - x.shape[1], end + 1, device=dev)",
      "pos = torch.arange(end - x.shape[1], end, device=dev)", "cache positions one short (BOS offset lost)", T_HFB),
    M("hfb.cache_anchor", HFB, "last = x_clean[:, -1]  # the next noisy block's anchor",
      "last = x_clean[:, 0]  # the next noisy block's anchor",
      "next block's anchor is the first new token, not the last", T_HFB),
    M("hfb.scratch", HFB, "scratch.layers = [copy.copy(layer) for layer in cache.hf.layers]", "pass",
      "denoise appends the noisy block to the shared cache", T_HFB),
    # --- LoRA ---
    M("lora.reference_mode", LORA, "        was = model.training\n        model.eval()\n",
      "        was = model.training\n", "the reference runs in the caller's mode (dropout on)", T_LORA),
    M("lora.reference_restore", LORA, "            model.train(was)", "            pass",
      "the reference call leaves the model in eval mode", T_LORA),
    M("lora.freeze", LORA, 'p.requires_grad_("lora_" in name)', "p.requires_grad_(True)",
      "every weight trains, not the adapters alone", T_LORA),
    M("lora.start_base", LORA, 'plain = key.replace(".base_layer.", ".")', "plain = key",
      "plain weights do not become the adapted layers' base", T_LORA),
    M("lora.fold_sign", LORA, "base.weight += layer.get_delta_weight(name)", "base.weight -= layer.get_delta_weight(name)",
      "adapters folded with the wrong sign", T_LORA),
    M("lora.fold_reset", LORA, "                layer.reset_lora_parameters(name, True)\n", "",
      "folded adapters are not reset (counted twice)", T_LORA),
    M("lora.tied", LORA, "        if len(names) > 1:\n            raise ValueError(f\"the adapted weight",
      "        if len(names) > 2:\n            raise ValueError(f\"the adapted weight",
      "a weight tied to one other layer counts as its own", T_LORA),
    M("lora.enabled_r0", BLORA, "return lora is not None and int(lora.r or 0) > 0",
      "return lora is not None and int(lora.r or 0) >= 0", "LoRA on at r = 0", T_LORA),
    M("lora.dropout_bound", BLORA, "if float(lora.dropout) < 0 or float(lora.dropout) >= 1:",
      "if float(lora.dropout) < 0 or float(lora.dropout) > 1:", "dropout 1 accepted (off by one)", T_LORA),
    M("lora.shares_ema", BLORA, 'bool(ref.ema) != (t.init_weights == "ema")',
      'bool(ref.ema) == (t.init_weights == "ema")', "shared reference when EMA and raw weights differ", T_LORA),
    # --- RL: advantages, estimators, loss, objective ---
    M("rl.adv_int_dtype", RADV, "return centred.to(out_dtype)", "return centred.to(rewards.dtype)",
      "integer rewards give truncated advantages (scale=False)", T_ADV),
    M("rl.adv_biased_std", RADV, "std = r.std(1, keepdim=True)", "std = r.std(1, keepdim=True, correction=0)",
      "biased std (GRPO's is unbiased)", T_ADV),
    M("rl.adv_axis", RADV, "centred = r - r.mean(1, keepdim=True)", "centred = r - r.mean(0, keepdim=True)",
      "centred over prompts, not within each group", T_ADV),
    M("rl.onestep_time", REST, "t = torch.full((B,), T_MIN, device=x.device)  # the source end",
      "t = torch.full((B,), 1.0 - T_MIN, device=x.device)  # the source end", "one-step estimate at 1 − t", T_EST),
    M("rl.onestep_prompt_scored", REST, "        return (logp * (comp if keep is None else comp & keep)).sum(-1)\n\n\ndef eubo",
      "        return (logp if keep is None else logp * keep).sum(-1)\n\n\ndef eubo", "one-step estimate scores the prompt too", T_EST),
    M("rl.eubo_rate", REST, "log_w = (torch.log(n + 1) - torch.log(", "log_w = (torch.log(n) - torch.log(",
      "EUBO weight n/M_k instead of (n + 1)/M_k", T_EST),
    M("rl.eubo_mean", REST, "log_e = torch.logsumexp(terms, 0) - math.log(K)", "log_e = torch.logsumexp(terms, 0)",
      "EUBO sums the K draws instead of averaging", T_EST),
    M("rl.eubo_beta", REST, "torch.zeros_like(log_e)).sum(-1) / float(beta)", "torch.zeros_like(log_e)).sum(-1)",
      "EUBO without its 1/β", T_EST),
    M("rl.eubo_prompt", REST, "xt = torch.where(comp.repeat(K, 1), path.draw_xt(xs, t, generator), xs)",
      "xt = path.draw_xt(xs, t, generator)", "EUBO noises the prompt", T_EST),
    M("rl.elbo_prompt", REST, "bound=self.bound,\n                       cond_mask=cond_mask).float()",
      "bound=self.bound,\n                       cond_mask=None).float()", "ELBO estimate of the whole sequence, prompt included",
      T_EST),
    M("rl.sandwich_side", REST, "return torch.where(sign < 0, up, lower)", "return torch.where(sign > 0, up, lower)",
      "upper bound used for positive advantages", T_EST),
    M("rl.mix_weights", REST, "up = self.mix_weight * up + (1.0 - self.mix_weight) * lower",
      "up = (1.0 - self.mix_weight) * up + self.mix_weight * lower", "mixture weights swapped", T_EST),
    M("rl.exact_block_time", REST, "logits = denoise(model, xt, torch.full((B, L), T_MIN, device=x.device), x)",
      "logits = denoise(model, xt, torch.full((B, L), 1.0 - T_MIN, device=x.device), x)",
      "one-token-block likelihood read at 1 − t", T_EST),
    M("rl.k3_sign", RLOSS, "return torch.expm1(d) - d", "return torch.expm1(d) + d", "k3 with + d", T_RLOSS),
    M("rl.ratio_detach", RLOSS, "ratio = torch.exp((logp - old_logp.detach()) / n)",
      "ratio = torch.exp((logp.detach() - old_logp.detach()) / n)", "ratio detached: no policy gradient", T_RLOSS),
    M("rl.ratio_length", RLOSS, "ratio = torch.exp((logp - old_logp.detach()) / n)",
      "ratio = torch.exp(logp - old_logp.detach())", "per-token ratio not divided by the length", T_RLOSS),
    M("rl.clip_max", RLOSS, "surrogate = torch.minimum(unclipped, clipped)", "surrogate = torch.maximum(unclipped, clipped)",
      "PPO's pessimistic min replaced by max", T_RLOSS),
    M("rl.kl_per_token", RLOSS, "kl_j = k3_kl(logp / n, ref_logp.detach().to(logp.dtype) / n)",
      "kl_j = k3_kl(logp, ref_logp.detach().to(logp.dtype))", "per-token KL not divided by the length", T_RLOSS),
    M("rl.kl_sign", RLOSS, "loss = loss + float(kl_coef) * kl", "loss = loss - float(kl_coef) * kl",
      "the KL penalty rewarded", T_RLOSS),
    M("rl.clip_ties", RLOSS, "taken_clip = (clipped < unclipped)", "taken_clip = (clipped <= unclipped)",
      "clip fraction counts unclipped rollouts", T_RLOSS),
    M("rl.old_noise", ROBJ, "old[k] = self.estimator(model, tokens, cmask, _generator(seeds[k], x1.device), sign, keep=keep)",
      "old[k] = self.estimator(model, tokens, cmask, _generator(seeds[0], x1.device), sign, keep=keep)",
      "old policy of iteration k drawn with iteration 0's noise", T_ROBJ),
    M("rl.new_noise", ROBJ, "cmask, _generator(group.seeds[it], x1.device), sign,",
      "cmask, _generator(group.seeds[0], x1.device), sign,",
      "current policy of every iteration drawn with iteration 0's noise", T_ROBJ),
    M("rl.ref_iteration", ROBJ, "ref = group.ref_logp[it] if", "ref = group.ref_logp[0] if",
      "reference of iteration 0 for every iteration (other noise than the policy's)", T_ROBJ),
    M("rl.per_token_length", ROBJ, "scored = ~group.cond if keep is None else ~group.cond & keep",
      "scored = group.cond if keep is None else group.cond & keep",
      "per-token normalisation by the prompt's length", T_ROBJ),
    M("rl.buffer_kept", ROBJ, "            self.buffer = []\n", "            pass\n",
      "the rollout buffer never cleared after μ steps", T_ROBJ),
    M("rl.old_detach", ROBJ, "old = logp.detach() if it == 0", "old = logp if it == 0",
      "on-policy old ℓ not detached", T_ROBJ,
      equivalent="grpo_loss detaches old_logp itself (ratio = exp((ℓ − ℓ_old.detach())/n)); nothing else reads it"),
    M("rl.scale_flag", ROBJ, "scale=self.scale_advantages)", "scale=True)", "scale_advantages=False ignored",
      T_ROBJ),
    # --- the capped L_score gradient (MATH.md §3.6) ---
    M("cap.value_grad", OLOSS, "return value.detach() + (surrogate - surrogate.detach())",
      "return value + (surrogate - surrogate.detach())", "the estimator's own gradient kept beside the capped one",
      T_CAP),
    M("cap.surrogate_sign", OLOSS, "return value.detach() + (surrogate - surrogate.detach())",
      "return value.detach() + (surrogate.detach() - surrogate)", "capped gradient with the wrong sign", T_CAP),
    M("cap.default_off", OLOSS, '    if cap is None or cap == "V":\n        return float(vocab_size)',
      '    if cap is None or cap == "V":\n        return math.inf', "the default cap V silently off", T_CAP),
    M("cap.tilt_default", OLOSS, "cap = math.inf if weight_cap is None else _weight_cap(weight_cap, path.vocab_size)",
      "cap = _weight_cap(weight_cap, path.vocab_size)", "the cap applied under the tilt by default", T_CAP),
    M("cap.wz_sign", DIV, "w_z = torch.exp(-log_m_z).clamp_max(cap)", "w_z = torch.exp(log_m_z).clamp_max(cap)",
      "importance weight m_z instead of 1/m_z", T_CAP),
    M("cap.s_unclamped", DIV, "s = (torch.exp(log_m) * cap).clamp_max(1.0)", "s = torch.exp(log_m) * cap",
      "Σ_y term's weight not capped at 1", T_CAP),
    M("cap.no_V", DIV, "return -(V + w_z) * log_m_z + (s * log_m).sum(-1)", "return -w_z * log_m_z + (s * log_m).sum(-1)",
      "surrogate without the −V log m_z term", T_CAP),
    # --- the seven bugs of issue 46, as mutants (the two not listed above) ---
    M("dre.lik_norm_dropped", DLIK, "0, rows, log_z[rows] - log_mean_exp(f_sub", "0, rows, -log_mean_exp(f_sub",
      "energy estimate's correction without log Ẑ", T_DRE),
    M("lik.t_max_span", LIK, "out.append(span * row_weight[done : done + n]", "out.append(row_weight[done : done + n]",
      "truncated bound's integral without its t_max factor", T_LIK),
    # --- this round: speculative decoding, the few-step target, the decode engine ---
    M("spec.accept_ratio", SPEC, "torch.exp(torch.clamp(lpy - lqy, max=0.0))", "torch.exp(torch.clamp(lqy - lpy, max=0.0))",
      "a draft accepted with min(1, q/p) instead of min(1, p/q)", T_SPEC),
    M("spec.residual", SPEC, "res = (p - q).clamp_min(0.0)", "res = p.clone()",
      "the first rejection resampled from p, not from the residual max(0, p − q)", T_SPEC),
    M("spec.first_reject", SPEC, "a = ok.long().cumprod(-1).sum(-1)", "a = ok.long().sum(-1)",
      "drafts after the first rejection still accepted", T_SPEC),
    M("spec.bonus", SPEC, "q = torch.where((a < ke).unsqueeze(1),", "q = torch.where((a <= ke).unsqueeze(1),",
      "after k acceptances the bonus token is drawn from a residual, not from row k's p", T_SPEC),
    M("few.grid_floor", FEW, "(t.double() * Ks).floor()", "(t.double() * Ks).ceil()",
      "t snapped up to the student's next grid point", T_FEW),
    M("few.window_last", FEW, "s = torch.where(last, torch.ones_like(t), grid[(k_r + 1).clamp(max=K)])",
      "s = grid[(k_r + 1).clamp(max=K)]", "a windowed rollout's last step does not jump to t = 1", T_FEW),
    M("few.record_moved", FEW, "moved[rows] = move", "moved[rows] = free",
      "the conditional recorded for tokens the step did not set", T_FEW,
      equivalent="every free position moves at its own last step (λ = 1 there; the bridge branch moves every free "
                 "token at its last step), which overwrites whatever an earlier step recorded for it"),
    M("fill.reads_xt", FILL, "lp = adjust_log_probs(denoise(teacher, x[rows], tk,",
      "lp = adjust_log_probs(denoise(teacher, xt[rows], tk,",
      "the left-to-right fill reads x_t, not x_t with the step's earlier tokens set", T_FILL),
    M("fill.step_lambda", FILL, "s = (j + 1).double() / self.student_steps", "s = (j + 2).double() / self.student_steps",
      "the fill's reveal set drawn with two student steps' λ", T_FILL),
    M("fill.no_conditionals", FILL, "        log_q[at] = lp.float()", "        log_q[at] = -math.log(vocab_size)",
      "the fill's conditionals not handed to the loss (its drawn tokens' NLL instead)", T_FILL),
    M("eng.stale_inputs", ENG, "                s.copy_(t)", "                pass",
      "a replayed call reads the inputs of its first call", T_ENG),
    M("dec.captured_last_kind", S + "sampling/decoding.py",
      "(\"order\", id(path), method, temperature, top_p, threshold, final_argmax, lo, hi, last)",
      "(\"order\", id(path), method, temperature, top_p, threshold, final_argmax, lo, hi)",
      "a decoding order's last in-block step replays the inner steps' captured graph (no step cap, no final argmax)",
      ("tests/sampling/test_decoding.py",)),
]
# fmt: on


# ------------------------------------------------------------------------------------------------- the checks


def tests_for(m: Mutant) -> tuple[str, ...]:
    return m.tests or module_tests(m.file)


def check(mutants: list[Mutant], root: Path) -> list[str]:
    """Problems with the list against the tree at `root` (empty: every pattern occurs exactly once, the ids are
    unique, the replacement differs, the test files exist)."""
    problems, seen = [], set()
    for m in mutants:
        if m.id in seen:
            problems.append(f"{m.id}: duplicate id")
        seen.add(m.id)
        path = root / m.file
        if not path.is_file():
            problems.append(f"{m.id}: no file {m.file}")
            continue
        n = path.read_text(encoding="utf-8").count(m.old)
        if n != 1:
            problems.append(f"{m.id}: pattern found {n} times in {m.file} (must be exactly once): {m.old!r}")
        if m.old == m.new:
            problems.append(f"{m.id}: the replacement is the pattern")
        if not tests_for(m):
            problems.append(f"{m.id}: no tests for {m.file} (tests/<folder>/ is empty and the mutant names none)")
        for t in tests_for(m):
            if not (root / t.split("::")[0]).is_file():
                problems.append(f"{m.id}: no test file {t}")
    return problems


# ------------------------------------------------------------------------------------------------- the copies


def copy_tree(dest: Path, root: Path = ROOT, rev: str | None = None) -> None:
    """The repository's files at `dest`: the working tree's tracked and untracked-not-ignored files, or commit
    `rev` (git archive). Nothing is ever written under `root`."""
    if rev is not None:
        data = subprocess.run(
            ["git", "archive", "--format=tar", rev], cwd=root, check=True, capture_output=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            try:
                tar.extractall(dest, filter="data")
            except TypeError:  # Python < 3.10.12 has no extraction filters (the archive is our own commit)
                tar.extractall(dest)
        return
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout
    for rel in filter(None, out.decode().split("\0")):
        src = root / rel
        if src.is_file() and "__pycache__" not in rel:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def child_env(tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree / "src") + os.pathsep + env.get("PYTHONPATH", "")
    # No bytecode: a mutant and its restored original can share size and mtime second, and a stale .pyc would
    # then run the mutant's code under the original's name.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[k] = "1"
    return env


def check_shadowing(tree: Path, python: str) -> None:
    """The copy's tcsm must be the one imported (an installed tcsm elsewhere would test the unmutated code)."""
    out = subprocess.run(
        [python, "-c", "import tcsm; print(tcsm.__file__)"],
        cwd=tree,
        env=child_env(tree),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(out).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"the copy's tcsm is shadowed by {out}; cannot test mutants")


@dataclass
class Result:
    id: str
    status: str  # killed | survived | timeout | error
    seconds: float
    detail: str = ""  # the first failing test, or why
    equivalent: str = ""
    tests: tuple[str, ...] = field(default_factory=tuple)


def run_tests(tree: Path, tests: tuple[str, ...], timeout: float, python: str) -> tuple[str, float, str]:
    """pytest -x on `tests` in `tree`: ("passed" | "failed" | "timeout" | "error", seconds, first failure)."""
    cmd = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--no-header", *tests]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=tree,
        env=child_env(tree),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "timeout", time.monotonic() - start, f"over {timeout:.0f} s"
    secs = time.monotonic() - start
    failed = [ln for ln in out.splitlines() if ln.startswith(("FAILED ", "ERROR "))]
    if proc.returncode == 0:
        return "passed", secs, ""
    if proc.returncode == 1 and failed:
        return "failed", secs, failed[0].split(" - ")[0].split(" ", 1)[1]
    tail = " | ".join(out.strip().splitlines()[-3:])
    return "error", secs, f"pytest exit {proc.returncode}: {tail[:300]}"


class Workers:
    """`jobs` private copies of the tree, handed out one per running mutant."""

    def __init__(self, jobs: int, root: Path, rev: str | None, python: str):
        self.base = Path(tempfile.mkdtemp(prefix="tcsm-mutants-"))
        self.free: list[Path] = []
        self.lock = threading.Lock()
        try:
            for i in range(jobs):
                tree = self.base / f"tree{i}"
                tree.mkdir()
                copy_tree(tree, root, rev)
                self.free.append(tree)
            check_shadowing(self.free[0], python)
        except BaseException:
            self.close()
            raise

    def take(self) -> Path:
        with self.lock:
            return self.free.pop()

    def give(self, tree: Path) -> None:
        with self.lock:
            self.free.append(tree)

    def close(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)


def run_mutant(m: Mutant, workers: Workers, timeout: float, python: str) -> Result:
    tree = workers.take()
    path = tree / m.file
    original = path.read_text(encoding="utf-8")
    try:
        if original.count(m.old) != 1:
            return Result(m.id, "error", 0.0, "pattern not found exactly once in the copy", m.equivalent)
        path.write_text(original.replace(m.old, m.new), encoding="utf-8")
        outcome, secs, detail = run_tests(tree, tests_for(m), timeout, python)
    finally:
        path.write_text(original, encoding="utf-8")
        workers.give(tree)
    status = {"passed": "survived", "failed": "killed", "timeout": "timeout"}.get(outcome, "error")
    return Result(m.id, status, secs, detail, m.equivalent, tests_for(m))


def baseline(mutants: list[Mutant], workers: Workers, timeout: float, python: str) -> dict[tuple, float]:
    """Each distinct test set once on the unmutated copy: it must pass (else every mutant would look killed)."""
    sets = sorted({tests_for(m) for m in mutants})
    out = {}
    with ThreadPoolExecutor(max_workers=len(workers.free)) as pool:

        def one(tests):
            tree = workers.take()
            try:
                return tests, run_tests(tree, tests, timeout, python)
            finally:
                workers.give(tree)

        for tests, (outcome, secs, detail) in pool.map(one, sets):
            print(
                f"baseline {outcome:7s} {secs:6.1f}s  {' '.join(tests)}" + (f"  {detail}" if detail else ""),
                flush=True,
            )
            if outcome != "passed":
                raise SystemExit(f"the unmutated tests fail ({detail}); fix them before testing mutants")
            out[tests] = secs
    return out


def summarise(results: list[Result]) -> dict:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    caught = sum(r.status in ("killed", "timeout") for r in results)
    real = [r for r in results if not r.equivalent]
    real_caught = sum(r.status in ("killed", "timeout") for r in real)
    return {
        "mutants": len(results),
        "counts": counts,
        "kill_rate": caught / max(1, len(results)),
        "non_equivalent": len(real),
        "kill_rate_non_equivalent": real_caught / max(1, len(real)),
        "survivors": [r.id for r in results if r.status == "survived"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-j", "--jobs", type=int, default=1, help="mutants run at once (one tree copy each)")
    ap.add_argument(
        "-k", action="append", default=[], help="run the mutants whose id contains this (repeatable)"
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per mutant (default: 3 × its tests' unmutated time + 60)",
    )
    ap.add_argument(
        "--rev", default=None, help="test a committed tree (git archive REV) instead of the working tree"
    )
    ap.add_argument("--check", action="store_true", help="only check that every pattern occurs exactly once")
    ap.add_argument("--list", action="store_true", help="list the mutants")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run (needs --timeout)")
    args = ap.parse_args(argv)
    python = sys.executable

    chosen = [m for m in MUTANTS if not args.k or any(k in m.id for k in args.k)]
    if args.list:
        for m in chosen:
            print(
                f"{m.id:28s} {m.file.removeprefix(S):34s} {m.why}" + (" [equivalent]" if m.equivalent else "")
            )
        return 0
    if args.rev is None:
        problems = check(chosen, ROOT)
    else:
        with tempfile.TemporaryDirectory(prefix="tcsm-mutants-check-") as d:
            copy_tree(Path(d), ROOT, args.rev)
            problems = check(chosen, Path(d))
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    print(f"{len(chosen)} mutants, every pattern found exactly once", flush=True)
    if args.check:
        return 0
    if args.no_baseline and args.timeout is None:
        ap.error("--no-baseline needs --timeout")
    if not chosen:
        return 0

    t0, cpu0, load0 = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN), os.getloadavg()
    workers = Workers(max(1, args.jobs), ROOT, args.rev, python)
    try:
        base = {} if args.no_baseline else baseline(chosen, workers, args.timeout or 1800.0, python)

        def timeout_of(m):
            return args.timeout if args.timeout is not None else 3.0 * base[tests_for(m)] + 60.0

        results: list[Result] = []
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [pool.submit(run_mutant, m, workers, timeout_of(m), python) for m in chosen]
            for i, fut in enumerate(futures, 1):
                r = fut.result()
                results.append(r)
                note = f"  [equivalent: {r.equivalent}]" if r.equivalent and r.status == "survived" else ""
                print(
                    f"[{i:3d}/{len(chosen)}] {r.status:8s} {r.id:28s} {r.seconds:6.1f}s  {r.detail}{note}",
                    flush=True,
                )
    finally:
        workers.close()
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    summary = summarise(results)
    summary.update(
        wall_s=round(time.monotonic() - t0, 1),
        cpu_s=round((cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime), 1),
        jobs=args.jobs,
        loadavg_start=[round(x, 2) for x in load0],
        loadavg_end=[round(x, 2) for x in os.getloadavg()],
        rev=args.rev,
    )
    print(
        f"\n{summary['mutants']} mutants: {summary['counts']}; kill rate {summary['kill_rate']:.1%} "
        f"({summary['kill_rate_non_equivalent']:.1%} of {summary['non_equivalent']} non-equivalent); "
        f"wall {summary['wall_s']} s, CPU {summary['cpu_s']} s, -j {args.jobs}, load {summary['loadavg_start']} → "
        f"{summary['loadavg_end']}"
    )
    for r in results:
        if r.status == "survived":
            print(
                f"  survived {r.id}: {next(m.why for m in MUTANTS if m.id == r.id)}"
                + (f" — equivalent: {r.equivalent}" if r.equivalent else "")
            )
    if args.json:
        Path(args.json).write_text(
            json.dumps({"summary": summary, "results": [r.__dict__ for r in results]}, indent=1, default=list)
        )
    bad = [r for r in results if r.status in ("survived", "error") and not r.equivalent]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
