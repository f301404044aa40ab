"""Preference fine-tuning on chosen / rejected pairs against a frozen reference (MATH.md §5.3, §8 item 18).

A factorized student over the reference (strategy (i), MATH.md §5.1) gives, at a noisy state x_t, the sequence
log-ratio over the noised response positions

    Δ(x, x_t) = Σ_{i ∈ M(x_t), i ∉ prompt} [log m^θ_i(x^i | x_t) − log m^ref_i(x^i | x_t)]    (carry-over: 0)

and two losses use it, with t ~ U(0, 1) shared by the two sides of a pair and x_t^w, x_t^l drawn independently
from p_{t|1}(· | x^w), p_{t|1}(· | x^l) (MATH.md §5.3 step 1; `noise="shared"` couples their draws instead):

* "paper" — `alg:dpo` with the missing noising step: logits z = Δ − log β, loss softplus(−z_w) + softplus(z_l).
  β is a margin, not DPO's temperature; the pointwise optimum is e^Δ = β p^w / p^l (oracle vi.f);
* "dpo" — Diffusion-DPO-style −log σ(β_DPO (Δ_w − Δ_l)) with its own β_DPO; under Bradley–Terry preferences
  σ(R(x) − R(y)) its optimum is p^θ ∝ p^ref e^{R/β_DPO}, the KL-regularised reward optimum.

`PreferenceObjective` is a `tcsm.core.protocols.TrainingObjective` (the run's frozen reference is given to
its constructor once, when the run is built) and `Evaluates`: held-out preference accuracy, mean implicit reward margin and a
KL estimate to the reference. Losses are nats per pair and per t draw (a classification loss, not per token).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from tcsm.core.batch import Batch, as_batch
from tcsm.core.results import summarise_nats
from tcsm.models.kinds import denoise
from tcsm.models.modes import eval_mode
from tcsm.objectives import get_weighting, neutral_rows
from tcsm.paths import ProbabilityPath
from tcsm.paths.bounds import nelbo_integrand, resolve_bound
from tcsm.paths.timesteps import T_MIN, sample_times, stratified_times

__all__ = [
    "PREFERENCE_LOSSES",
    "PreferenceObjective",
    "dpo_preference_loss",
    "pair_times",
    "paper_preference_loss",
    "sequence_log_ratio",
]



def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def sequence_log_ratio(logits: Tensor, ref_logits: Tensor, x1: Tensor, loss_mask: Tensor) -> Tensor:
    """Δ = Σ_{i: loss_mask} [log m^θ_i(x1^i) − log m^ref_i(x1^i)] per sequence [B] (MATH.md §5.1 strategy (i), §5.3).

    Rows off `loss_mask` are replaced by neutral ones and their terms zeroed, so whatever either model emits there
    (carry-over and prompt positions, even inf / NaN) reaches neither Δ nor its gradient — without selecting rows,
    which would read their count back to the host on every step of an accelerator.
    """
    dtype = _compute_dtype(logits)
    rows = torch.log_softmax(neutral_rows(logits, loss_mask).to(dtype), -1)
    ref_rows = torch.log_softmax(neutral_rows(ref_logits, loss_mask).to(dtype), -1)
    z = torch.where(loss_mask, x1, 0).unsqueeze(-1)
    per = (rows.gather(-1, z) - ref_rows.gather(-1, z)).squeeze(-1)
    return torch.where(loss_mask, per, 0.0).sum(-1)

def paper_preference_loss(delta_w: Tensor, delta_l: Tensor, beta: float) -> Tensor:
    """softplus(−(Δ_w − log β)) + softplus(Δ_l − log β): BCE with r = p^θ / (β p^ref) (MATH.md §5.3, `alg:dpo`)."""
    shift = math.log(beta)
    return F.softplus(shift - delta_w) + F.softplus(delta_l - shift)


def dpo_preference_loss(delta_w: Tensor, delta_l: Tensor, beta: float) -> Tensor:
    """−log σ(β_DPO (Δ_w − Δ_l)) (MATH.md §5.3's Diffusion-DPO-style option)."""
    return F.softplus(-beta * (delta_w - delta_l))


PREFERENCE_LOSSES: dict[str, Callable[[Tensor, Tensor, float], Tensor]] = {
    "paper": paper_preference_loss,
    "dpo": dpo_preference_loss,
}


def pair_times(
    num_pairs: int, num_t: int, *, antithetic: bool = True, generator=None, device=None, dtype=torch.float32
) -> Tensor:
    """[B·K] times, row b·K + k for draw k of pair b (the order of `repeat_interleave(K)`), MATH.md §5.3.

    Antithetic: the K·B times (u + j/(KB)) mod 1 of one antithetic batch, time j = k·B + b going to draw k of pair
    b, so a pair's K times lie 1/K apart (not within a window of 1/B, as repeating each pair before drawing the
    batch would put them). Otherwise i.i.d. U(0, 1)."""
    t = sample_times(num_pairs * num_t, antithetic=antithetic, generator=generator, device=device, dtype=dtype)
    return t.view(num_t, num_pairs).T.reshape(-1)


@dataclass
class PairDraw:
    """One noisy draw of every pair, both sides stacked as rows [chosen; rejected] (2B rows each)."""

    xt: Tensor  # [2B, L] noisy inputs, prompts pinned
    t: Tensor  # [2B] the pair's t, twice
    x1: Tensor  # [2B, L] clean chosen then rejected sequences
    mask: Tensor  # [2B, L] scored positions: noised, not prompt
    logits: Tensor  # [2B, L, V] student
    ref_logits: Tensor  # [2B, L, V] reference (no gradient)
    delta: Tensor  # [2B] Δ of each row


class PreferenceObjective:
    """Pairwise preference loss on `Batch(x1=chosen, rejected=rejected, cond_mask=prompt)` (MATH.md §5.3).

    `loss`: "paper" (margin `beta`) or "dpo" (temperature `beta_dpo`). `num_t` = K draws (t, x_t^w, x_t^l) per
    pair and step (`pair_times`): with `antithetic`, one u ~ U(0, 1) per call and pair b of B gets the K times
    t_{b,k} = (u + b/(KB) + k/K) mod 1 — spread 1/K apart over [0, 1), each marginally uniform, the whole batch
    an even grid of step 1/(KB) (K = 1: MDLM's antithetic batch); without it, K·B i.i.d. uniform times. The noisy
    draws x_t of different k are independent given t.
    `weighting`: ω(t) from `tcsm.objectives.WEIGHTINGS`, multiplying each pair's loss ("none": the algorithm as
    printed). `noise`: "independent" (MATH.md §5.3) or "shared" (x_t^w and x_t^l from the same random draws).
    `reference`: the frozen reference denoiser (the run's `reference.path`), given once when the run is built.
    `eval_num_t`: stratified times per held-out pair in `evaluate`.
    """

    def __init__(
        self,
        path: ProbabilityPath,
        loss: str = "paper",
        beta: float = 1.0,
        beta_dpo: float = 0.1,
        num_t: int = 2,
        weighting: str | Callable = "none",
        noise: str = "independent",
        antithetic: bool = True,
        reference=None,
        eval_num_t: int = 4,
        bound: str | None = None,
        time_dtype: torch.dtype = torch.float32,
    ):
        if loss not in PREFERENCE_LOSSES:
            raise ValueError(f"unknown preference loss {loss!r}; choose one of {sorted(PREFERENCE_LOSSES)}")
        if not beta > 0 or not beta_dpo > 0:
            raise ValueError(f"beta and beta_dpo must be > 0, got {beta} and {beta_dpo}")
        if int(num_t) < 1 or int(eval_num_t) < 1:
            raise ValueError(f"num_t and eval_num_t must be >= 1, got {num_t} and {eval_num_t}")
        if noise not in ("independent", "shared"):
            raise ValueError(f"noise must be 'independent' or 'shared', got {noise!r}")
        self.path = path
        self.loss_name = loss
        self.loss_fn = PREFERENCE_LOSSES[loss]
        self.beta, self.beta_dpo = float(beta), float(beta_dpo)
        self.num_t, self.eval_num_t = int(num_t), int(eval_num_t)
        self.weighting = get_weighting(weighting)
        self.noise = noise
        self.antithetic = bool(antithetic)
        self.reference = reference
        self.bound = resolve_bound(path, bound)
        self.time_dtype = time_dtype

    @property
    def loss_beta(self) -> float:
        """The β the chosen loss uses: the margin β ("paper") or β_DPO ("dpo")."""
        return self.beta if self.loss_name == "paper" else self.beta_dpo

    def _reference(self):
        ref = self.reference
        if ref is None:
            raise ValueError(
                "the preference objective needs the frozen reference model (reference.path)"
            )
        return ref

    def noised_pair(
        self, batch: Batch, t: Tensor, generator: torch.Generator | None
    ) -> tuple[Tensor, Tensor]:
        """(x_t^w, x_t^l) ~ p_{t|1}(· | x^w), p_{t|1}(· | x^l) at the same t, prompt positions kept (MATH.md §5.3)."""
        chosen = Batch(batch.x1, cond_mask=batch.cond_mask)
        rejected = Batch(batch.rejected, cond_mask=batch.cond_mask)
        if self.noise == "independent":
            return chosen.noised(self.path, chosen.x1, t, generator), rejected.noised(
                self.path, rejected.x1, t, generator
            )
        if generator is None:  # coupling needs a stream whose state can be replayed
            seed = int(torch.randint(0, 2**62, (), dtype=torch.long))
            generator = torch.Generator(device=batch.x1.device).manual_seed(seed)
        state = generator.get_state()
        xt_w = chosen.noised(self.path, chosen.x1, t, generator)
        generator.set_state(state)
        return xt_w, rejected.noised(self.path, rejected.x1, t, generator)

    def _draw(self, model, ref, batch: Batch, t: Tensor, generator) -> PairDraw:
        """Both sides of every pair noised at t and scored by the student and the reference in one call each."""
        xt_w, xt_l = self.noised_pair(batch, t, generator)
        xt, tt = torch.cat([xt_w, xt_l]), torch.cat([t, t])
        both = Batch(
            torch.cat([batch.x1, batch.rejected]),
            cond_mask=None if batch.cond_mask is None else torch.cat([batch.cond_mask, batch.cond_mask]),
        )
        mask = both.scored(self.path, xt)
        logits = denoise(model, xt, tt, both.x1)
        with torch.no_grad():
            ref_logits = denoise(ref, xt, tt, both.x1)
        delta = sequence_log_ratio(logits, ref_logits, both.x1, mask)
        return PairDraw(xt, tt, both.x1, mask, logits, ref_logits, delta)

    def __call__(self, model, batch, generator: torch.Generator | None = None):
        """Mean over pairs × `num_t` draws of ω(t) · w · loss(Δ_w, Δ_l) (nats per pair), and metrics (MATH.md §5.3)."""
        batch = as_batch(batch)
        if not batch.paired:
            raise ValueError("the preference objective needs pairs (Batch.rejected); use data.kind=pairs")
        ref = self._reference()
        K = self.num_t
        rep = Batch(
            batch.x1.repeat_interleave(K, 0),
            cond_mask=None if batch.cond_mask is None else batch.cond_mask.repeat_interleave(K, 0),
            rejected=batch.rejected.repeat_interleave(K, 0),
        )
        t = pair_times(
            batch.x1.shape[0], K, antithetic=self.antithetic, generator=generator, device=rep.x1.device,
            dtype=self.time_dtype,
        )
        draw = self._draw(model, ref, rep, t, generator)
        dw, dl = draw.delta.chunk(2)
        per = self.loss_fn(dw, dl, self.loss_beta) * self.weighting(self.path, t).to(dw.dtype)
        if batch.weight is not None:
            per = per * batch.weight.repeat_interleave(K).to(per.dtype)
        loss = per.mean()
        with torch.no_grad():
            metrics = {
                "loss": loss.detach().float(),
                "accuracy": (dw > dl).float().mean(),
                "margin": (dw - dl).float().mean(),
                "delta_chosen": dw.float().mean(),
                "delta_rejected": dl.float().mean(),
                "loss_positions": draw.mask.float().mean(),
                "t_mean": t.float().mean(),
            }
        return loss, metrics

    @torch.no_grad()
    def evaluate(self, model, data, *, batch_size: int = 64, generator=None, device=None, **_) -> dict:
        """Held-out metrics of `data` (PairRows or a paired Batch), each pair at `eval_num_t` stratified times:

        * `pref_accuracy`: fraction of pairs with ĝ(x^w) > ĝ(x^l), where ĝ(x) = E_t w(t)[G_ref − G_θ] is the
          difference of the two models' bound integrands (MATH.md §2.1) at the same x_t with the prompt pinned —
          for the masked source exactly NELBO_ref(x | prompt) − NELBO_θ(x | prompt), an estimate of the implicit
          reward log p^θ(x | prompt) − log p^ref(x | prompt); `reward_margin`: the mean of ĝ(x^w) − ĝ(x^l);
        * `kl_ref`: E_{t~U(0,1)} E_{x_t} KL(p^θ_{1|t}(· | x_t) ‖ p^ref_{1|t}(· | x_t)) in nats per sequence, exact
          for the factorized denoisers at each x_t (a sum of per-position KLs over the scored positions), with x_t
          noised held-out chosen and rejected sequences — a measure of drift on the data, not KL(p^θ_1 ‖ p^ref_1);
        * `pref_loss`: the training loss at the same draws; and the bound of the chosen responses given their
          prompts (`bpc`, ...; masked: the conditional NELBO) in the trainer's report format.
        """
        ref = self._reference()
        rows = data.to_batch() if hasattr(data, "to_batch") else as_batch(data)
        if not rows.paired:
            raise ValueError("preference evaluation needs pairs (data.kind=pairs)")
        device = rows.x1.device if device is None else torch.device(device)
        N, L = rows.x1.shape
        K = self.eval_num_t
        acc: dict[str, list[Tensor]] = {k: [] for k in ("g_w", "g_l", "kl", "loss", "nats")}
        with eval_mode(model):
            for s in range(0, N, int(batch_size)):
                b = Batch(
                    rows.x1[s : s + batch_size].to(device),
                    cond_mask=None
                    if rows.cond_mask is None
                    else rows.cond_mask[s : s + batch_size].to(device),
                    rejected=rows.rejected[s : s + batch_size].to(device),
                )
                n = b.x1.shape[0]
                times = stratified_times(K, n, generator=generator, device=device, dtype=self.time_dtype)
                parts = {
                    k: torch.zeros(n, dtype=torch.float64, device=device)
                    for k in ("g_w", "g_l", "kl", "loss", "nats")
                }
                for k in range(K):
                    t = times[k].clamp_min(T_MIN)
                    d = self._draw(model, ref, b, t, generator)
                    dw, dl = d.delta.chunk(2)
                    g_model = nelbo_integrand(d.logits, d.x1, d.xt, d.t, self.path, self.bound).double()
                    g = (
                        nelbo_integrand(d.ref_logits, d.x1, d.xt, d.t, self.path, self.bound).double()
                        - g_model
                    )
                    parts["g_w"] += g[:n] / K
                    parts["g_l"] += g[n:] / K
                    parts["nats"] += g_model[:n] / K
                    parts["loss"] += self.loss_fn(dw, dl, self.loss_beta).double() / K
                    kl = _masked_kl(d.logits, d.ref_logits, d.mask)
                    parts["kl"] += (kl[:n] + kl[n:]).double() / (2 * K)
                for key, v in parts.items():
                    acc[key].append(v.cpu())
        got = {k: torch.cat(v) for k, v in acc.items()}
        margin = got["g_w"] - got["g_l"]
        out = summarise_nats(got["nats"] / L, L, f"{self.bound}, chosen | prompt")
        out.update(
            pref_accuracy=float((margin > 0).double().mean()),
            reward_margin=float(margin.mean()),
            reward_margin_stderr=_stderr(margin),
            kl_ref=float(got["kl"].mean()),
            kl_ref_stderr=_stderr(got["kl"]),
            pref_loss=float(got["loss"].mean()),
            num_pairs=int(N),
            num_t=K,
        )
        return out

    def to(self, device) -> PreferenceObjective:
        if isinstance(self.reference, torch.nn.Module):
            self.reference.to(device)
        return self

    def __repr__(self) -> str:
        return (
            f"PreferenceObjective(path={self.path!r}, loss={self.loss_name!r}, beta={self.beta}, "
            f"beta_dpo={self.beta_dpo}, num_t={self.num_t}, noise={self.noise!r})"
        )


def _masked_kl(logits: Tensor, ref_logits: Tensor, mask: Tensor) -> Tensor:
    """Σ_{i: mask} KL(m^θ_i ‖ m^ref_i) per sequence [B] (rows off the mask reach neither value nor gradient)."""
    dtype = _compute_dtype(logits)
    lp = torch.log_softmax(neutral_rows(logits, mask).to(dtype), -1)
    lr = torch.log_softmax(neutral_rows(ref_logits, mask).to(dtype), -1)
    per = (lp.exp() * (lp - lr)).sum(-1)
    return torch.where(mask, per, 0.0).sum(-1)


def _stderr(x: Tensor) -> float:
    return float(x.std(unbiased=True) / math.sqrt(x.numel())) if x.numel() > 1 else float("nan")
