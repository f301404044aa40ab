"""Sharded checkpoints (`train.strategy=fsdp`): every rank writes its own shards of the weights, the EMA copy and
the optimizer moments with `torch.distributed.checkpoint` (DCP) into `<step dir>/sharded/`; rank 0 adds the rest of
the training state (`state.json`, as for any checkpoint) and, unless `train.consolidated_weights=false`, the whole
weights as `model.safetensors` / `ema.safetensors`, so `tcsm sample`, `tcsm eval`, `train.init_from` and the
Hugging Face export read an FSDP run like any other (without them, `tcsm.storage.checkpoint.read_weights` consolidates the
shards on the fly).

Atomic as before: all ranks write into one hidden staging directory that rank 0 names, and rank 0 renames it into
place only after every rank has finished and the manifest (which lists the shard files too) is written. A kill at
any point leaves a directory that is never loaded (`tcsm.storage.checkpoint.resolve_checkpoint`).

Resuming reads the shards into whatever layout the resuming run has — any number of processes, FSDP or not —
through DCP's re-sharding (`get_state_dict` gives the target layout, `dcp.load` fills it, `set_state_dict` puts it
back), so a run saved on 2 processes continues on 1 and vice versa; the data order is global (`EpochBatches`) and
the noise is keyed by (seed, step, micro-batch), so the continued run is the uninterrupted one, to summation order.
"""

from __future__ import annotations

import contextlib
import uuid
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from tcsm.storage.checkpoint import PREFIX, SHARDS
from tcsm.train.distributed import DistEnv

__all__ = ["full_weights", "read_shards", "staging_dir", "write_shards"]


def staging_dir(root: Path, step: int, env: DistEnv) -> Path:
    """A fresh hidden directory under `root` (named by rank 0, the same on every rank) to write a checkpoint into."""
    box = [str(root / f".tmp-{PREFIX}{int(step):08d}-{uuid.uuid4().hex[:8]}")]
    if env.distributed:
        dist.broadcast_object_list(box, src=0)
    path = Path(box[0])
    if env.is_main:
        path.mkdir(parents=True)
    if env.distributed:
        dist.barrier()
    return path


@contextlib.contextmanager
def _single_process_quiet():
    """DCP warns that it assumes a single process when there is no process group: that is what we ask for."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _payload(model: nn.Module, optimizer, ema_model: nn.Module | None) -> dict:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    payload = {"model": model_sd, "optim": optim_sd}
    if ema_model is not None:
        payload["ema"] = get_model_state_dict(ema_model)
    return payload


def write_shards(
    directory: Path, model: nn.Module, optimizer, ema_model: nn.Module | None, env: DistEnv
) -> None:
    """Every rank writes its shards of the model, optimizer and EMA into `directory/sharded` (collective)."""
    import torch.distributed.checkpoint as dcp

    with _single_process_quiet():
        dcp.save(
            _payload(model, optimizer, ema_model),
            checkpoint_id=directory / SHARDS,
            no_dist=not env.distributed,
        )


def read_shards(
    directory: Path, model: nn.Module, optimizer, ema_model: nn.Module | None, env: DistEnv
) -> None:
    """Load the shards of `directory/sharded` into this run's model, optimizer and EMA, re-sharded to its layout."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    payload = _payload(model, optimizer, ema_model)
    with _single_process_quiet():
        dcp.load(payload, checkpoint_id=directory / SHARDS, no_dist=not env.distributed)
    set_state_dict(model, optimizer, model_state_dict=payload["model"], optim_state_dict=payload["optim"])
    if ema_model is not None:
        set_model_state_dict(ema_model, payload["ema"])


def full_weights(model: nn.Module, env: DistEnv) -> dict[str, torch.Tensor]:
    """The whole state dict of a (sharded) model on rank 0's host; an empty dict on the other ranks (collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not env.distributed:
        return {k: v.detach() for k, v in model.state_dict().items()}
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return sd if env.is_main else {}
