"""Baseline objectives: training directly on a path's likelihood bound (MATH.md §2.2, §2.3).

`score_entropy_loss` is the per-sequence integrand w(t) · G(t, x_t) of `tcsm.paths.bounds.nelbo_integrand`, so

    E_{t ~ U(0,1)} E_{x_1, x_t ~ p_{t|1}} (1/L) score_entropy_loss = NELBO(x_1) / L      (α_0 = 0: no prior term)

and gradient descent on it minimises the same bound that `tcsm eval` reports. With the uniform source and the
time-reversal bound (§2.3 B, the default there) this is **SEDD-style score entropy (mean-parameterised)**:
SEDD's diffusion-weighted denoising score entropy c_t Σ_i Σ_{y≠x_t^i} D_GKL(r^i_y ‖ ŝ^i_y), c_t = α̇_t/(Vα_t),
except that ŝ is computed from the denoiser's clean-token probabilities m_θ (§1.2),
ŝ_y = 1 + b_t m_θ(y) − b_t/(1 + b_t) m_θ(x_t), whereas SEDD's network outputs log ŝ directly. Other choices:

* uniform source, bound "dfm" (§2.3 A): the DFM generalized-KL loss (flow_matching's MixturePathGeneralizedKL);
* masked source, bound "masked" (§2.2): MDLM's continuous-time NELBO, which is the same loss as TCSM masked
  L_distrib with κ_t weighting (`objective.name=tcsm`, loss distrib) — only the schedule / time-conditioning
  choices make an "MDLM" run differ from a TCSM one.

Select it in a config with `objective.name=sedd` (keys: `bound`, `antithetic`).
"""

from __future__ import annotations

from torch import Tensor

from tcsm.objectives.composed import Objective
from tcsm.paths import ProbabilityPath
from tcsm.paths.bounds import nelbo_integrand, resolve_bound
from tcsm.targets.base import TargetBatch

__all__ = ["ScoreEntropyObjective", "score_entropy_loss"]


def score_entropy_loss(logits: Tensor, batch: TargetBatch, path: ProbabilityPath, bound: str | None = None) -> Tensor:
    """Per-sequence bound integrand [B] (nats): w(t) G(t, x_t) of MATH.md §2.2 / §2.3 (B by default, uniform).

    Its expectation over t ~ U(0, 1) and x_t ~ p_{t|1}(·|x_1) is the NELBO of x_1 (§2.4), so it already
    carries its time weight (c_t or κ_t): use it with the unit weighting ω(t) = 1. Computed in float64 outside
    autocast by `nelbo_integrand`; differentiable in `logits`.
    """
    return nelbo_integrand(logits, batch.x1, batch.xt, batch.t, path, bound=bound)


# `Objective` checks loss options when it is built; a wrong bound for the path fails there, not mid-run.
score_entropy_loss.validate = lambda bound=None, **_: None


class ScoreEntropyObjective(Objective):
    """L = E_t E_{x_1, x_t} (1/L) w(t) G(t, x_t): the likelihood bound itself as the training loss (MATH.md §2).

    A TCSM `Objective` with `score_entropy_loss` and ω(t) = 1, so time sampling (antithetic t), targets,
    per-sequence weights and metrics are exactly those of the TCSM objectives it is compared with.
    """

    def __init__(self, path: ProbabilityPath, target=None, bound: str | None = None, antithetic: bool = True, **kwargs):
        self.bound = resolve_bound(path, bound)
        super().__init__(
            path, target, loss=score_entropy_loss, weighting="none", antithetic=antithetic, bound=self.bound, **kwargs
        )
        self.loss_name = {"reversal": "sedd_score_entropy", "dfm": "dfm_gkl", "masked": "mdlm_nelbo"}[self.bound]
