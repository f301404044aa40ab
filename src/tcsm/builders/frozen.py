"""The one way a run loads a frozen model from a checkpoint: the pre-trained model of a reward fine-tune, a
parametric or distillation teacher, the reference of a DRE or preference fine-tune, an energy model's reference.

`load_frozen` reads the checkpoint through `load_checkpoint`, freezes the model (eval mode, no gradients) and
checks it against the run in one place, with one-line CheckpointErrors that name the role it plays:

* family — a diffusion denoiser (`DENOISER`) or an LM (a model of the data, not a diffusion model) of the given families (teachers);
* vocabulary — the same V clean tokens as the run's data;
* source — a denoiser's noise source is the run's path (the input alphabet, and every ratio p / p^ref, needs it);
* length — the model accepts the run's sequence length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tcsm.builders.loading import LoadedCheckpoint, load_checkpoint
from tcsm.core.errors import CheckpointError, ConfigError
from tcsm.models.kinds import kind_of
from tcsm.targets.base import freeze

__all__ = ["DENOISER", "Frozen", "load_frozen", "load_reference"]

#: `families` value of a diffusion denoiser (a model with no LM `family`, not an energy model)
DENOISER = ("denoiser",)


@dataclass
class Frozen:
    """A frozen model and the checkpoint it came from."""

    model: Any
    checkpoint: LoadedCheckpoint


def _family(model) -> str:
    return kind_of(model).family


def load_frozen(
    path, ctx=None, *, role: str, families=DENOISER, ema: bool = True, device=None, vocab_size: int | None = None,
    source: str | None = None, seq_len: int | None = None,
) -> Frozen:
    """The frozen model of the checkpoint `path` (a run, checkpoints or step directory) for `role` (how errors
    name it, e.g. "reference.path (the teacher)"), checked against the run: `ctx` (a BuildContext) supplies the device,
    vocabulary, noise source and sequence length, or give them (None: not checked). `families`: the model kinds
    accepted (`DENOISER`, or LM families such as ("mlm", "causal", "hollow"))."""
    if ctx is not None:
        device = ctx.device if device is None else device
        vocab_size = ctx.vocab_size if vocab_size is None else vocab_size
        source = (ctx.path.kind if ctx.path is not None else None) if source is None else source
        seq_len = ctx.seq_len if seq_len is None else seq_len
    ck = load_checkpoint(path, device=device or "cpu", ema=ema)
    where = str(ck.directory)
    family = _family(ck.model)
    if family not in families:
        want = "it is not a diffusion denoiser of a `tcsm train` run" if families == DENOISER else (
            f"it is not an LM of the families {' | '.join(families)} (tcsm train with objective.name=lm)"
        )
        raise CheckpointError(f"{role} {where!r} holds a model of type {type(ck.model).__name__}; {want}")
    V = int(ck.data_info["vocab_size"])
    if vocab_size is not None and V != int(vocab_size):
        raise CheckpointError(
            f"{role} {where!r} was trained on {V} tokens; this run's data has {vocab_size} (a frozen model needs the "
            "same vocabulary and noise source as the run)"
        )
    data = getattr(ctx, "data", None)
    if data is not None and ck.data_info.get("tokenizer_identity"):
        from tcsm.builders.components import DataInfo

        known = {k: v for k, v in ck.data_info.items() if k in DataInfo.__dataclass_fields__}
        DataInfo(**known).check_compatible(data, f"{role} {where}")
    if kind_of(ck.model).is_denoiser and source is not None and ck.config.path.source != source:
        raise CheckpointError(
            f"{role} {where!r} is a {ck.config.path.source} model; this run has a {source} path (a frozen model "
            "needs the same vocabulary and noise source as the run)"
        )
    run_blocks = getattr(getattr(ctx, "path", None), "block_length", None)
    own_blocks = getattr(ck.model, "block_length", None) if kind_of(ck.model).blocks else None
    if ctx is not None and kind_of(ck.model).is_denoiser and own_blocks != run_blocks:
        own, run = (("full-sequence" if k is None else f"block_length={k}") for k in (own_blocks, run_blocks))
        raise CheckpointError(
            f"{role} {where!r} is a {own} denoiser; this run's path is {run} (a frozen denoiser needs the run's "
            "path.block_length)"
        )
    max_len = getattr(getattr(ck.model, "cfg", None), "max_len", None)
    if seq_len is not None and max_len is not None and int(seq_len) > max_len:
        raise CheckpointError(f"{role} {where!r} allows sequences of at most {max_len}; the data has {seq_len}")
    return Frozen(freeze(ck.model), ck)


def load_reference(ctx, uses: list, *, own_stream: bool = False) -> None:
    """The build step between the path and the model: load the run's frozen model (`reference.path`) once, with one
    set of checks, into `ctx.reference` (and `ctx.reference_checkpoint`) when an entry of the run declares a use of
    it (`ReferenceUse`); the entries then read it from the context. `uses`: (the entry's config node, its use).

    `own_stream`: load it without drawing from the run's random stream (rebuilding a checkpoint's model draws
    initial weights before it reads the saved ones), so the trainable model built next starts from the same
    weights as a run without a frozen model; a model built *around* the reference (an energy model) leaves this
    off, its initialisation following the load as part of its own build."""
    ref = ctx.config.reference
    uses = [(node, use) for node, use in uses if use is not None]
    if not uses or not ref.path:
        return
    if own_stream:
        device = torch.device(ctx.device) if ctx.device is not None else None
        cuda = [device.index or 0] if device is not None and device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            return load_reference(ctx, uses)
    node, use = uses[0]
    families = set(use.families)
    for _, other in uses[1:]:
        families &= set(other.families)
    if not families:
        roles = " and ".join(u.role for _, u in uses)
        raise ConfigError(f"reference.path is read as {roles}, which accept no common kind of model")
    if use.load is not None:
        ctx.reference = use.load(node, ctx)
        return
    frozen = load_frozen(ref.path, ctx, role=use.role, families=tuple(sorted(families)), ema=ref.ema)
    ctx.reference, ctx.reference_checkpoint = frozen.model, frozen.checkpoint
