"""`fit`: train a run from its config, under torchrun or not, and write its summary — what every command that
trains (`tcsm train`, `tcsm finetune`, `tcsm demo`, the benchmarks) calls."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from tcsm.evaluation.report import to_jsonable

__all__ = ["fit"]


def fit(cfg, run_dir, resume=None, log: Callable[[str], None] | None = None, overwrite: bool = False) -> dict:
    """Set up the process group (if under torchrun), train with `Trainer.from_config`, write summary.json;
    returns the summary. `overwrite` replaces a run already in `run_dir` once the new one has been built."""
    import torch.distributed as dist

    from tcsm.train.distributed import setup_distributed, teardown_distributed
    from tcsm.train.preempt import catch_sigterm
    from tcsm.train.rundir import hold_run_dir
    from tcsm.train.trainer import Trainer

    env = setup_distributed(cfg.train.device)
    try:
        if env.distributed:  # every rank must write to rank 0's run directory (its name holds a time)
            box = [str(run_dir)]
            dist.broadcast_object_list(box, src=0)
            run_dir = box[0]
        # Rank 0 holds the run directory until its summary is written (tcsm.train.rundir: one writer per run).
        # A SIGTERM while the run is built is kept for the first step boundary (tcsm.train.preempt).
        with catch_sigterm(), _names_run_dir(run_dir), hold_run_dir(run_dir, env.is_main):
            trainer = Trainer.from_config(cfg, run_dir, resume=resume, env=env, log=log, overwrite=overwrite)
            summary = trainer.fit()
            if env.is_main:
                # A diverged run's inf perplexity is written as null: summary.json stays strict JSON.
                text = json.dumps(to_jsonable(summary), indent=1, allow_nan=False)
                (Path(run_dir) / "summary.json").write_text(text + "\n", encoding="utf-8")
    finally:
        teardown_distributed()
    return summary


@contextmanager
def _names_run_dir(run_dir):
    """A Ctrl-C or SIGTERM (KeyboardInterrupt, Preempted) leaving `fit` carries the run directory, for the CLI's "resume with" line."""
    try:
        yield
    except KeyboardInterrupt as e:
        e.run_dir = str(run_dir)
        raise
