"""Divergences for TCSM: separable Bregman generators and f-divergences between distributions (MATH.md §3.5).

Two families, both vectorised over leading dimensions:

* `BREGMAN[name]` — a `BregmanGenerator` φ of a separable Bregman divergence F(u) = Σ_y φ(u_y), used to compare
  concrete scores (ratios): D_φ(u, v) = φ(u) − φ(v) − φ'(v)(u − v) elementwise (MATH.md §3.2, §3.5).
  Each generator also works on log-ratios, because ratios of probabilities span many orders of magnitude.
* `F_DIVERGENCES[name]` — D(q ‖ m) between distributions over the last axis, given as log-probabilities
  (MATH.md §3.5): KL, reverse KL, Itakura–Saito, squared (Pearson / LSIF) and logistic (2·Jensen–Shannon).

Conventions: 0·log 0 = 0; a log-probability of −inf is a zero-probability entry. Results are +inf exactly where
the mathematics says so (e.g. reverse KL when q has a zero that m does not), never NaN for finite inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from tcsm.core.parts import Parts

__all__ = [
    "BREGMAN",
    "F_DIVERGENCES",
    "BregmanGenerator",
    "get_bregman",
    "get_f_divergence",
    "itakura_saito",
    "kl",
    "logistic",
    "reverse_kl",
    "squared",
]

_LOG2 = math.log(2.0)


def _zero_where(cond: Tensor, x: Tensor) -> Tensor:
    return torch.where(cond, torch.zeros((), dtype=x.dtype, device=x.device), x)


# ---------------------------------------------------------------------------------------------------
# Separable Bregman generators
# ---------------------------------------------------------------------------------------------------


class BregmanGenerator:
    """A strictly convex φ on u ≥ 0 with D_φ(u, v) = φ(u) − φ(v) − φ'(v)(u − v) (MATH.md §3.5).

    Linear-space methods take ratios u ≥ 0; `*_log` methods take l = log u (−inf allowed for u = 0).
    `conj_log(l)` is u φ'(u) − φ(u), the term that appears in the Monte Carlo score loss (MATH.md §3.4) and in
    Bregman density-ratio estimation (MATH.md §5.1).
    """

    name: str = "bregman"
    #: whether the Monte Carlo score estimator carries importance weights 1/m_y that `mc_score_surrogate` caps
    importance_weighted: bool = False

    def phi(self, u: Tensor) -> Tensor:
        raise NotImplementedError

    def dphi(self, u: Tensor) -> Tensor:
        raise NotImplementedError

    def phi_log(self, lu: Tensor) -> Tensor:
        return self.phi(lu.exp())

    def dphi_log(self, lu: Tensor) -> Tensor:
        return self.dphi(lu.exp())

    def conj_log(self, lu: Tensor) -> Tensor:
        u = lu.exp()
        return u * self.dphi(u) - self.phi(u)

    def divergence(self, u: Tensor, v: Tensor) -> Tensor:
        """Elementwise D_φ(u, v) = φ(u) − φ(v) − φ'(v)(u − v) for u ≥ 0, v > 0 (MATH.md §3.5)."""
        return self.phi(u) - self.phi(v) - self.dphi(v) * (u - v)

    def divergence_log(self, lu: Tensor, lv: Tensor) -> Tensor:
        """Elementwise D_φ(e^{lu}, e^{lv}) computed from log-ratios (MATH.md §3.5)."""
        return self.divergence(lu.exp(), lv.exp())

    def mc_score(self, log_m: Tensor, log_m_z: Tensor) -> Tensor:
        """Monte Carlo score loss at one position, summed over y (MATH.md §3.4), ρ_y = m_y / m_z:
        ℓ_φ(z) = Σ_y [ρ_y φ'(ρ_y) − φ(ρ_y)] − Σ_y φ'(1/ρ_y); E_z ℓ_φ = E_z Σ_y D_φ(w_y, ρ_y) + C."""
        log_rho = log_m - log_m_z.unsqueeze(-1)
        return self.conj_log(log_rho).sum(-1) - self.dphi_log(-log_rho).sum(-1)

    def mc_score_surrogate(self, log_m: Tensor, log_m_z: Tensor, cap: float) -> Tensor | None:
        """A loss whose gradient is the Monte Carlo score's with its importance weights capped at `cap`
        (MATH.md §3.6), or None where this generator's estimator has no such weights to cap."""
        return None

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _capped_gkl_surrogate(log_m: Tensor, log_m_z: Tensor, cap: float) -> Tensor:
    """−(V + sg[min(1/m_z, c)]) log m_z + Σ_y sg[min(1, c m_y)] log m_y (MATH.md §3.6).

    Its gradient is that of the GKL box ℓ = −V log m_z + 1/m_z + Σ_y log m_y with every importance weight 1/m_y
    replaced by min(1/m_y, c): c = ∞ is the box's own gradient, c = 0 is V × cross-entropy, and for every c the
    expected gradient vanishes exactly at the posterior marginal.
    """
    V = log_m.shape[-1]
    with torch.no_grad():
        w_z = torch.exp(-log_m_z).clamp_max(cap)
        s = (torch.exp(log_m) * cap).clamp_max(1.0)
    return -(V + w_z) * log_m_z + (s * log_m).sum(-1)


