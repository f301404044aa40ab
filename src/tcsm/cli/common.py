"""Helpers shared by the subcommands: config help text, run directories, printing results."""

from __future__ import annotations

import json
import time
from pathlib import Path

#: the preset `tcsm train` runs without --config
DEFAULT_PRESET = "synthetic"


def config_help() -> str:
    """Epilog of config-taking commands: the presets and every config key with its default."""
    from tcsm.build.config import describe_keys, list_presets, preset_description

    lines = ["presets (--config NAME, or a YAML path):"]
    for name in list_presets():
        lines.append(f"  {name:<22} {preset_description(name)}")
    lines += [
        "",
        "A YAML file is applied over the schema defaults, not over a preset; to change a preset, begin the file with",
        "`extends: synthetic` (or another preset's name). Overrides (key=value) apply last. --print-config shows the",
        "result.",
        "",
        f"config keys (override with key=value), with the values a plain `tcsm train` uses (the {DEFAULT_PRESET} preset;",
        "tcsm train -c PRESET --print-config shows another preset's):",
    ]
    for key, default, text in describe_keys(DEFAULT_PRESET):
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


def add_overwrite_argument(p) -> None:
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run already in --out (its checkpoints, logs and config are deleted first)",
    )


def claim_run_dir(run_dir, *, resume: bool, overwrite: bool) -> None:
    """Before a command builds anything: a new run refuses a directory holding another run (tcsm.train.rundir)
    unless `--overwrite`, and a resumed run keeps its directory. The overwrite itself happens in the Trainer, once
    the whole run has been built, so a run that cannot start never costs the old one its files."""
    import os

    from tcsm.errors import ConfigError
    from tcsm.train.rundir import refuse_existing_run

    if overwrite and resume:
        raise ConfigError("give --resume (continue the run) or --overwrite (replace it), not both")
    if os.environ.get("RANK", "0") == "0" and not (resume or overwrite):  # rank 0 alone owns the run directory
        refuse_existing_run(run_dir)


def check_writable(path) -> None:
    """Fail before any work if `path` cannot be written as an output file (a missing folder, a directory, no
    permission); an existing file is left as it is."""
    import os

    from tcsm.errors import ConfigError

    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"output {str(p)!r} is a directory; give a file name")
    if not p.parent.is_dir():
        raise ConfigError(f"cannot write output {str(p)!r}: its directory {str(p.parent)!r} does not exist")
    existed = p.exists()
    try:
        with open(p, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise ConfigError(f"cannot write output {str(p)!r}: {e.strerror or e}") from None
    if not existed:
        os.unlink(p)


def write_atomically(path, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder, so a failure never leaves half a file."""
    import os

    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, p)
    finally:
        tmp.unlink(missing_ok=True)


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
    from tcsm.checkpoint import read_state, resolve_checkpoint
    from tcsm.errors import CheckpointError

    where = args.resume_from or run_dir
    if where is None:
        raise CheckpointError("--resume needs the run directory: give --out DIR (or use --resume-from PATH)")
    checkpoint = resolve_checkpoint(where)
    return checkpoint, run_dir or run_dir_of_checkpoint(checkpoint), read_state(checkpoint)[1].get("config")


def _number(x) -> str:
    """Four decimals, or four significant digits once a value (a diverged model's perplexity) is too large to read."""
    return "null" if x is None else f"{x:.4f}" if abs(x) < 1e6 else f"{x:.3e}"


def format_bound(result: dict) -> str:
    """One line for a likelihood bound or a clean model's NLL / pseudo-NLL (named by tcsm.clean_losses.metric_label)."""
    from tcsm.clean_losses import metric_label

    floor = result.get("floor_bpc")
    gap = f" ({100 * (result['bpc'] / floor - 1):+.1f}% vs the source entropy {floor:.4f})" if floor else ""
    # A clean-data model's exact or pseudo-NLL (tcsm.clean_losses) draws no times.
    times = f" × {result['num_t']} t" if "num_t" in result else ""
    return (
        f"{result['bpc']:.4f} ± {result['bpc_stderr']:.4f} bits/token, perplexity {_number(result['perplexity'])}"
        f"{gap} [{metric_label(result['bound'])}, {result['num_sequences']} sequences{times}]"
    )


def jsonable(d: dict) -> dict:
    """`d` as strict JSON values (NaN / inf → null), the same rule as every JSON file tcsm writes."""
    from tcsm.evaluation.report import to_jsonable

    return to_jsonable(d)
