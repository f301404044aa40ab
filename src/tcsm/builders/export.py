"""Models that leave tcsm: `export(run, out_dir)` writes a trained run as a Hugging Face-style directory, and
`from_pretrained(out_dir)` reads it back (no `transformers` needed).

The directory (`tcsm.storage.checkpoint.EXPORT_FORMAT`):

    config.json              model_type "tcsm", auto_map for trust_remote_code, the architecture, the sampler
                             defaults (`sampling`) and, under `tcsm`, the run's config, data and step
    model.safetensors        the run's weights (EMA ones when it kept them), tcsm's parameter names
    modeling_tcsm.py         self-contained modeling code (torch + transformers, no tcsm import), with
    configuration_tcsm.py    AutoModelForMaskedLM (denoisers) and AutoModel (energy models) in `auto_map`
    tokenizer.json           the run's tokenizer (its BPE file, or the character vocabulary as a tokenizers file)
    sampling_config.json     the run's `sample:` settings (what `tcsm sample DIR` uses by default)
    README.md                a model card with the run's measured figures (summary.json)
    manifest.json            sha256 of config.json and model.safetensors; written last

Everything that reads checkpoints (`load_checkpoint`, `train.init_from`, frozen references, `tcsm sample`,
`tcsm eval`) reads an export directory too, through `tcsm.storage.checkpoint`. It is built in a hidden temporary
directory and renamed into place; an existing directory is replaced only if it holds an export, and then only
the files that export wrote (the manifest's `written`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError

from tcsm.builders.export_tokenizer import char_tokenizer_json
from tcsm.builders.exporters import BASE_MODEL, CODE_FILES, exporter_of, model_card
from tcsm.builders.loading import load_checkpoint
from tcsm.builders.lora import lora_choice, write_adapter
from tcsm.core.errors import CheckpointError, ConfigError
from tcsm.models.lora import merge as merge_adapters
from tcsm.storage.checkpoint import EXPORT_FORMAT, MANIFEST, is_export_dir
from tcsm.storage.fileio import file_digest, fsync_dir, fsync_file

__all__ = ["char_tokenizer_json", "export", "from_pretrained"]


def from_pretrained(directory: str | os.PathLike, device: str | torch.device = "cpu") -> torch.nn.Module:
    """The model of an export directory (or of any run / checkpoint directory), in eval mode."""
    return load_checkpoint(directory, device=device).model


def _run_dir(directory: Path) -> Path | None:
    return directory.parent.parent if directory.parent.name == "checkpoints" else None


#: what exports wrote before their manifest listed every file (`written`): an older export's own files
_OLD_EXPORT_FILES = (
    "config.json", "model.safetensors", MANIFEST, *CODE_FILES, "tokenizer.json", "tokenizer_config.json",
    "sampling_config.json", "README.md", BASE_MODEL,
)  # fmt: skip


def _export_files(out: Path) -> set[str]:
    """The top-level names the export in `out` wrote (its manifest's `written`, else the older exports' set)."""
    try:
        written = json.loads((out / MANIFEST).read_text(encoding="utf-8")).get("written")
    except (OSError, ValueError, AttributeError):
        written = None
    if not isinstance(written, list):
        written = _OLD_EXPORT_FILES
    return {str(name).split("/")[0] for name in written} | {MANIFEST}


def _listing(names) -> str:
    names = sorted(names)
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _prepare_target(out: Path, overwrite: bool, keep_others: bool = False) -> list[str]:
    """Refuse a target that is not new, empty or an earlier export to replace; returns the entries of `out` that
    its earlier export did not write (kept in place: only with `keep_others`)."""
    if not out.exists():
        return []
    if not out.is_dir():
        raise CheckpointError(f"export target {str(out)!r} is a file; choose a directory")
    entries = {p.name for p in out.iterdir()}
    if entries and not is_export_dir(out):
        from tcsm.storage.checkpoint import list_checkpoints

        run = (out / "checkpoints").is_dir() or (out / "config.yaml").is_file() or list_checkpoints(out)
        what = "holds a training run" if run else "exists and does not hold a tcsm export"
        raise CheckpointError(f"export target {str(out)!r} {what}; choose a new or empty directory")
    if entries and not overwrite:
        raise CheckpointError(f"export target {str(out)!r} already holds an export; pass --overwrite to replace it")
    others = sorted(entries - _export_files(out))
    if others and not keep_others:
        raise CheckpointError(
            f"export target {str(out)!r} holds files the earlier export did not write ({_listing(others)}); "
            "--overwrite replaces only an export's own files: move those away, or add --keep-other-files to "
            "replace the export and leave them in place"
        )
    return others


def _write_failure(out: Path, e: BaseException) -> str:
    text = " ".join(str(e).split())
    full = getattr(e, "errno", None) == errno.ENOSPC or "No space left" in text or "StorageFull" in text
    cause = "the disk is full (no space left on device)" if full else f"{type(e).__name__}: {text}"
    kept = "the earlier export there is unchanged" if is_export_dir(out) else "nothing was written"
    return f"cannot write the export to {str(out)!r}: {cause}; {kept}" + ("; free space and export again" if full else "")


def _swap_in(tmp: Path, out: Path, others: list[str]) -> None:
    """Replace the export in `out` by the one built in `tmp`. Without other files the directories are swapped
    whole; with them (--keep-other-files), the old export's entries move out and the new ones in, manifest last."""
    if not out.exists():
        os.replace(tmp, out)
        return
    trash = out.parent / f".old-export-{out.name}-{uuid.uuid4().hex[:8]}"
    if not others:
        os.replace(out, trash)
        os.replace(tmp, out)
        shutil.rmtree(trash, ignore_errors=True)
        return
    trash.mkdir()
    old = sorted({p.name for p in out.iterdir()} - set(others), key=lambda n: n != MANIFEST)  # manifest first
    new = sorted((p.name for p in tmp.iterdir()), key=lambda n: n == MANIFEST)  # manifest last
    moved_out, moved_in = [], []
    try:
        for name in old:
            os.replace(out / name, trash / name)
            moved_out.append(name)
        for name in new:
            os.replace(tmp / name, out / name)
            moved_in.append(name)
    except BaseException:  # put the old export back as it was
        for name in reversed(moved_in):
            os.replace(out / name, tmp / name)
        for name in reversed(moved_out):
            os.replace(trash / name, out / name)
        shutil.rmtree(trash, ignore_errors=True)
        raise
    shutil.rmtree(trash, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)


