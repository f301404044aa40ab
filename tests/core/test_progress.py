"""The one progress helper (core/progress.py): off a terminal, plain lines with done/total, rate and ETA."""

from __future__ import annotations

import io

from tcsm.core import progress
from tcsm.core.progress import WorkProgress, duration


def test_duration():
    assert [duration(s) for s in (12, 185, 3720)] == ["12s", "3m05s", "1h02m"]


def test_plain_lines_count_the_rate_from_a_resumed_start(monkeypatch):
    clock = iter([100.0, 110.0, 130.0, 130.0])
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    lines = []
    p = WorkProgress(100, "step", "steps", initial=20, every_s=60.0, file=io.StringIO(), emit=lines.append)
    p.update(10)  # 10 s in: not yet due
    assert lines == []
    p.update(10, final=True)  # the last update always gets a line
    assert lines == ["step 40/100 (40.0%), 0.667 steps/s, 30s elapsed, ETA 1m30s"]


def test_disabled_progress_is_silent_and_write_prints_plainly():
    out = io.StringIO()
    p = WorkProgress(4, "nelbo", "batch", every_s=0.0, file=out, enabled=False)
    p.update(1, final=True)
    p.close()
    assert out.getvalue() == "" and not p.bar_shown
    p.write("a message", file=out)
    assert out.getvalue() == "a message\n"
