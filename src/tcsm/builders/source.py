"""The run a post-training recipe starts from: read its config and refuse one that is not a diffusion denoiser run
before anything is built or replaced (an energy model or an LM cannot be the start of a reward,
preference or DRE fine-tune: they would fail only at the first training step)."""

from __future__ import annotations

from pathlib import Path

from tcsm.builders.registry import family_of_name
from tcsm.core.errors import CheckpointError
from tcsm.storage.checkpoint import read_state, resolve_checkpoint
from tcsm.storage.migration import without_reference

__all__ = ["source_run"]


def source_run(
    checkpoint, recipe: str, families: tuple[str, ...] = ("denoiser",), needs: str = "a diffusion denoiser run"
) -> tuple[Path, dict]:
    """(checkpoint directory, its run config without its own frozen model) of the run `checkpoint` names — the base
    of a recipe, which sets its own `reference`; CheckpointError (one line) if it holds no run config or its model's
    family is not one of `families` (a diffusion denoiser, for every recipe of `tcsm finetune` but RL's)."""
    directory = resolve_checkpoint(checkpoint)
    state = read_state(directory)[1]
    if "config" not in state:
        raise CheckpointError(f"{str(directory)!r} holds no run config; it was not written by `tcsm train`")
    base = without_reference(dict(state["config"]))
    name = (base.get("model") or {}).get("name", "denoiser")
    if family_of_name(name).family not in families:
        raise CheckpointError(
            f"{str(directory)!r} trained {family_of_name(name).description} (model.name={name}); tcsm finetune "
            f"{recipe} needs {needs} (tcsm train) to start from"
        )
    return directory, base
