"""DistributedDataParallel set-up: the same command runs alone or under `torchrun --nproc_per_node N`.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; we then join a process group (NCCL on GPUs, gloo on CPU), give
each rank its local GPU, and let rank 0 alone write logs and checkpoints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from tcsm.errors import ConfigError

__all__ = [
    "DistEnv",
    "all_reduce_mean",
    "barrier",
    "resolve_device",
    "setup_distributed",
    "teardown_distributed",
]


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(pref: str, local_rank: int = 0) -> torch.device:
    """auto → this rank's GPU if CUDA is available, else CPU; cuda → this rank's GPU; cuda:N as given."""
    if pref == "cpu":
        return torch.device("cpu")
    if pref == "auto" and not torch.cuda.is_available():
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"train.device={pref} but CUDA is not available; use train.device=cpu or auto")
    if pref.startswith("cuda:"):
        return torch.device(pref)
    return torch.device("cuda", local_rank)


def setup_distributed(device_pref: str = "auto") -> DistEnv:
    """Join the process group torchrun describes (if any) and pick this rank's device."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_pref, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    return DistEnv(rank=rank, world_size=world_size, local_rank=local_rank, device=device)


def teardown_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier(env: DistEnv) -> None:
    if env.distributed:
        if env.device.type == "cuda":
            dist.barrier(device_ids=[env.device.index])
        else:
            dist.barrier()


def all_reduce_mean(values: dict[str, float], env: DistEnv) -> dict[str, float]:
    """Average a dict of Python floats over ranks (keys must agree); identity when not distributed."""
    if not env.distributed or not values:
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=env.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return dict(zip(keys, (t / env.world_size).tolist()))
