"""Helpers shared by the subcommands: config help text, run directories, printing results."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path


def config_help() -> str:
    """Epilog of config-taking commands: the presets and every config key with its default."""
    from tcsm.build.config import describe_keys, list_presets, preset_description

    lines = ["presets (--config NAME, or a YAML path):"]
    for name in list_presets():
        lines.append(f"  {name:<22} {preset_description(name)}")
    lines += ["", "config keys (override with key=value; defaults shown for the default components):"]
    for key, default, text in describe_keys():
        if isinstance(default, str):
            shown = default or '""'
        else:
            shown = (
                "null"
                if default is None
                else json.dumps(default)
                if isinstance(default, (list, dict, bool))
                else str(default)
            )
        lines.append(f"  {key}={shown}" + (f"    # {text}" if text else ""))
    lines += [
        "",
        "Component sections are chosen by name (model.name, target.name, objective.name, data.kind); their",
        "keys depend on that choice. Four paper variants: path.source=masked|uniform × objective.loss=distrib|score.",
    ]
    return "\n".join(lines)


def default_run_dir(label: str) -> Path:
    """runs/<label>-<YYYYmmdd-HHMMSS> (runs/ is git-ignored)."""
    stem = Path(label).stem if label.endswith((".yaml", ".yml")) else label
    return Path("runs") / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"


def run_dir_of_checkpoint(path: str | Path) -> Path:
    """The run directory a checkpoint path belongs to (the parent of `checkpoints/`), or the path itself."""
    p = Path(path).resolve()
    for candidate in (p, *p.parents):
        if candidate.name == "checkpoints":
            return candidate.parent
        if (candidate / "checkpoints").is_dir():
            return candidate
    return p


def resume_point(args, run_dir: Path | None) -> tuple[Path, Path, dict | None] | None:
    """(checkpoint, run directory, its saved config) that `--resume` (in --out DIR) or `--resume-from PATH`
    continues, or None when the command starts a new run. The run directory is --out's when given."""
    if not (args.resume or args.resume_from):
        return None
    from tcsm.errors import CheckpointError
    from tcsm.checkpoint import read_state, resolve_checkpoint

    where = args.resume_from or run_dir
    if where is None:
        raise CheckpointError("--resume needs the run directory: give --out DIR (or use --resume-from PATH)")
    checkpoint = resolve_checkpoint(where)
    return checkpoint, run_dir or run_dir_of_checkpoint(checkpoint), read_state(checkpoint)[1].get("config")


def format_bound(result: dict) -> str:
    floor = result.get("floor_bpc")
    gap = f" ({100 * (result['bpc'] / floor - 1):+.1f}% vs the source entropy {floor:.4f})" if floor else ""
    # A clean-data model's exact or pseudo-NLL (tcsm.clean_losses) draws no times.
    times = f" × {result['num_t']} t" if "num_t" in result else ""
    return (
        f"{result['bpc']:.4f} ± {result['bpc_stderr']:.4f} bits/token, perplexity {result['perplexity']:.4f}"
        f"{gap} [{result['bound']} bound, {result['num_sequences']} sequences{times}]"
    )


def jsonable(d: dict) -> dict:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
