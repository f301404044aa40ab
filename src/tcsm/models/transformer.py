"""The bidirectional denoiser m_θ(· | x_t): a SEDD/MDLM-style diffusion transformer (MATH.md §0, §1.2).

`Denoiser(cfg).forward(xt, t)` maps noisy tokens x_t ∈ {0..num_states−1}^L (num_states = V+1 with the mask id V
for the masked source, V for the uniform source) and times t ∈ [0, 1] (t = 1 clean) to logits over the V clean
tokens at every position. Architecture: token embedding → rotary positions → n_layers pre-norm blocks with
bidirectional attention → final norm → linear head. With `time_conditioning=True` a sinusoidal embedding of t
drives adaLN-Zero modulation of every block and of the final norm; with `time_conditioning=False` there is no
time pathway at all (the masked posterior does not depend on t given the mask pattern, MATH.md §1.3), and t is
ignored exactly. The head is zero-initialised, so every model starts at uniform logits (loss = log V).

`JointStepDenoiser` is the denoiser with a step head (`models.step_head`; MATH.md §10, the joint few-step student).

Helpers: `PRESETS` (architecture sizes "tiny", "small", "text8"), `build_denoiser(preset_or_cfg, **overrides)`,
`count_parameters(model)` and `flops_per_token(cfg, seq_len)` for MFU accounting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from tcsm.models.config import TrunkConfig
from tcsm.models.kinds import DENOISER, JOINT_STEP_DENOISER
from tcsm.models.layers import (
    ACTIVATIONS,
    KERNELS,
    build_trunk,
    init_weights,
    row_stable,
    run_trunk,
    zero_init_,
)
from tcsm.models.step_head import JointStep, StepHead

__all__ = ["PRESETS", "Denoiser", "DenoiserConfig", "JointStepDenoiser", "at_positions", "build_denoiser", "count_parameters", "denoiser_fields", "flops_per_token"]


@dataclass
class DenoiserConfig(TrunkConfig):
    """Architecture of a `Denoiser`: the trunk (`TrunkConfig`) and its kernels."""

    check_inputs: bool = True  # range-check token ids (an async device assertion on GPUs and under compile)
    # attention kernel: auto (fastest measured per device/dtype) | sdpa | math; a block model's also flex
    attention: str = "auto"
    # MLP nonlinearity: exact GELU, 5× cheaper than the tanh form on a CPU in bf16; "gelu_tanh" is what checkpoints
    # saved before this field used (tcsm.storage.checkpoint.read_state fills it in for them)
    activation: str = "gelu"
    # layers of a step head (MATH.md §10, the joint few-step student: `models.step_head`); 0: none
    step_head_layers: int = 0
    # train the step head alone: the denoiser's own weights stay at their warm start (frozen)
    step_head_only: bool = False

    label: ClassVar[str] = "DenoiserConfig"
    #: the values `attention` takes (a block model's add "flex")
    attentions: ClassVar[tuple[str, ...]] = KERNELS

    def __post_init__(self) -> None:
        self.check_trunk()
        if self.attention not in self.attentions:
            hint = " (flex: block models only, path.block_length)" if self.attention == "flex" else ""
            raise ValueError(f"attention must be one of {list(self.attentions)}, got {self.attention!r}{hint}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {list(ACTIVATIONS)}, got {self.activation!r}")
        if int(self.step_head_layers) < 0:
            raise ValueError(f"step_head_layers must be >= 0, got {self.step_head_layers}")
        if self.step_head_only and not int(self.step_head_layers):
            raise ValueError("step_head_only trains the step head alone: set step_head_layers >= 1")


# Architecture sizes only: vocab_size / num_states come from the data and the path.
PRESETS: dict[str, dict[str, Any]] = {
    # unit tests: a forward+backward pass in milliseconds
    "tiny": {"max_len": 128, "d_model": 64, "n_layers": 2, "n_heads": 4, "cond_dim": 32},
    # CPU benchmarks and the quickstart: ~3M parameters
    "small": {"max_len": 256, "d_model": 256, "n_layers": 4, "n_heads": 4, "cond_dim": 128},
    # the paper's text8 model (SEDD/MDLM "small" backbone: 12 × 768, 12 heads, length 256)
    "text8": {"max_len": 256, "d_model": 768, "n_layers": 12, "n_heads": 12, "cond_dim": 128},
}


class Denoiser(nn.Module):
    """x_t [B, L] (ids < num_states), t [B] in [0, 1] → logits [B, L, V] over clean tokens (float32)."""

    model_kind = DENOISER

    def __init__(self, cfg: DenoiserConfig):
        super().__init__()
        self.cfg = cfg
        self.vocab_size, self.num_states = cfg.vocab_size, cfg.num_states
        build_trunk(self, cfg)
        # Zero head: initial logits are exactly 0, i.e. uniform over V, so the first loss is log V for every
        # objective and no early step is spent undoing a random prior.
        self.head = zero_init_(nn.Linear(cfg.d_model, cfg.vocab_size, bias=True))
        self.apply(init_weights)

    def _check(self, xt: Tensor, t: Tensor | None) -> None:
        if xt.dim() != 2:
            raise ValueError(f"xt must be a [batch, length] tensor of token ids, got shape {tuple(xt.shape)}")
        if xt.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.bool):
            raise ValueError(f"xt must hold integer token ids, got dtype {xt.dtype}")
        if xt.shape[1] > self.cfg.max_len:
            raise ValueError(
                f"sequence length {xt.shape[1]} exceeds the model's max_len={self.cfg.max_len}; "
                "build the model with a larger max_len or use shorter sequences"
            )
        if self.cfg.check_inputs and xt.numel():
            self._check_range(xt)
        if self.time_embed is not None:
            if t is None:
                raise ValueError("this denoiser is time-conditioned: pass t of shape [batch]")
            if t.dim() > 1 or (t.dim() == 1 and t.shape[0] not in (1, xt.shape[0])):
                raise ValueError(
                    f"t must have shape [batch]={xt.shape[0]} or be a scalar, got {tuple(t.shape)}"
                )

    def _check_range(self, xt: Tensor) -> None:
        """Token ids in [0, num_states). Reading the range back is free on CPU but a host sync on a GPU and a
        graph break under torch.compile, so there the check is an asynchronous device assertion."""
        if xt.device.type == "cpu" and not torch.compiler.is_compiling():
            lo, hi = int(xt.min()), int(xt.max())
            if lo < 0 or hi >= self.num_states:
                raise ValueError(
                    f"token ids must lie in [0, {self.num_states}) (num_states), got range [{lo}, {hi}]; "
                    "check the path's num_states (V+1 for masked, V for uniform) against the data vocabulary"
                )
        else:
            ok = (xt >= 0).all() & (xt < self.num_states).all()
            torch._assert_async(ok, f"token ids must lie in [0, {self.num_states}) (num_states)")

    def features(self, xt: Tensor, t: Tensor | None = None) -> Tensor:
        """The final hidden states [B, L, d_model] the logits are a linear function of (a step head reads them)."""
        self._check(xt, t)
        x = self.embed(xt)
        # Rotary tables in the dtype the attention projections produce (bf16 under autocast): cast once here.
        rope = self.rotary(xt.shape[1], dtype=_compute_dtype(xt.device))
        return run_trunk(self, x, rope, t)

    def forward(self, xt: Tensor, t: Tensor | None = None, *, at: Tensor | None = None) -> Tensor:
        # float32 logits: losses take log-softmax over V, which bf16 would quantise badly.
        return at_positions(self.features(xt, t), at, self.head).float()


class JointStepDenoiser(Denoiser):
    """The `Denoiser` with a step head (`cfg.step_head_layers` layers): `model(x_t, t)` are the denoiser's own
    factorised logits, `model(x_t, t, reveal=R, tokens=y)` add the head's correction at R given the tokens drawn
    before each position in the step (training, teacher-forced), `open_step(x_t, t, R)` one denoiser call and the
    incremental head of a sampler step. Its weights are the denoiser's plus `step_head.*` (a warm start from the
    teacher's denoiser keeps the new head at its initialisation: `JOINT_STEP_DENOISER.fresh`)."""

    model_kind = JOINT_STEP_DENOISER

    def __init__(self, cfg):
        super().__init__(cfg)
        attach_step_head(self, cfg)

    def forward(self, xt: Tensor, t: Tensor | None = None, *, reveal: Tensor | None = None,
                tokens: Tensor | None = None, at: Tensor | None = None) -> Tensor:  # fmt: skip
        h = self.features(xt, t)
        if reveal is None:
            return at_positions(h, at, self.head).float()
        if tokens is None:
            raise ValueError("a step head reads the tokens drawn at the revealed positions: pass tokens")
        logits = self.head(h).float()
        logits = logits + self.step_head.correction(h, reveal & (xt == self.cfg.vocab_size), tokens, self.embed, self.head.weight).float()
        return at_positions(logits, at)

    def open_step(self, xt: Tensor, t: Tensor | None, reveal: Tensor) -> JointStep:
        h = self.features(xt, t)
        return JointStep(self.step_head, h, reveal, project=self.head, embed=self.embed, unembed=self.head.weight)


