"""The masked (absorbing) source: mask index V, carry-over denoising, the masked NELBO integrand (MATH.md §1.1, §2.2).
"""

from __future__ import annotations

import torch
from torch import Tensor

from tcsm.paths.base import ProbabilityPath, _col, _log_m, _uniform01
from tcsm.paths.schedules import Schedule


class MaskedPath(ProbabilityPath):
    """Absorbing source: k_t(x_t | x_1) = α_t 1[x_t = x_1] + (1 − α_t) 1[x_t = M], mask id = V."""

    kind = "masked"
    bounds = ("masked",)
    posterior_depends_on_t = False
    absorbing = True
    integrand_zero_at_x1 = True  # nothing masked: the carry-over model CTMC has nothing to pay
    kernel_flat_on_free = True

    def __init__(self, vocab_size: int, schedule: Schedule | None = None, block_length: int | None = None):
        super().__init__(vocab_size, schedule, block_length)
        self.mask_id = self.vocab_size
        self.num_states = self.vocab_size + 1

    def prior_sample(self, batch_size, length, device=None, generator=None):
        return torch.full((batch_size, length), self.mask_id, dtype=torch.long, device=device)

    def noise(self, xs, s, t, generator=None):
        # An unmasked token at s survives to t with probability α_t / α_s.
        a_s, a_t = self.alpha(s), self.alpha(t)
        keep_p = torch.where(a_s > 0, a_t / a_s.clamp_min(torch.finfo(a_s.dtype).tiny), torch.zeros_like(a_s))
        keep = _uniform01(xs.shape, xs.device, generator) < _col(keep_p, xs)
        return torch.where(keep, xs, torch.full_like(xs, self.mask_id))

    def log_kernel(self, xt, t):
        a = _col(self.alpha(t), xt).unsqueeze(-1)
        onem = _col(self.schedule.one_minus_alpha(t), xt).unsqueeze(-1)
        V = self.vocab_size
        ys = torch.arange(V, device=xt.device)
        is_mask = (xt == self.mask_id).unsqueeze(-1)
        hit = xt.unsqueeze(-1) == ys
        out = torch.where(hit, torch.log(a).expand(hit.shape), torch.full(hit.shape, -torch.inf, device=xt.device))
        return torch.where(is_mask, torch.log(onem).expand(hit.shape), out)

    def free(self, xt):
        return xt == self.mask_id

    def corrupt_prob(self, t):
        return self.schedule.one_minus_alpha(t).clamp(0.0, 1.0)

    def corrupt(self, x1, t, generator=None):
        return torch.full_like(x1, self.mask_id)

    def reveal_prob(self, t: Tensor, s: Tensor) -> Tensor:
        """λ_{t→s} = (α_s − α_t) / (1 − α_t): probability that a masked token at t is revealed by s."""
        return self.jump_prob(t, s)

    def prior_kl(self, x1, dtype=torch.float64):
        a0 = self._alpha0(dtype, x1.device)
        if a0 > 0.0:
            raise ValueError(
                f"schedule {self.schedule!r} starts at α_0 = {a0:.3g} > 0: for the masked source the prior term "
                "KL(p_0|1 ‖ δ_mask) is infinite, so no valid bound exists (MATH.md §2.1, §8.21); use α_0 = 0 "
                "(e.g. LogLinearSchedule(eps=0))"
            )
        return torch.zeros(x1.shape[0], dtype=dtype, device=x1.device)

    def bound_integrand(self, bound, logits, x1, xt, t):
        """"masked" (§2.2): w = κ_t, G = Σ_{i: x_t^i = M} −log m^i(x_1^i | x_t); unmasked positions are copied
        by the carry-over model CTMC and contribute nothing."""
        if bound != "masked":
            raise ValueError(f"the masked source has no bound {bound!r}")
        wd = t.dtype
        lg, lse = _log_m(logits, torch.float32)
        nll = lse - lg.gather(-1, x1.unsqueeze(-1)).squeeze(-1)
        g = torch.where(xt == self.mask_id, nll.to(wd), torch.zeros((), dtype=wd, device=xt.device))
        return self.kappa(t), g.sum(-1)

    def bridge(self, xt, t, s, probs):
        lam = _col(self.jump_prob(t, s), xt).unsqueeze(-1).to(probs.dtype)
        out = torch.cat([lam * probs, (1.0 - lam).expand(probs.shape[:-1] + (1,))], dim=-1)
        carried = torch.nn.functional.one_hot(xt, self.num_states).to(probs.dtype)
        return torch.where((xt == self.mask_id).unsqueeze(-1), out, carried)