class GKL(BregmanGenerator):
    """φ(u) = u log u: generalized KL, D(u, v) = u log(u/v) − u + v (MATH.md §0)."""

    name = "gkl"
    importance_weighted = True

    def phi(self, u):
        return torch.special.xlogy(u, u)

    def dphi(self, u):
        return torch.log(u) + 1.0

    def phi_log(self, lu):
        u = lu.exp()
        return _zero_where(u == 0, u * lu)

    def dphi_log(self, lu):
        return lu + 1.0

    def conj_log(self, lu):
        return lu.exp()

    def divergence(self, u, v):
        return torch.special.xlogy(u, u) - torch.special.xlogy(u, v) - u + v

    def divergence_log(self, lu, lv):
        u = lu.exp()
        return _zero_where(u == 0, u * (lu - lv)) - u + lv.exp()

    def mc_score(self, log_m, log_m_z):
        """The boxed form of MATH.md §3.4: ℓ = −V log m_z + 1/m_z + Σ_y log m_y (generic form + V)."""
        V = log_m.shape[-1]
        return -V * log_m_z + torch.exp(-log_m_z) + log_m.sum(-1)

    def mc_score_surrogate(self, log_m, log_m_z, cap):
        return _capped_gkl_surrogate(log_m, log_m_z, cap)


class Squared(BregmanGenerator):
    """φ(u) = (u − 1)²/2: least squares (LSIF / Meng et al.'s concrete score matching), D = (u − v)²/2."""

    name = "squared"

    def phi(self, u):
        return 0.5 * (u - 1.0) ** 2

    def dphi(self, u):
        return u - 1.0

    def conj_log(self, lu):
        return 0.5 * torch.expm1(2.0 * lu)

    def divergence(self, u, v):
        return 0.5 * (u - v) ** 2


class ItakuraSaito(BregmanGenerator):
    """φ(u) = −log u: Itakura–Saito, D(u, v) = u/v − log(u/v) − 1 (+inf at u = 0)."""

    name = "is"
    importance_weighted = True

    def phi(self, u):
        return -torch.log(u)

    def dphi(self, u):
        return -1.0 / u

    def phi_log(self, lu):
        return -lu

    def dphi_log(self, lu):
        return -torch.exp(-lu)

    def conj_log(self, lu):
        return lu - 1.0

    def divergence(self, u, v):
        return self.divergence_log(torch.log(u), torch.log(v))

    def divergence_log(self, lu, lv):
        return _is_terms(lu, lv)

    def mc_score_surrogate(self, log_m, log_m_z, cap):
        # The generic IS estimator, Σ_y (log ρ_y − 1) + Σ_y ρ_y, is the GKL box minus V: the same weights.
        return _capped_gkl_surrogate(log_m, log_m_z, cap)


class Logistic(BregmanGenerator):
    """φ(u) = u log u − (1 + u) log(1 + u): logistic / BCE, D(u, v) = u log[u(1+v) / (v(1+u))] + log[(1+v)/(1+u)]."""

    name = "logistic"

    def phi(self, u):
        return torch.special.xlogy(u, u) - torch.special.xlogy(1.0 + u, 1.0 + u)

    def dphi(self, u):
        return torch.log(u) - torch.log1p(u)

    def phi_log(self, lu):
        # u log(u/(1+u)) − log(1+u) = u·logσ(l) − softplus(l).
        u = lu.exp()
        return _zero_where(u == 0, u * F.logsigmoid(lu)) - F.softplus(lu)

    def dphi_log(self, lu):
        return F.logsigmoid(lu)

    def conj_log(self, lu):
        return F.softplus(lu)

    def divergence(self, u, v):
        return self.divergence_log(torch.log(u), torch.log(v))

    def divergence_log(self, lu, lv):
        u = lu.exp()
        return (
            _zero_where(u == 0, u * (F.logsigmoid(lu) - F.logsigmoid(lv))) - F.softplus(lu) + F.softplus(lv)
        )


