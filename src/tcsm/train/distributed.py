"""DistributedDataParallel set-up: the same command runs alone or under `torchrun --nproc_per_node N`.

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK; we then join a process group (NCCL on GPUs, gloo on CPU), give
each rank its local GPU, and let rank 0 alone write logs and checkpoints. Each rank watches its launcher
(`watch_launcher`): when the launcher dies (`kill -9` of torchrun), the rank stops instead of training on alone.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from tcsm.core.errors import ConfigError

__all__ = [
    "DistEnv",
    "all_reduce_mean",
    "barrier",
    "resolve_device",
    "setup_distributed",
    "teardown_distributed",
    "watch_launcher",
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
        watch_launcher()
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


#: set when this rank stops because its launcher died (the CLI then says so instead of "interrupted")
launcher_gone: int | None = None
_watching = False


def watch_launcher(poll_s: float = 1.0, grace_s: float = 10.0) -> None:
    """Stop this process when its parent (the torchrun agent that started it) dies: a daemon thread notices the
    parent's pid change (the orphan is re-parented), interrupts the main thread (KeyboardInterrupt: the run's
    lock is released, the CLI says why), and if the main thread is stuck in a collective whose peers are gone,
    removes the run's lock and exits after `grace_s`. No-op when the parent is already init (nothing to watch)."""
    global _watching
    parent = os.getppid()
    if _watching or parent <= 1:
        return
    _watching = True

    def watch():
        global launcher_gone
        while os.getppid() == parent:
            time.sleep(poll_s)
        launcher_gone = parent
        import _thread

        # Past the grace, the kernel ends the process even if the interpreter is stuck finalizing (a daemon thread
        # cannot run once finalization starts, so the os._exit below alone is not enough).
        signal.alarm(int(grace_s) + 5)
        _thread.interrupt_main()
        time.sleep(grace_s)
        from tcsm.train.rundir import release_all_run_locks

        release_all_run_locks()
        tag = f"[rank {os.environ.get('RANK', '?')}/{os.environ.get('WORLD_SIZE', '?')}] "
        print(f"{tag}tcsm: the launcher (pid {parent}) is gone; this process stops", file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="tcsm-launcher-watch", daemon=True).start()
