"""Run directories are never changed except by the run that owns them: a new run refuses a directory that already
holds one (`refuse_existing_run`, called by the Trainer, so every command that trains inherits it), and only an
explicit overwrite removes a run's files (`clear_run`), never anything else in the directory."""

from __future__ import annotations

import shutil
from pathlib import Path

from tcsm.errors import ConfigError

__all__ = [
    "RUN_FILES",
    "SOURCE_KEYS",
    "RunDirectoryExists",
    "clear_run",
    "existing_run",
    "refuse_existing_run",
    "refuse_overwriting_sources",
]

#: Files and folders a run writes into its directory (tcsm.train, tcsm.cli); the first four mark a run.
RUN_FILES = (
    "config.yaml",
    "checkpoints",
    "metrics.jsonl",
    "summary.json",
    "samples.jsonl",
    "tensorboard",
    "loss_curve.png",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "quickstart.json",
)
_MARKERS = RUN_FILES[:4]


class RunDirectoryExists(ConfigError):
    """A new run was pointed at a directory that already holds one."""


def existing_run(run_dir: str | Path | None) -> str | None:
    """A short description of the run `run_dir` holds ("step 400", "no checkpoint yet"), or None if it holds none."""
    if run_dir is None:
        return None
    d = Path(run_dir)
    if not d.is_dir() or not any((d / name).exists() for name in _MARKERS):
        return None
    from tcsm.checkpoint import list_checkpoints

    steps = list_checkpoints(d / "checkpoints")
    return f"checkpoints up to step {int(steps[-1].name.split('_')[1])}" if steps else "no checkpoint yet"


def refuse_existing_run(run_dir: str | Path | None) -> None:
    """Raise RunDirectoryExists (one line naming both ways out) if `run_dir` already holds a run."""
    what = existing_run(run_dir)
    if what is not None:
        raise RunDirectoryExists(
            f"run directory {str(run_dir)!r} already holds a run ({what}); continue it with --resume, choose a "
            "new directory (-o NEW_DIR), or pass --overwrite to replace it"
        )


def clear_run(run_dir: str | Path) -> list[str]:
    """Delete the run files (`RUN_FILES`) of `run_dir`, leaving anything else there; returns what was deleted."""
    d = Path(run_dir)
    removed = []
    for name in RUN_FILES:
        p = d / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        else:
            continue
        removed.append(name)
    return removed


#: Config keys that name another run a run starts from or reads while it trains (warm start, frozen reference,
#: pre-trained model of a reward tilt, AR teacher, energy model's reference), with the flag that usually sets them.
SOURCE_KEYS = {
    "train.init_from": "train.init_from",
    "reference.path": "--from / --reference / --teacher",
}


def _select(cfg, key: str):
    node = cfg
    for part in key.split("."):
        try:
            node = node[part] if isinstance(node, dict) else getattr(node, part)
        except (KeyError, AttributeError, TypeError):
            return None
    return node if isinstance(node, (str, Path)) else None


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a in b.parents or b in a.parents


def refuse_overwriting_sources(run_dir: str | Path, cfg) -> None:
    """ConfigError (one line) if replacing the run in `run_dir` would delete a run that `cfg` starts from or reads
    (`SOURCE_KEYS`): `run_dir` is, contains or lies inside that run (or the checkpoint it names)."""
    out = Path(run_dir).expanduser().resolve()
    for key, flag in SOURCE_KEYS.items():
        value = _select(cfg, key)
        if not value:
            continue
        source = Path(value).expanduser()
        if not source.exists():  # "ema", "previous", a Hugging Face id: not a path on this machine
            continue
        source = source.resolve()
        owner = next((p for p in (source, *source.parents) if p.name == "checkpoints"), None)
        runs = {source} | ({owner.parent} if owner is not None else set())
        if any(_overlaps(out, r) for r in runs):
            raise ConfigError(
                f"--overwrite -o {str(run_dir)!r} would delete {str(source)!r}, the run this one starts from "
                f"({key}, set by {flag}); write the new run to another directory"
            )