BREGMAN = Parts(
    "Bregman generator",
    {g.name: g for g in (GKL(), Squared(), ItakuraSaito(), Logistic())},
    passes=lambda g: isinstance(g, BregmanGenerator),
)
BREGMAN["kl"] = BREGMAN["gkl"]
BREGMAN["lsif"] = BREGMAN["squared"]
BREGMAN["bce"] = BREGMAN["logistic"]
BREGMAN["itakura_saito"] = BREGMAN["is"]


def get_bregman(name: str | BregmanGenerator) -> BregmanGenerator:
    """Look up a Bregman generator by name (one of `BREGMAN`) or pass one through."""
    return BREGMAN.lookup(name)


# ---------------------------------------------------------------------------------------------------
# Divergences between distributions (last axis), from log-probabilities
# ---------------------------------------------------------------------------------------------------


def kl(log_q: Tensor, log_m: Tensor) -> Tensor:
    """KL(q ‖ m) = Σ_y q_y log(q_y / m_y), f(u) = u log u (MATH.md §3.5); terms with q_y = 0 are 0."""
    q = log_q.exp()
    return _zero_where(q == 0, q * (log_q - log_m)).sum(-1)


def reverse_kl(log_q: Tensor, log_m: Tensor) -> Tensor:
    """KL(m ‖ q) = Σ_y m_y log(m_y / q_y), f(u) = −log u (MATH.md §3.5); needs m ≪ q to be finite."""
    return kl(log_m, log_q)


def _is_terms(lu: Tensor, lv: Tensor) -> Tensor:
    """Elementwise u/v − log(u/v) − 1 from logs: 0 where u = v = 0, +inf where exactly one of them is 0."""
    both_zero = (lu == -torch.inf) & (lv == -torch.inf)
    d = torch.where(both_zero, torch.zeros_like(lu), lu - lv)
    # expm1(d) − d is accurate near d = 0; for d = +inf it would be inf − inf.
    out = torch.where(d == torch.inf, d, torch.expm1(d) - d)
    return out


def itakura_saito(log_q: Tensor, log_m: Tensor) -> Tensor:
    """D_IS(q ‖ m) = Σ_y [q_y/m_y − log(q_y/m_y) − 1] (MATH.md §0); +inf where q_y = 0 < m_y."""
    return _is_terms(log_q, log_m).sum(-1)


def squared(log_q: Tensor, log_m: Tensor) -> Tensor:
    """Pearson / LSIF: Σ_y m_y f(q_y/m_y), f(u) = (u − 1)²/2, i.e. ½ Σ_y (q_y − m_y)² / m_y (MATH.md §3.5)."""
    q, m = log_q.exp(), log_m.exp()
    # Linear space on purpose: m·expm1(log q − log m)² overflows long before (q − m)²/m does.
    return _zero_where((q == 0) & (m == 0), 0.5 * (q - m) ** 2 / m).sum(-1)


def logistic(log_q: Tensor, log_m: Tensor) -> Tensor:
    """Logistic / BCE: f(u) = u log u − (1 + u) log((1 + u)/2), i.e. 2·JS(q, m) = KL(q ‖ a) + KL(m ‖ a),
    a = (q + m)/2 (MATH.md §3.5); always finite."""
    log_a = torch.logaddexp(log_q, log_m) - _LOG2
    return kl(log_q, log_a) + kl(log_m, log_a)


F_DIVERGENCES = Parts(
    "divergence",
    {"kl": kl, "reverse_kl": reverse_kl, "is": itakura_saito, "squared": squared, "logistic": logistic},
    passes=callable,
)
F_DIVERGENCES["rkl"] = reverse_kl
F_DIVERGENCES["lsif"] = squared
F_DIVERGENCES["pearson"] = squared
F_DIVERGENCES["bce"] = logistic
F_DIVERGENCES["js"] = logistic
F_DIVERGENCES["itakura_saito"] = itakura_saito


def get_f_divergence(name: str | Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    """Look up a divergence between distributions by name (one of `F_DIVERGENCES`) or pass a callable through."""
    return F_DIVERGENCES.lookup(name)
