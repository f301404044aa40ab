"""How the trained model is spread over processes (`train.strategy`) and what that changes for the trainer.

* **ddp** — every rank holds the whole model; `DistributedDataParallel` averages gradients.
* **fsdp** — FSDP2 (`torch.distributed.fsdp.fully_shard`): each transformer block that trains is one shard unit and
  the root module another, so a rank holds 1/W of the parameters, gradients and optimizer moments and gathers a
  block's weights only while that block runs. With `train.precision=bf16` the gathered weights are bf16 and the
  gradient reduce-scatter stays fp32 (`MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`); the fp32
  master weights and the optimizer never leave fp32. `train.cpu_offload` keeps the shards and the optimizer step
  on the host (GPU runs only). Frozen parameters (a reference or teacher inside the model, e.g. the energy
  model's p^ref) are left out of the shards and stay replicated, so code may call those submodules directly.
  A model whose other methods run the network (a causal LM's `kv_cache` / `extend`) names them in
  `forward_methods`, so they gather the weights as `forward` does.
  Checkpoints are sharded (`torch.distributed.checkpoint`, see `tcsm.train.sharded`).

`train.activation_checkpointing` recomputes each transformer block's activations in the backward pass
(`torch.utils.checkpoint`, non-reentrant) under either strategy, and in a single process.

The trainer only calls `Parallel`: `prepare` (wrap the model and its EMA copy), `accumulate` (no gradient sync on
all but the last micro-batch), `grad_norm` (a plain tensor) and the flags `sharded` / `collective_forward`.
"""

from __future__ import annotations

import contextlib
import functools
import types
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from tcsm.core.errors import ConfigError
from tcsm.train.distributed import DistEnv

__all__ = ["STRATEGIES", "Parallel", "checkpoint_blocks", "transformer_blocks"]

STRATEGIES = ("ddp", "fsdp")


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated blocks of `model`: tcsm's `TransformerBlock`s and, inside a Hugging Face model, the layer classes
    it names in `_no_split_modules` (the units HF's own FSDP wrapping uses)."""
    from tcsm.models.layers import TransformerBlock

    names = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or ())
    return [m for m in model.modules() if isinstance(m, TransformerBlock) or type(m).__name__ in names]


def _checkpointed_forward(self, *args, **kwargs):
    from torch.utils.checkpoint import checkpoint

    forward = type(self).forward
    if not torch.is_grad_enabled():  # evaluation and sampling: nothing to save, nothing to recompute
        return forward(self, *args, **kwargs)
    return checkpoint(forward, self, *args, use_reentrant=False, **kwargs)


def checkpoint_blocks(model: nn.Module) -> int:
    """Recompute every transformer block's activations in the backward pass instead of keeping them; returns the
    number of blocks. The block's `forward` is wrapped in place, so parameter names (and checkpoints) do not change
    and hooks on the module (FSDP's gather) still run first. Dropout masks are replayed (RNG state is preserved)."""
    blocks = transformer_blocks(model)
    for block in blocks:
        if not getattr(block, "_tcsm_checkpointed", False):
            # A bound method (not a closure over this block): a deep copy of the model (an EMA or previous-
            # iterate copy) then checkpoints its own blocks.
            block.forward = types.MethodType(_checkpointed_forward, block)
            block._tcsm_checkpointed = True
    return len(blocks)


@functools.cache
def _ddp_class():
    from torch.nn.parallel import DistributedDataParallel

    class DDP(DistributedDataParallel):
        """DDP that answers for the model's own attributes (an objective asks the model for its mask_id, ...)."""

        def __getattr__(self, name):
            try:
                return super().__getattr__(name)
            except AttributeError:
                return getattr(self.module, name)

    return DDP


