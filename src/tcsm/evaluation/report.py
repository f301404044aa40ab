"""JSON evaluation reports and the plots that read better than a table (gen-PPL and entropy against steps)."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["genppl_figure", "plot_genppl_vs_steps", "report_meta", "to_jsonable", "write_report"]


def report_meta() -> dict:
    """Where a report came from: versions, command line, time (so a number can be traced to its run)."""
    import torch

    import tcsm

    return {
        "tcsm_version": getattr(tcsm, "__version__", "unknown"),
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "command": " ".join(sys.argv),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def to_jsonable(x):
    """`x` with tensors/arrays as lists, paths as strings and NaN/inf as null."""
    # NaN/inf are not JSON; write them as null rather than emitting a file other tools refuse to read.
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if hasattr(x, "tolist"):
        return to_jsonable(x.tolist())
    if isinstance(x, os.PathLike):
        return os.fspath(x)
    return x


def write_report(path: str | os.PathLike, results: dict) -> Path:
    """Write `results` plus a "meta" block as indented JSON; creates parent directories."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": report_meta(), **to_jsonable(results)}
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def plot_genppl_vs_steps(rows: Sequence[dict], path: str | os.PathLike, title: str | None = None) -> Path:
    """Write `genppl_figure(rows, title)` to `path` (PNG); creates parent directories."""
    import matplotlib.pyplot as plt

    fig = genppl_figure(rows, title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def genppl_figure(rows: Sequence[dict], title: str | None = None):
    """Two panels against the number of sampling steps: gen-PPL and mean sample entropy (a matplotlib Figure).

    `rows`: dicts with "steps", "gen_ppl" and "entropy_mean"; an optional "series" key draws several curves
    (for example one per sampler). Dashed lines mark the data's own values, "data_gen_ppl" and
    "data_entropy", when rows carry them. Both value axes start at 0 and print plain numbers (no offset), so a
    difference reads at its true size; gen-PPL switches to a log axis only when it spans more than a decade.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    series: dict[str, list[dict]] = {}
    for r in rows:
        series.setdefault(str(r.get("series", "")), []).append(r)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.4))
    for name, rs in series.items():
        rs = sorted(rs, key=lambda r: r["steps"])
        steps = [r["steps"] for r in rs]
        ax1.plot(steps, [r["gen_ppl"] for r in rs], marker="o", label=name or None)
        ax2.plot(steps, [r["entropy_mean"] for r in rs], marker="o", label=name or None)
    ref = [r["data_entropy"] for r in rows if r.get("data_entropy") is not None]
    if ref:
        ax2.axhline(ref[0], color="gray", linestyle="--", label="data")
    ref_ppl = [r["data_gen_ppl"] for r in rows if r.get("data_gen_ppl") is not None]
    if ref_ppl:
        ax1.axhline(ref_ppl[0], color="gray", linestyle="--", label="data")
    for ax, ylabel in ((ax1, "generative perplexity"), (ax2, "sample entropy (nats)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("sampling steps K")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    # Entropy from 0: sampling noise of a few hundredths must not look like a trend; a collapse still shows.
    top = max([r["entropy_mean"] for r in rows] + ref)
    ax2.set_ylim(0, 1.15 * top if top > 0 else 1.0)
    # A log axis only when gen-PPL spans more than a decade. On a linear one the axis starts at 0 and shows plain
    # numbers: an autoscaled, offset axis (e.g. "+1e3") makes a 0.002 difference fill the panel.
    ppl = [r["gen_ppl"] for r in rows] + ref_ppl
    if max(ppl) > 10 * min(ppl) > 0:
        ax1.set_yscale("log")
    else:
        ax1.set_ylim(0, 1.15 * max(ppl) if max(ppl) > 0 else 1.0)
        ax1.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax2.ticklabel_format(axis="y", style="plain", useOffset=False)
    if len(series) > 1 or ref or ref_ppl:
        ax1.legend(fontsize=8)
        ax2.legend(fontsize=8, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig
