"""Progress of a long computation on stderr, with rate and ETA: a tqdm bar on a terminal, and a plain line every
`every_s` seconds otherwise (a log file, a batch job), where a bar would print nothing or a run of carriage
returns. Used where a command can run for minutes without other output (e.g. an energy model's evaluation)."""

from __future__ import annotations

import sys
import time


def duration(seconds: float) -> str:
    """12s, 3m05s, 1h02m."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


class WorkProgress:
    """`update(n)` as work is done out of `total` units; `close()` at the end. `enabled=False` is silent."""

    #: seconds between plain lines (no terminal); the first comes after this long, so short work prints nothing
    EVERY_S = 20.0

    def __init__(
        self, total: float, desc: str, unit: str, *, every_s: float | None = None, file=None, enabled=True
    ):
        self.total, self.desc, self.unit = float(total), desc, unit
        self.every_s = float(self.EVERY_S if every_s is None else every_s)
        self.file = file if file is not None else sys.stderr
        self.done, self.enabled = 0.0, bool(enabled)
        self.start = self.last = time.perf_counter()
        self._bar = None
        if self.enabled and getattr(self.file, "isatty", lambda: False)():
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=int(total), desc=desc, unit=unit, file=self.file, dynamic_ncols=True, unit_scale=True
            )

    def update(self, n: float) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(int(self.done) - self._bar.n)
        elif self.enabled and time.perf_counter() - self.last >= self.every_s:
            self.last = time.perf_counter()
            print(self.line(), file=self.file, flush=True)

    def line(self) -> str:
        elapsed = time.perf_counter() - self.start
        rate = self.done / max(elapsed, 1e-9)
        left = max(self.total - self.done, 0.0)
        eta = duration(left / rate) if rate > 0 else "?"
        pct = 100 * min(self.done / self.total, 1.0) if self.total > 0 else 100.0
        return (
            f"{self.desc}: {pct:.0f}% ({self.done:,.0f}/{self.total:,.0f} {self.unit}), {duration(elapsed)} "
            f"elapsed, ETA {eta}"
        )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.update(max(int(self.total) - self._bar.n, 0))
            self._bar.close()