def export(
    run: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    ema: bool = True,
    overwrite: bool = False,
    keep_other_files: bool = False,
    log: Callable[[str], None] | None = None,
    lora_merge: bool | None = None,
    overrides=(),
) -> Path:
    """Write the model of `run` (a run, checkpoints, step or export directory) to `out_dir` (see the module
    docstring); returns `out_dir`. Refuses a non-empty `out_dir` that is not an export, and an existing export
    unless `overwrite`; an overwrite replaces only the files the earlier export wrote (its manifest's `written`),
    and refuses a directory holding others unless `keep_other_files`, which leaves them in place. What a user must
    know about the result (e.g. that transformers cannot load it) goes to `log`, one line each (default: stderr).
    A LoRA run: `lora_merge` (else its `train.lora.merge`) True writes the weights with the adapters folded in (a
    plain export), False a PEFT adapter directory (into a new or empty `out_dir`). `overrides` (key=value) are
    `load_checkpoint`'s (a Hugging Face directory with its own code: model.trust_remote_code=true)."""
    out = Path(out_dir)
    ck = load_checkpoint(run, device="cpu", ema=ema, overrides=list(overrides))
    merge = lora_choice(ck.config, ck.model, lora_merge)
    if merge is False:
        return _export_adapter(ck, out, log, overwrite)
    if merge:
        try:
            merge_adapters(ck.model)
        except ValueError as e:
            raise ConfigError(f"cannot export {str(run)!r} merged: {e}") from None
    others = _prepare_target(out, overwrite, keep_other_files)
    model = ck.model
    exporter = exporter_of(model)  # the family's config, files, card lines and notes
    hf = exporter.config(ck, model)
    if merge:  # the export is a plain model: tcsm reads it back without adapters
        hf["tcsm"]["config"]["train"]["lora"].update(r=0, target_modules=None)
    run_dir = _run_dir(ck.directory)
    summary = None
    for where in (run_dir, ck.directory):
        if where is not None and (where / "summary.json").is_file():
            summary = json.loads((where / "summary.json").read_text(encoding="utf-8"))
            break
    with _built_aside(out) as tmp:
        notes = exporter.write(tmp, ck, model, hf, run_dir)
        (tmp / "sampling_config.json").write_text(json.dumps(hf["sampling"], indent=1) + "\n", encoding="utf-8")
        notes += exporter.notes(hf)
        n_params = sum(p.numel() for p in model.parameters())
        card = model_card(ck, hf, summary, n_params, ck.directory, exporter.card_lines(hf))
        (tmp / "README.md").write_text(card, encoding="utf-8")
        files = {}
        for name in ("config.json", "model.safetensors"):
            fsync_file(tmp / name)
            files[name] = {"sha256": file_digest(tmp / name), "bytes": (tmp / name).stat().st_size}
        # `written`: every file of the export, so that a later --overwrite replaces these and nothing else.
        written = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file()) + [MANIFEST]
        manifest = {"format": EXPORT_FORMAT, "step": int(ck.step), "files": files, "written": written}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        fsync_file(tmp / MANIFEST)
        fsync_dir(tmp)
        _swap_in(tmp, out, others)
        fsync_dir(out.parent)
    _say_notes(notes, log)
    return out


