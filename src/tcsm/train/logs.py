"""Run logs: metrics.jsonl and samples.jsonl (always), a loss-curve PNG (if matplotlib is installed), and one tracker
chosen by `train.logger`: TensorBoard scalars and text (if installed), Weights & Biases (the `tcsm[wandb]` extra;
offline unless WANDB_MODE=online, so it needs no network: `wandb sync <run>/wandb/offline-run-*` uploads later), or
none ("jsonl"). Every tracker gets the same rows as metrics.jsonl and the run's config. Only rank 0 writes; other
ranks get a disabled logger."""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from pathlib import Path
from typing import Any

from tcsm.core.errors import ConfigError
from tcsm.storage.fileio import write_atomically

__all__ = ["LOGGERS", "RunLogger", "plot_curves", "read_metrics", "trim_rows"]

LOGGERS = ("tensorboard", "wandb", "jsonl")


class RunLogger:
    """Appends rows to a run's logs. `resume_step`: the step a resumed run restarts from; rows of later steps (logged
    before a crash, past the last checkpoint) are removed first, since those steps are about to be replayed."""

    def __init__(
        self,
        run_dir: str | Path | None,
        *,
        enabled: bool = True,
        tensorboard: bool = True,
        resume_step: int | None = None,
        backend: str = "tensorboard",
        config: dict | None = None,
    ):
        if backend not in LOGGERS:
            raise ConfigError(f"train.logger must be one of {list(LOGGERS)}, got {backend!r}")
        self.wanted = enabled and run_dir is not None
        self.enabled = False  # True while the files are open
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self._tensorboard = tensorboard and backend == "tensorboard"
        self._tb = None
        self._wandb = None
        self._backend, self._config = backend, config or {}
        if not self.wanted:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            for name in ("metrics.jsonl", "samples.jsonl"):
                trim_rows(self.run_dir / name, resume_step)
        self.open()

    def open(self) -> None:
        """(Re)open the logs for appending: a Trainer whose `fit` returned (and closed them) can fit further."""
        if not self.wanted or self.enabled:
            return
        # Appending keeps the history of a resumed run; readers keep the last row per (kind, step).
        self._metrics = open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._samples = open(self.run_dir / "samples.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self.enabled = True
        if self._tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # optional dependency (tcsm[log]); the jsonl log has everything
                SummaryWriter = None
            if SummaryWriter is not None:
                self._tb = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"))
                if self._config:
                    self._tb.add_text("config", "    " + json.dumps(self._config, indent=1).replace("\n", "\n    "))
        if self._backend == "wandb":
            self._wandb = _open_wandb(self.run_dir, self._config)

    def scalars(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"kind": kind, "step": int(step), "time": round(time.time(), 3)}
        row.update({k: _jsonable(v) for k, v in values.items()})
        self._metrics.write(json.dumps(row) + "\n")
        self._metrics.flush()
        if self._tb is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    self._tb.add_scalar(f"{kind}/{k}", v, step)
        if self._wandb is not None:
            numbers = {f"{kind}/{k}": v for k, v in row.items() if k not in ("kind", "step", "time")}
            self._wandb.log({k: v for k, v in numbers.items() if isinstance(v, (int, float))}, step=int(step))

    def samples(self, step: int, texts: list[str]) -> None:
        if not self.enabled:
            return
        self._samples.write(json.dumps({"step": int(step), "samples": texts}, ensure_ascii=False) + "\n")
        self._samples.flush()
        if self._tb is not None:
            body = "\n\n".join(f"    {t}" for t in texts)  # indented: TensorBoard renders markdown
            self._tb.add_text("samples", body, step)
        if self._wandb is not None:
            import wandb

            self._wandb.log({"samples": wandb.Table(columns=["sample"], data=[[t] for t in texts])}, step=int(step))

    def close(self) -> None:
        if not self.enabled:
            return
        self._metrics.close()
        self._samples.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            import wandb

            self._wandb.finish()
            # finish() returns before W&B's service has written everything to the run's files; teardown waits for
            # it, so the offline run is complete when the logger is closed (and `wandb sync` can follow at once).
            wandb.teardown()
            self._wandb = None
        self.enabled = False


def _open_wandb(run_dir: Path, config: dict):
    """A W&B run in `run_dir/wandb`, offline unless WANDB_MODE says otherwise, continued (same id) on resume."""
    try:
        import wandb
    except ImportError:
        raise ConfigError("train.logger=wandb needs the wandb package: pip install 'tcsm[wandb]'") from None
    id_file = run_dir / "wandb_id.txt"
    run_id = id_file.read_text(encoding="utf-8").strip() if id_file.is_file() else uuid.uuid4().hex[:12]
    id_file.write_text(run_id + "\n", encoding="utf-8")
    return wandb.init(
        project=os.environ.get("WANDB_PROJECT", "tcsm"),
        name=run_dir.name,
        id=run_id,
        resume="allow",
        dir=str(run_dir),
        mode=os.environ.get("WANDB_MODE") or "offline",
        config=config,
        settings=wandb.Settings(console="off", silent=True),  # our stdout stays ours
    )


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    if hasattr(v, "item"):
        return v.item()
    return v


def trim_rows(path: Path, last_step: int) -> int:
    """Keep the JSON-lines rows of `path` whose step is <= last_step (and drop lines cut by a kill); the file is
    replaced atomically. Returns the number of rows removed."""
    if not path.is_file():
        return 0
    kept, removed = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
            step = int(row["step"])
        except (ValueError, KeyError, TypeError):
            removed += 1
            continue
        if step <= last_step:
            kept.append(line)
        else:
            removed += 1
    if removed:
        write_atomically(path, "".join(line + "\n" for line in kept))
    return removed


def read_metrics(run_dir: str | Path) -> list[dict]:
    """Rows of metrics.jsonl; for a resumed run only the last row of each (kind, step) is kept."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    rows: dict[tuple[str, int], dict] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # a line cut by a kill: skip it
            continue
        rows[(row.get("kind", ""), int(row.get("step", 0)))] = row
    return sorted(rows.values(), key=lambda r: (r["step"], r.get("kind", "")))


def plot_curves(run_dir: str | Path, floor_bits: float | None = None) -> Path | None:
    """loss_curve.png: training loss and validation bits per token against the step; None without matplotlib."""
    from tcsm.core.results import metric_label

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    rows = read_metrics(run_dir)
    train = [
        (r["step"], r["loss"]) for r in rows if r.get("kind") == "train" and isinstance(r.get("loss"), float)
    ]
    valid = [
        (r["step"], r["bpc"]) for r in rows if r.get("kind") == "valid" and isinstance(r.get("bpc"), float)
    ]
    metric = next((r["bound"] for r in reversed(rows) if r.get("kind") == "valid" and "bound" in r), None)
    if not train and not valid:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    if train:
        axes[0].plot(*zip(*train), lw=1)
    axes[0].set(xlabel="step", ylabel="training loss (nats/token)", title="training loss")
    if valid:
        label = f"validation {metric_label(metric)}" if metric else "validation"
        axes[1].plot(*zip(*valid), marker="o", lw=1, label=label)
    if floor_bits is not None:
        axes[1].axhline(floor_bits, color="k", ls="--", lw=1, label="source entropy")
    axes[1].set(xlabel="step", ylabel="bits per token", title="validation")
    if valid or floor_bits is not None:
        axes[1].legend()
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(run_dir) / "loss_curve.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
