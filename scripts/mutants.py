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
    "posttrain/distill": ("tests/targets/test_parametric.py",),
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
    M("lik.prior_sign", LIK, "return terms.mean(0) + prior", "return terms.mean(0) - prior",
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
