"""SIGTERM, what Slurm and torchrun send before they kill a job, stops a run the way Ctrl-C does, but at a step
boundary: the Trainer saves a checkpoint of the finished step, the run directory's lock is released and the CLI
prints the resume line and exits non-zero (143). Under torchrun every rank gets the signal and the ranks agree on
the step to stop at, so a sharded checkpoint is written by all of them. A second SIGTERM stops at once, as Ctrl-C."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

__all__ = ["Preempted", "catch_sigterm", "sigterm_received"]

_received = False
_depth = 0


class Preempted(KeyboardInterrupt):
    """The run stopped on SIGTERM after saving the checkpoint of `step` (None: it had nothing to save)."""

    def __init__(self, step: int | None = None):
        super().__init__(step)
        self.step = step


def sigterm_received() -> bool:
    return _received


def _on_sigterm(signum, frame):
    global _received
    if _received:  # asked twice: stop now, as a second Ctrl-C would
        raise KeyboardInterrupt
    _received = True


@contextmanager
def catch_sigterm():
    """While inside, SIGTERM only sets the flag `sigterm_received()` reads (nested uses share one handler; the
    previous handler comes back on leaving the outermost). Off the main thread, where Python cannot set a signal
    handler, nothing changes."""
    global _depth, _received
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if _depth == 0 else None
    if _depth == 0:
        _received = False
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            signal.signal(signal.SIGTERM, previous)
            _received = False