@contextlib.contextmanager
def _built_aside(out: Path):
    """A hidden temporary directory beside `out` to build the export in, removed on any failure; a failure to write
    (e.g. a full disk) is one CheckpointError line, and whatever `out` held is untouched."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-export-{out.name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except (OSError, SafetensorError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(_write_failure(out, e)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _say_notes(notes: list[str], log) -> None:
    """The export's notes, one line each, to `log` (default: stderr)."""
    say = log if log is not None else (lambda line: print(line, file=sys.stderr))
    for note in notes:
        say(f"tcsm export: note: {note}")


#: what `write_adapter` writes: a directory of these alone is an earlier adapter export that --overwrite replaces
_ADAPTER_FILES = {"adapter_config.json", "adapter_model.safetensors", "README.md"}


def _export_adapter(ck, out: Path, log, overwrite: bool = False) -> Path:
    """A LoRA run's adapters as PEFT's adapter directory, written whole or not at all into a new or empty `out`, or
    over an earlier adapter export with `overwrite`."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        entries = {p.name for p in out.iterdir()} if out.is_dir() else set()
        if not ("adapter_config.json" in entries and entries <= _ADAPTER_FILES):
            raise CheckpointError(f"a LoRA adapter is exported into a new or empty directory, or over an earlier "
                                  f"adapter export; {str(out)!r} is neither")  # fmt: skip
        if not overwrite:
            raise CheckpointError(f"export target {str(out)!r} already holds a LoRA adapter export; pass --overwrite "
                                  "to replace it")  # fmt: skip
    with _built_aside(out) as tmp:
        notes = write_adapter(tmp, ck.model, ck.config)
        fsync_dir(tmp)
        if out.exists():
            trash = out.parent / f".old-export-{out.name}-{uuid.uuid4().hex[:8]}"
            os.replace(out, trash)
            os.replace(tmp, out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, out)
    _say_notes(notes, log)
    return out