@dataclass
class Parallel:
    """The `train.strategy` of a run on `env`; `precision` is the resolved training precision."""

    strategy: str
    env: DistEnv
    precision: str = "fp32"
    activation_checkpointing: bool = False
    cpu_offload: bool = False

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"train.strategy must be one of {list(STRATEGIES)}, got {self.strategy!r}")
        if self.cpu_offload and self.strategy != "fsdp":
            raise ConfigError("train.cpu_offload needs train.strategy=fsdp")
        if self.cpu_offload and self.env.device.type != "cuda":
            raise ConfigError(
                "train.cpu_offload moves an accelerator's parameter shards to the host; this run's device is "
                f"{self.env.device.type}, where they already are (set train.cpu_offload=false)"
            )

    @classmethod
    def of(cls, t, env: DistEnv, precision: str) -> Parallel:
        """From the `train` config section."""
        return cls(str(t.strategy), env, precision, bool(t.activation_checkpointing), bool(t.cpu_offload))

    @property
    def sharded(self) -> bool:
        """Checkpoints are written with torch.distributed.checkpoint (a shard per rank) instead of by rank 0 alone.
        True for fsdp at any process count, so a run keeps one checkpoint format when resumed on another count."""
        return self.strategy == "fsdp"

    @property
    def fsdp(self) -> bool:
        """Parameters are actually sharded (fsdp on more than one process)."""
        return self.strategy == "fsdp" and self.env.distributed

    @property
    def collective_forward(self) -> bool:
        """A forward pass needs every rank (sharded weights are gathered): evaluation and sampling run on all ranks
        (with the same data and seeds, so they agree) and rank 0 alone reports."""
        return self.fsdp

    def prepare(self, model: nn.Module, ema_model: nn.Module | None = None) -> nn.Module:
        """Wrap `model` (and shard its EMA copy alike) in place; returns the module the objective calls. Call it
        after the EMA copy is made and before the optimizer is built (FSDP replaces the parameters)."""
        if self.activation_checkpointing:
            checkpoint_blocks(model)
        if self.fsdp:
            # Units and replicated (frozen) parameters are chosen by name on the model, so that its EMA copy (all
            # of whose parameters are frozen) is sharded the same way and the EMA update stays shard-local.
            frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
            # Models return logits that are views (Linear over [B, L, D]). FSDP warns on every forward that an
            # in-place op on such a view would skip the pre-backward gather; the root is the one returning them and
            # the root keeps its weights gathered until backward ends, and the gradients equal DDP's
            # (tests/test_fsdp.py), so the warning only floods the log.
            warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor")
            self._shard(model, frozen, self._mp_policy())
            if ema_model is not None:  # fp32, never trained
                self._shard(ema_model, frozen, None)
            return model
        if self.env.distributed:
            ids = [self.env.device.index] if self.env.device.type == "cuda" else None
            return _ddp_class()(model, device_ids=ids)
        return model

    def _mp_policy(self):
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if self.precision == "bf16":
            return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        return None

    def _shard(self, model: nn.Module, frozen: set[str], mp_policy) -> None:
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard, register_fsdp_forward_method

        kw = {}
        if mp_policy is not None:
            kw["mp_policy"] = mp_policy
        if self.cpu_offload:
            kw["offload_policy"] = CPUOffloadPolicy()
        ignored = {p for n, p in model.named_parameters() if n in frozen} or None
        names = {id(m): n for n, m in model.named_modules()}
        for block in transformer_blocks(model):
            prefix = names[id(block)] + "."
            if any(n.startswith(prefix) and n not in frozen for n, _ in model.named_parameters()):
                fully_shard(block, ignored_params=ignored, **kw)
        fully_shard(model, ignored_params=ignored, **kw)
        # Entry points other than forward (an AR model's kv_cache / extend, ...) must gather the root's weights too.
        for name in getattr(model, "forward_methods", ()):
            register_fsdp_forward_method(model, name)

    def accumulate(self, forward_model: nn.Module, last: bool):
        """The context of one micro-batch's forward and backward: DDP synchronises gradients on the last only; FSDP
        reduce-scatters every micro-batch, so gradients accumulate sharded (ZeRO-3's trade: more communication for
        1/W of the gradient memory; skipping the sync would hold a whole unsharded gradient per rank until the last
        micro-batch). On 2 CPU processes peak RSS showed no difference between the two (docs/benchmarks.md)."""
        if self.fsdp:
            return contextlib.nullcontext()
        if last or not self.env.distributed:
            return contextlib.nullcontext()
        return forward_model.no_sync()

    @staticmethod
    def grad_norm(norm: torch.Tensor) -> torch.Tensor:
        """clip_grad_norm_'s total norm as a plain tensor (under FSDP it is a replicated DTensor)."""
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm
