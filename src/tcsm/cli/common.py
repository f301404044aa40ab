"""Helpers shared by the subcommands: config help text, run directories, printing results, and the arguments,
config assembly and run tail that every recipe run (`tcsm finetune <recipe>`, `tcsm distill`) has in common."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tcsm.storage.fileio import write_atomically

#: the preset `tcsm train` runs without --config
DEFAULT_PRESET = "synthetic"


def config_help(preset: str | None = None) -> str:
    """Epilog of config-taking commands: the presets and every config key with its default — the values of a plain
    `tcsm train` (the default preset), or of a recipe's own `preset` over the run it starts from."""
    from tcsm.builders.help import describe_keys
    from tcsm.builders.presets import list_presets, preset_description

    lines = ["presets (--config NAME, or a YAML path):"]
    for name in list_presets():
        lines.append(f"  {name:<22} {preset_description(name)}")
    lines += [
        "",
        "A YAML file is applied over the schema defaults, not over a preset; to change a preset, begin the file with",
        "`extends: synthetic` (or another preset's name). Overrides (key=value) apply last. --print-config shows the",
        "result.",
        "",
    ]
    if preset is None:
        lines += [
            f"config keys (override with key=value), with the values a plain `tcsm train` uses (the {DEFAULT_PRESET} preset;",
            "tcsm train -c PRESET --print-config shows another preset's):",
        ]
    else:
        lines += [
            f"config keys (override with key=value), with the values of this command's {preset} preset. The run it",
            "starts from provides data, path and model, which the preset and overrides then change (--print-config",
            "shows the result):",
        ]
    for key, default, text in describe_keys(preset or DEFAULT_PRESET):
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

    from tcsm.core.errors import ConfigError
    from tcsm.train.rundir import refuse_existing_run, refuse_foreign_dir, refuse_run_in_use

    if overwrite and resume:
        raise ConfigError("give --resume (continue the run) or --overwrite (replace it), not both")
    if os.environ.get("RANK", "0") != "0":  # rank 0 alone owns the run directory
        return
    refuse_foreign_dir(run_dir)  # an export or prepared shards is never a run directory
    refuse_run_in_use(run_dir)  # a run still training is "in use", whatever else is true of it
    if not (resume or overwrite):
        refuse_existing_run(run_dir)


def check_overwrite(args) -> None:
    """The checks of a recipe run's `--overwrite` (tcsm finetune <recipe>, tcsm distill) before anything is built:
    it needs -o DIR and excludes --resume. The Trainer replaces the old run once the new one is built, and refuses
    (tcsm.train.rundir.refuse_overwriting_sources) when DIR is the run the new one starts from."""
    if not getattr(args, "overwrite", False):
        return
    from tcsm.core.errors import ConfigError

    if not getattr(args, "out", None):
        raise ConfigError("--overwrite needs -o DIR, the run directory to replace")
    resume = bool(getattr(args, "resume", False) or getattr(args, "resume_from", None))
    claim_run_dir(args.out, resume=resume, overwrite=True)  # checks only: the recipe's Trainer replaces the run


def check_writable(path, *, overwrite: bool = False) -> None:
    """Fail before any work if `path` cannot be written as an output file (a missing folder, a directory, no
    permission) or holds a file tcsm did not write (kept unless `overwrite`); a file tcsm wrote is replaced, said in
    one line."""
    import os
    import sys

    from tcsm.core.errors import ConfigError

    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"output {str(p)!r} is a directory; give a file name")
    if not p.parent.is_dir():
        raise ConfigError(f"cannot write output {str(p)!r}: its directory {str(p.parent)!r} does not exist")
    existed = p.exists()
    if existed and not overwrite:
        what = written_by_tcsm(p)
        if what is None:
            raise ConfigError(f"output {str(p)!r} exists and is not a file tcsm wrote (samples as JSON lines, an eval "
                              f"report); give --overwrite to replace it, or another file name")
        print(f"tcsm: replacing {str(p)!r} ({what} tcsm wrote)", file=sys.stderr)
    try:
        with open(p, "a", encoding="utf-8"):
            pass
    except OSError as e:
        raise ConfigError(f"cannot write output {str(p)!r}: {e.strerror or e}") from None
    if not existed:
        os.unlink(p)


_RECOGNISED_BYTES = 1 << 28  # a larger file is not read to recognise it: it is kept unless --overwrite


def written_by_tcsm(path) -> str | None:
    """What `path` is when tcsm wrote it — "samples" (`tcsm sample --format jsonl`: every line a sample record of a
    checkpoint) or "an eval report" (`tcsm eval --output`: one JSON object naming its checkpoint and step) — else
    None. A text file of samples carries no mark and is not recognised."""
    p = Path(path)
    try:
        if not p.is_file() or p.stat().st_size > _RECOGNISED_BYTES:
            return None
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    try:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    except ValueError:
        rows = None
    if rows and all(isinstance(r, dict) and {"checkpoint", "text", "tokens"} <= r.keys() for r in rows):
        return "samples"
    try:
        whole = json.loads(text)
    except ValueError:
        return None
    if isinstance(whole, dict) and {"checkpoint", "step"} <= whole.keys():
        return "an eval report"
    return None


def write_json_report(path, report: dict) -> None:
    """Write `report` to `path` as strict JSON (NaN / inf → null), atomically: a run's evaluation file is read by
    other tools, which refuse NaN, and an interrupted write must not replace a good report with half of one."""
    write_atomically(path, json.dumps(jsonable(report), indent=1, allow_nan=False) + "\n")


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
    from tcsm.core.errors import CheckpointError
    from tcsm.storage.checkpoint import read_state, resolve_checkpoint

    where = args.resume_from or run_dir
    if where is None:
        raise CheckpointError("--resume needs the run directory: give --out DIR (or use --resume-from PATH)")
    checkpoint = resolve_checkpoint(where)
    return checkpoint, run_dir or run_dir_of_checkpoint(checkpoint), read_state(checkpoint)[1].get("config")


def _number(x) -> str:
    """Four decimals, or four significant digits once a value (a diverged model's perplexity) is too large to read."""
    return "null" if x is None else f"{x:.4f}" if abs(x) < 1e6 else f"{x:.3e}"


def format_bound(result: dict) -> str:
    """One line for an evaluation result: a likelihood bound or an LM's NLL / pseudo-NLL (`EvalResult.label`)."""
    from tcsm.core.results import EvalResult

    result = EvalResult.of(result)

    floor = result.get("floor_bpc")
    gap = f" ({100 * (result['bpc'] / floor - 1):+.1f}% vs the source entropy {floor:.4f})" if floor else ""
    # An LM's exact or pseudo-NLL (tcsm.objectives.lm) draws no times.
    times = f" × {result['num_t']} t" if "num_t" in result else ""
    return (
        f"{result['bpc']:.4f} ± {result['bpc_stderr']:.4f} bits/token, perplexity {_number(result['perplexity'])}"
        f"{gap} [{result.label}, {result['num_sequences']} sequences{times}]"
    )


def jsonable(d: dict) -> dict:
    """`d` as strict JSON values (NaN / inf → null), the same rule as every JSON file tcsm writes."""
    from tcsm.evaluation.report import to_jsonable

    return to_jsonable(d)


# ------------------------------------------------------------------------------------------------ recipe runs
# A recipe run (`tcsm finetune <recipe>`, `tcsm distill`) is a `tcsm train` run whose config a recipe assembles
# from a source run and its own flags, followed on rank 0 by the recipe's evaluation report.


def add_config_arguments(p, preset: str, overrides_example: str = "optim.lr=1e-4") -> None:
    """key=value overrides, -c and -o of a recipe run whose default config (and run-directory name) is `preset`."""
    p.epilog_fn = lambda: config_help(preset)
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help=f"config overrides, e.g. {overrides_example}"
    )
    p.add_argument("-c", "--config", help=f"preset or YAML file (default: {preset}; with --resume: the run's)")
    p.add_argument("-o", "--out", help=f"run directory (default: train.out_dir, else runs/{preset}-<time>)")


def command_of(cfg) -> str:
    """The tcsm command that trains a run with this config (a dict or a DictConfig): its recipe's, else train."""
    from tcsm.recipes.spec import recipe_of

    spec = recipe_of(cfg)
    return "tcsm " + " ".join(spec.words) if spec is not None else "tcsm train"


#: the folder of a recipe run that holds the import of the Hugging Face directory it starts from
IMPORT_DIR = "source"


def import_hf_source(args, preset: str) -> Path | None:
    """When `args.checkpoint` (--from) names a Hugging Face diffusion LM directory (DiffusionGemma, a LLaDA-style
    masked model: `builders.hf_source`), import it as it is — the run `tcsm train ... train.steps=0` makes — into
    RUN/source of the recipe's run directory RUN, point `args.checkpoint` there and return RUN; else None. The
    import's data is the directory's tokenizer; the recipe's records or data overrides bring the text. Inside the
    run, the import goes where the run goes: a resume reads it, `--overwrite` imports it again."""
    from tcsm.builders.hf_source import native_family

    if not getattr(args, "checkpoint", None) or native_family(args.checkpoint) is None:
        return None
    from tcsm.builders.config import load_config
    from tcsm.builders.hf_source import import_overrides
    from tcsm.train.fit import fit

    run_dir = Path(args.out) if args.out else default_run_dir(preset)
    claim_run_dir(run_dir, resume=False, overwrite=bool(getattr(args, "overwrite", False)))
    passed = [o for o in args.overrides if o.startswith(("train.device=", "train.threads=", "train.precision="))]
    cfg = load_config(None, [*import_overrides(args.checkpoint, args.overrides), *passed, "train.steps=0",
                             "train.progress=false", "train.tensorboard=false", "sample.num=0"])  # fmt: skip
    source = (run_dir / IMPORT_DIR).resolve()
    print(f"importing {str(args.checkpoint)!r} into {str(source)!r} (the run this one starts from)", flush=True)
    fit(cfg, source, overwrite=source.exists())
    args.checkpoint = str(source)
    return run_dir


def add_source_run_argument(p, help: str, *, required: bool = False) -> None:
    """The run a command starts from or reads: `--from RUN` (aliases `-k`, `--checkpoint`) in every command."""
    p.add_argument("--from", "-k", "--checkpoint", dest="checkpoint", metavar="RUN", required=required, help=help)


def emit_report(args, result: dict, lines: list[str]) -> None:
    """An evaluation's result: written to `args.output` (JSON) when given, printed as one JSON object with `--json`,
    else as its text lines."""
    import json

    from tcsm.evaluation.report import to_jsonable, write_report

    if args.output:
        write_report(args.output, result)
    if args.json:
        print(json.dumps(to_jsonable(result)))
    else:
        print("\n".join(lines))
