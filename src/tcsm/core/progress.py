"""Progress of a long computation, with rate and ETA: a tqdm bar on a terminal, and a plain line every `every_s`
seconds otherwise (a log file, a batch job), where a bar would print nothing or a run of carriage returns. The one
progress helper: training steps, likelihood evaluation, sampling and an energy model's estimate all use it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

__all__ = ["WorkProgress", "duration"]


def duration(seconds: float) -> str:
    """12s, 3m05s, 1h02m."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class WorkProgress:
    """`update(n)` as work is done out of `total` units (starting from `initial`, e.g. a resumed run's step);
    `close()` at the end. `enabled=False` is silent. Plain lines go to `emit` (default: print to `file`), the
    first after `every_s` seconds (short work prints nothing) and one at `update(..., final=True)`."""

    #: seconds between plain lines (no terminal); the first comes after this long, so short work prints nothing
    EVERY_S = 20.0

    def __init__(
        self,
        total: float,
        desc: str,
        unit: str,
        *,
        initial: float = 0,
        every_s: float | None = None,
        file=None,
        enabled=True,
        emit: Callable[[str], None] | None = None,
    ):
        self.total, self.desc, self.unit = float(total), desc, unit
        self.every_s = float(self.EVERY_S if every_s is None else every_s)
        self.file = file if file is not None else sys.stderr
        self.emit = emit if emit is not None else (lambda line: print(line, file=self.file, flush=True))
        self.initial = self.done = float(initial)
        self.enabled = bool(enabled)
        self.start = self.last = time.perf_counter()
        self._bar = None
        if self.enabled and getattr(self.file, "isatty", lambda: False)():
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=int(total), initial=int(initial), desc=desc, unit=unit, file=self.file, dynamic_ncols=True,
                unit_scale=True, smoothing=0.05,
            )  # fmt: skip

    @property
    def bar_shown(self) -> bool:
        """Whether a live bar is on the terminal (then other output goes through `write`)."""
        return self._bar is not None

    def update(self, n: float = 1, *, final: bool = False) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(int(self.done) - self._bar.n)
        elif self.enabled and (final or time.perf_counter() - self.last >= self.every_s):
            self.last = time.perf_counter()
            self.emit(self.line())

    def postfix(self, **values) -> None:
        """Figures shown after the bar (a terminal only: lines keep to progress)."""
        if self._bar is not None:
            self._bar.set_postfix(**values, refresh=False)

    def write(self, message: str, file=None) -> None:
        """Print `message` above a live bar (or plainly)."""
        if self._bar is not None:
            self._bar.write(message, file=file or sys.stdout)
        else:
            print(message, file=file or sys.stdout, flush=True)

    def line(self) -> str:
        elapsed = time.perf_counter() - self.start
        rate = (self.done - self.initial) / max(elapsed, 1e-9)
        eta = duration(max(self.total - self.done, 0.0) / rate) if rate > 0 else "?"
        pct = 100 * min(self.done / self.total, 1.0) if self.total > 0 else 100.0
        return (
            f"{self.desc} {self.done:,.0f}/{self.total:,.0f} ({pct:.1f}%), {rate:.3g} {self.unit}/s, "
            f"{duration(elapsed)} elapsed, ETA {eta}"
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.update(max(int(self.total) - self._bar.n, 0))
            self._bar.close()
            self._bar = None