def at_positions(h: Tensor, at: Tensor | None, fn=None) -> Tensor:
    """h [B, L, ...] at the positions `at` [B, L] (boolean): [N, ...] in row-major order (None: all of h); with `fn`
    (the output layer), fn of them, row-stable (`layers.row_stable`): a position's logits have the bits of the full
    call's, however few positions are asked for."""
    if at is None:
        return h if fn is None else fn(h)
    if at.shape != h.shape[:2] or at.dtype != torch.bool:
        raise ValueError(f"at must be a boolean [batch, length]={list(h.shape[:2])} mask, got {at.dtype} "
                         f"{list(at.shape)}")  # fmt: skip
    return h[at] if fn is None else row_stable(fn, h[at])


def attach_step_head(model: nn.Module, cfg: DenoiserConfig) -> None:
    """Give `model` its `step_head` (`cfg.step_head_layers` layers); with `cfg.step_head_only` only the head
    requires a gradient (the optimizer takes only what does)."""
    model.step_head = StepHead(cfg.vocab_size, cfg.d_model, cfg.n_heads, cfg.step_head_layers, cfg.max_len,
                               mlp_ratio=cfg.mlp_ratio, norm=cfg.norm, activation=cfg.activation,
                               rope_base=cfg.rope_base)  # fmt: skip
    if cfg.step_head_only:
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith("step_head."))


