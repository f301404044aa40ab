"""Probability paths p_{t|1}(x_t | x_1) = Π_i k_t(x_t^i | x_1^i) for the masked and uniform sources.

Time runs from t = 0 (source) to t = 1 (clean data). The clean vocabulary is {0, …, V−1}; the masked
source adds one input-only symbol, the mask, with index V (MATH.md §0, §1). Denoisers output logits over the
V clean tokens only. Everything that depends on the source lives here, so that the likelihood estimator
and the samplers are generic: the kernel and its draws, the bridge, which positions are still free, the
prior term, and the per-(t, x_t) integrands of the path's likelihood bounds (MATH.md §2). Nothing in this
module holds learnable state.

This module holds the base class and the numeric helpers both sources share.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tcsm.paths.schedules import LinearSchedule, Schedule
from tcsm.storage.migration import renamed_method


def _col(v: Tensor, like: Tensor) -> Tensor:
    """Reshape a per-sequence value [B] so that it broadcasts against [B, L, ...]."""
    return v.reshape(v.shape + (1,) * (like.dim() - v.dim()))


def _uniform01(shape, device, generator) -> Tensor:
    return torch.rand(shape, device=device, generator=generator)


class ProbabilityPath:
    """Common interface of the sources. `t` is a per-sequence tensor of shape [B], or on a block path (`block_length`
    set) a per-position tensor [B, L], constant inside each block; every kernel method broadcasts either.

    A new source implements the methods that raise NotImplementedError and sets the class attributes below;
    the defaults of the boolean attributes are the conservative (always correct, possibly slower) choice.
    docs/DESIGN.md "Adding a noise source" lists the interface.
    """

    kind: str  # a label for printing and configs only; code never branches on it
    vocab_size: int
    num_states: int  # size of the noisy (input) alphabet
    mask_id: int | None  # index of the mask in the noisy alphabet, if the source has one

    #: Names of the likelihood bounds this source admits (MATH.md §2); the first is the default.
    bounds: tuple[str, ...] = ()
    #: Whether p_{1|t}(·|x_t) depends on t. If not (masked, §1.3), a denoiser that ignores t can be exact and a
    #: sampler may reuse its output while x_t does not change (§6.2 cache; `tcsm.sampling.may_cache`).
    posterior_depends_on_t: bool = True
    #: Whether a free token can only jump straight to its clean value and then stays (absorbing source): the
    #: bridge from a free position is then λ δ_{x̂} + (1 − λ) δ_{x_t}, which samplers run in sparse form (§6.2).
    absorbing: bool = False
    #: Whether every bound's integrand G(t, x_t) vanishes at x_t = x_1, so that the likelihood estimator
    #: need never draw the uncorrupted x_t (§2.4).
    integrand_zero_at_x1: bool = False
    #: Whether k_t(x_t^i | y) is the same for every clean y at a free position (masked: the mask comes from any
    #: token alike). Kernel-tilted estimators (`objectives.score_loss`, tilt) are then the untilted ones.
    kernel_flat_on_free: bool = False

    #: Positions per block of a block path (MATH.md §9): block b is noised at its own time given the clean blocks
    #: before it, and the bound is the sum of the blocks' bounds. None: one block, the whole sequence.
    block_length: int | None = None

    def __init__(self, vocab_size: int, schedule: Schedule | None = None, block_length: int | None = None):
        if int(vocab_size) < 2:
            raise ValueError(f"vocab_size must be >= 2, got {vocab_size}")
        self.vocab_size = int(vocab_size)
        self.schedule = schedule if schedule is not None else LinearSchedule()
        if block_length is not None:
            if isinstance(block_length, bool) or int(block_length) != block_length or int(block_length) < 1:
                raise ValueError(f"block_length must be a positive integer or null, got {block_length!r}")
            self.block_length = int(block_length)

    # --- blocks -------------------------------------------------------------------------------------
    def block_size(self, length: int) -> int:
        """Positions per block for sequences of `length`: `block_length`, or `length` on a full-sequence path.
        ValueError (one line) when `length` is not a multiple of `block_length`."""
        if self.block_length is None:
            return int(length)
        if int(length) % self.block_length:
            raise ValueError(
                f"sequence length {length} is not a multiple of path.block_length={self.block_length}; "
                "choose a block length that divides the data's sequence length"
            )
        return self.block_length

    def num_blocks(self, length: int) -> int:
        """L / block_length (1 on a full-sequence path)."""
        return int(length) // max(1, self.block_size(length)) if length else 1

    def position_times(self, t_blocks: Tensor, length: int) -> Tensor:
        """Per-block times [B, nb] → per-position times [B, L] (block b's time at each of its positions)."""
        return t_blocks.repeat_interleave(self.block_size(length), dim=-1)

    def draw_times(self, draw, batch_size: int, length: int) -> Tensor:
        """The objective's times: `draw(n)` → n times in [0, 1); per sequence [B] on a full-sequence path, per
        position [B, L] on a block path, each block at its own draw of `draw(B · num_blocks)` laid out sequence by
        sequence (MATH.md §9). The blocks' times are independent only when `draw` draws i.i.d. times; with the
        stratified or antithetic draws (the default) the blocks of one sequence take neighbouring cells of one grid,
        so their times are correlated. The other layouts measured (block-index-major, i.i.d. per block, a grid per
        block index) gave no measurably lower gradient variance (docs/benchmarks.md, "block-time layouts")."""
        if self.block_length is None:
            return draw(batch_size)
        nb = self.num_blocks(length)
        return self.position_times(draw(batch_size * nb).view(batch_size, nb), length)

    # --- schedule shortcuts -------------------------------------------------------------------------
    def alpha(self, t: Tensor) -> Tensor:
        return self.schedule.alpha(t)

    def kappa(self, t: Tensor) -> Tensor:
        """κ_t = α̇_t / (1 − α_t) (MATH.md §0)."""
        return self.schedule.kappa(t)

    # --- interface ----------------------------------------------------------------------------------
    def draw_xt(self, x1: Tensor, t: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Draw x_t ~ p_{t|1}(· | x_1) independently per token (MATH.md §1.1)."""
        return self.noise(x1, torch.ones_like(t), t, generator)

    def prior_sample(self, batch_size: int, length: int, device=None, generator=None) -> Tensor:
        """Draw x_0 ~ p_0."""
        raise NotImplementedError

    def noise(self, xs: Tensor, s: Tensor, t: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Noising chain: draw x_t ~ p(x_t | x_s) for t ≤ s (x_s is the cleaner state; MATH.md §1.1)."""
        raise NotImplementedError

    def log_kernel(self, xt: Tensor, t: Tensor) -> Tensor:
        """log k_t(x_t^i | y) for every clean y: FloatTensor[B, L, V] (MATH.md §1.1)."""
        raise NotImplementedError

    def free(self, xt: Tensor) -> Tensor:
        """Positions whose clean token is not yet determined by x_t^i, i.e. p_{1|t}(x_1^i = x_t^i | x_t) < 1
        in general: the ones a sampler may still change (masked: x_t^i = M; uniform: all; MATH.md §1.3)."""
        raise NotImplementedError

    def loss_mask(self, xt: Tensor) -> Tensor:
        """Positions whose N^1 target is not a point mass: exactly the `free` ones (MATH.md §1.3)."""
        return self.free(xt)

    def corrupt_prob(self, t: Tensor) -> Tensor:
        """e_t = P(x_t^i ≠ x_1^i) = 1 − k_t(x_1 | x_1) per token, [B] (MATH.md §1.1)."""
        raise NotImplementedError

    def corrupt(self, x1: Tensor, t: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Draw x_t ~ k_t(· | x_1, x_t ≠ x_1) for every token of x1 [B, L] (MATH.md §1.1)."""
        raise NotImplementedError

    def jump_prob(self, t: Tensor, s: Tensor) -> Tensor:
        """λ_{t→s} = (α_s − α_t)/(1 − α_t), s > t: probability that a free token resolves by s, the exact
        1 − exp(−∫_t^s κ) of a mixture path (MATH.md §0, §6.1)."""
        onem = self.schedule.one_minus_alpha(t)
        lam = (self.alpha(s) - self.alpha(t)) / onem.clamp_min(torch.finfo(onem.dtype).tiny)
        return lam.clamp(0.0, 1.0)

    def prior_kl(self, x1: Tensor, dtype: torch.dtype = torch.float64) -> Tensor:
        """KL(p_{0|1}(·|x_1) ‖ p_0) per sequence [B]: zero when α_0 = 0 (MATH.md §2.1); ValueError if infinite."""
        raise NotImplementedError

    def bound_integrand(self, bound: str, logits: Tensor, x1: Tensor, xt: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
        """(w(t), G(t, x_t)), each [B] in t's dtype, of bound `bound` ∈ `bounds`: the bound is
        ∫_0^1 w(t) E_{x_t ~ p_{t|1}}[G] dt (MATH.md §2.1). `logits` [B, L, V] are the denoiser's at (x_t, t)."""
        raise NotImplementedError

    def _alpha0(self, dtype: torch.dtype, device) -> float:
        return float(self.schedule.alpha(torch.zeros(1, dtype=dtype, device=device))[0])

    def bridge(self, xt: Tensor, t: Tensor, s: Tensor, probs: Tensor) -> Tensor:
        """p(x_s^i = y | x_t) = Σ_a m^i(a) B(y | x_t^i, a), s ≥ t, for clean-token probabilities m^i = `probs`
        [B, L, V]; returns probabilities over the noisy alphabet [B, L, num_states] (MATH.md §6.2)."""
        raise NotImplementedError

    def target_conditional(self, log_p1_cond: Tensor, xt: Tensor, t: Tensor) -> Tensor:
        """log q^i(y) = log softmax_y[log p_1(y | x_1^{≠i}) + log k_t(x_t^i | y)] (MATH.md §1.3, §4).

        `log_p1_cond` [B, L, V] holds p_1's single-site conditionals (an LM's); the result is the N^1
        posterior target. For the masked source it is p_1(· | x_1^{≠i}) at masked positions and δ_{x_t^i}
        elsewhere.
        """
        return torch.log_softmax(log_p1_cond + self.log_kernel(xt, t).to(log_p1_cond.dtype), dim=-1)

    def __repr__(self) -> str:
        blocks = "" if self.block_length is None else f", block_length={self.block_length}"
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, schedule={self.schedule!r}{blocks})"


def _log_m(logits: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(logits, logsumexp) in at least `dtype` (bf16/fp16 model outputs are upcast first)."""
    logits = logits.to(torch.promote_types(logits.dtype, dtype))
    return logits, torch.logsumexp(logits, dim=-1)


def _log_mass_except(logits: Tensor, lse: Tensor, idx: Tensor) -> Tensor:
    """log Σ_{y≠idx} m(y), computed without the cancellation of log(1 − m(idx))."""
    excl = logits.scatter(-1, idx.unsqueeze(-1), -torch.inf)
    return torch.logsumexp(excl, dim=-1) - lse


renamed_method(ProbabilityPath, "sample", "draw_xt")  # `sample` named four other things: samplers, draws of p_1, ...