def _compute_dtype(device: torch.device) -> torch.dtype:
    """The dtype linear layers produce on `device` right now: the autocast dtype when autocast is on."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return torch.float32


def build_denoiser(preset_or_cfg: str | DenoiserConfig | dict[str, Any], **overrides: Any) -> Denoiser:
    """Build a `Denoiser` from a preset name, a config dict or a `DenoiserConfig`, with keyword overrides (with
    `step_head_layers` > 0 the `models.step_head.JointStepDenoiser`, a denoiser with a step head).

    Presets hold sizes only, so pass at least vocab_size and num_states:
    `build_denoiser("tiny", vocab_size=27, num_states=28)`.
    """
    cfg = DenoiserConfig.from_dict(denoiser_fields(preset_or_cfg, **overrides))
    return JointStepDenoiser(cfg) if cfg.step_head_layers else Denoiser(cfg)


def denoiser_fields(preset_or_cfg: str | DenoiserConfig | dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """The config fields `build_denoiser` builds from (a preset's sizes, a dict or a config, with the overrides)."""
    if isinstance(preset_or_cfg, DenoiserConfig):
        fields = preset_or_cfg.to_dict()
    elif isinstance(preset_or_cfg, str):
        if preset_or_cfg not in PRESETS:
            raise ValueError(f"unknown model preset {preset_or_cfg!r}; choose one of {sorted(PRESETS)}")
        fields = dict(PRESETS[preset_or_cfg])
    elif isinstance(preset_or_cfg, dict):
        fields = dict(preset_or_cfg)
        preset = fields.pop("preset", None)
        if preset is not None:
            if preset not in PRESETS:
                raise ValueError(f"unknown model preset {preset!r}; choose one of {sorted(PRESETS)}")
            fields = {**PRESETS[preset], **fields}
    else:
        raise TypeError(f"expected a preset name, dict or DenoiserConfig, got {type(preset_or_cfg).__name__}")
    fields.update(overrides)
    missing = [k for k in ("vocab_size", "num_states") if fields.get(k) is None]
    if missing:
        raise ValueError(f"model config is missing {missing}: they come from the data (V) and the path")
    return fields


def count_parameters(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of (trainable) parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def flops_per_token(cfg: DenoiserConfig, seq_len: int) -> float:
    """Training (forward + backward) model FLOPs per token: 6·N_matmul + 12·n_layers·d_model·seq_len.

    N_matmul counts the weights multiplied once per token (attention and MLP projections, head); the
    embedding lookup and the per-sequence time/adaLN pathway are excluded (PaLM appendix B accounting).
    The attention term is 2·2·L·d per layer forward (scores and weighted sum) ×3 for backward; attention is
    bidirectional, so no causal halving.
    """
    d, n = cfg.d_model, cfg.n_layers
    hidden = round(cfg.mlp_ratio * d)
    per_layer = 4 * d * d + 2 * d * hidden
    n_matmul = n * per_layer + d * cfg.vocab_size
    return 6.0 * n_matmul + 12.0 * n * d * seq_len
