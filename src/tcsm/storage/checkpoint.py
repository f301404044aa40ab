"""Checkpoints: one directory per save, no pickle, written atomically, verified on load.

Layout of `<run>/checkpoints/step_00001000/`:

    model.safetensors   trained weights          ema.safetensors   EMA weights (if EMA is on)
    state.safetensors   every tensor of the training state (optimizer moments, RNG states, ...)
    state.json          the rest of that state (step, optimizer hyper-parameters, data position, config)
    config.yaml         the run config, for people
    sharded/            (FSDP runs) every rank's shards of weights, EMA and optimizer, written with
                        torch.distributed.checkpoint (`tcsm.train.sharded`); model.safetensors may then be absent,
                        and `read_weights` consolidates the shards
    manifest.json       sha256 and size of every file above; written last

A checkpoint is built in a hidden temporary directory, every file and the directory are fsync'ed, and only
then is it renamed into place; the `latest` pointer file is replaced the same way. A directory without a
manifest or whose files do not match it is never loaded: `resolve_checkpoint` falls back to the newest
complete checkpoint of the run, and names the problem when there is none. What a killed writer leaves behind is
removed by `clean_leftovers` (the trainer calls it when a run starts; every save calls it). A save that cannot be
written (e.g. a full disk) raises a one-line CheckpointError naming the last good checkpoint, which it left intact.

The nested training state (optimizer state dicts with integer keys, tuples, tensors) is stored by `pack`:
tensors go to safetensors under generated names, everything else to JSON with small tags for the types
JSON lacks, and `unpack` inverts it exactly.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from tcsm.core.errors import CheckpointError
from tcsm.storage.fileio import file_digest, fsync_dir, fsync_file
from tcsm.storage.migration import migrate_saved_config

__all__ = [
    "EXPORT_FORMAT",
    "FORMAT",
    "clean_leftovers",
    "consolidate_shards",
    "is_export_dir",
    "list_checkpoints",
    "pack",
    "read_state",
    "read_weights",
    "resolve_checkpoint",
    "save_checkpoint",
    "tokenizer_vocab_size",
    "unpack",
    "validate_checkpoint",
]

FORMAT = "tcsm-checkpoint/1"
#: an exported model directory (`tcsm export`): Hugging Face layout, read by the same functions as a checkpoint
EXPORT_FORMAT = "tcsm-export/1"
PREFIX = "step_"
LATEST = "latest"
MANIFEST = "manifest.json"
SHARDS = "sharded"


# --------------------------------------------------------------------------------------------------- pack


def pack(obj: Any, tensors: dict[str, torch.Tensor], prefix: str = "t") -> Any:
    """A JSON-serialisable mirror of `obj`; its tensors (and numpy arrays) are moved into `tensors`."""
    if isinstance(obj, torch.Tensor):
        name = f"{prefix}.{len(tensors)}"
        tensors[name] = obj.detach().cpu().contiguous().clone()
        return {"__tensor__": name}
    if isinstance(obj, np.ndarray):
        name = f"{prefix}.{len(tensors)}"
        tensors[name] = torch.from_numpy(np.ascontiguousarray(obj).copy())
        return {"__ndarray__": name}
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: pack(v, tensors, prefix) for k, v in obj.items()}
        return {"__items__": [[pack(k, tensors, prefix), pack(v, tensors, prefix)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [pack(v, tensors, prefix) for v in obj]}
    if isinstance(obj, list):
        return [pack(v, tensors, prefix) for v in obj]
    if isinstance(obj, (np.integer, np.floating, np.bool_)):
        return obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return {"__float__": repr(obj)}
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise TypeError(f"cannot store a {type(obj).__name__} in a checkpoint (no pickle): {obj!r}")


def unpack(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of `pack`."""
    if isinstance(obj, dict):
        if "__tensor__" in obj:
            return tensors[obj["__tensor__"]]
        if "__ndarray__" in obj:
            return tensors[obj["__ndarray__"]].numpy()
        if "__items__" in obj:
            return {unpack(k, tensors): unpack(v, tensors) for k, v in obj["__items__"]}
        if "__tuple__" in obj:
            return tuple(unpack(v, tensors) for v in obj["__tuple__"])
        if "__float__" in obj:
            return float(obj["__float__"])
        return {k: unpack(v, tensors) for k, v in obj.items()}
    if isinstance(obj, list):
        return [unpack(v, tensors) for v in obj]
    return obj


# --------------------------------------------------------------------------------------------------- writing


def _state_dict_for_save(module: torch.nn.Module | dict) -> dict[str, torch.Tensor]:
    """A state dict safetensors accepts: contiguous CPU copies, tied weights stored once per name."""
    sd = module if isinstance(module, dict) else module.state_dict()
    return {k: v.detach().cpu().contiguous().clone() for k, v in sd.items()}


def _write_pointer(root: Path, name: str) -> None:
    tmp = root / f".{LATEST}.{uuid.uuid4().hex}"
    tmp.write_text(name + "\n", encoding="utf-8")
    fsync_file(tmp)
    os.replace(tmp, root / LATEST)
    fsync_dir(root)


def save_checkpoint(
    root: str | os.PathLike,
    step: int,
    *,
    model: torch.nn.Module | dict | None,
    ema_model: torch.nn.Module | dict | None = None,
    state: dict | None = None,
    config_yaml: str | None = None,
    keep_last: int = 0,
    staged: Path | None = None,
) -> Path:
    """Write `root/step_{step:08d}` atomically, point `root/latest` at it, keep the `keep_last` newest.

    `state` is any nested structure of dicts, lists, tuples, numbers, strings and tensors (see `pack`). `model` and
    `ema_model` are modules or state dicts; `staged` is a hidden directory under `root` that already holds files
    of this checkpoint written by other processes (sharded weights): it is completed, listed in the manifest and
    renamed like a directory of our own.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    name = f"{PREFIX}{int(step):08d}"
    tmp = staged if staged is not None else root / f".tmp-{name}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(exist_ok=staged is not None)
    try:
        if model is not None:
            save_file(_state_dict_for_save(model), str(tmp / "model.safetensors"), metadata={"format": FORMAT})
        if ema_model is not None:
            save_file(
                _state_dict_for_save(ema_model), str(tmp / "ema.safetensors"), metadata={"format": FORMAT}
            )
        tensors: dict[str, torch.Tensor] = {}
        packed = pack(state or {}, tensors, prefix="state")
        save_file(tensors, str(tmp / "state.safetensors"), metadata={"format": FORMAT})
        (tmp / "state.json").write_text(
            json.dumps({"step": int(step), "state": packed}, indent=1), encoding="utf-8"
        )
        if config_yaml is not None:
            (tmp / "config.yaml").write_text(config_yaml, encoding="utf-8")
        files = {}
        for f in sorted(p for p in tmp.rglob("*") if p.is_file()):
            fsync_file(f)
            files[f.relative_to(tmp).as_posix()] = {"sha256": file_digest(f), "bytes": f.stat().st_size}
        for d in sorted(p for p in tmp.rglob("*") if p.is_dir()):
            fsync_dir(d)
        manifest = {"format": FORMAT, "step": int(step), "files": files}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        fsync_file(tmp / MANIFEST)
        fsync_dir(tmp)
        final = root / name
        if final.exists():  # re-saving a step (e.g. after a resume): move the old one out of the way first
            trash = root / f".old-{name}-{uuid.uuid4().hex[:8]}"
            os.replace(final, trash)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_dir(root)
        _write_pointer(root, name)
    except (OSError, SafetensorError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(_save_failure(root, int(step), e)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if keep_last > 0:
        for old in list_checkpoints(root)[:-keep_last]:
            if old.name != name:
                shutil.rmtree(old, ignore_errors=True)
    clean_leftovers(root)
    return root / name


def _save_failure(root: Path, step: int, e: BaseException) -> str:
    """One line for a save that could not be written: the cause (a full disk said as such) and the checkpoint a
    resume would continue from, which the failed save left intact."""
    text = " ".join(str(e).split())
    full = getattr(e, "errno", None) == errno.ENOSPC or "No space left" in text or "StorageFull" in text
    cause = "the disk is full (no space left on device)" if full else f"{type(e).__name__}: {text}"
    try:
        good = resolve_checkpoint(root)
        last = f"the last good checkpoint is step {read_state(good)[0]} ({good}); free space, then continue it with --resume"
    except CheckpointError:
        last = "no earlier checkpoint was saved; free space and start again"
    return f"cannot save the checkpoint of step {step} in {str(root)!r}: {cause}; {last}"


def clean_leftovers(root: str | os.PathLike) -> None:
    """Remove what writers killed mid-save leave behind in a checkpoints directory: temporary checkpoint directories
    (`.tmp-*`, never loaded: hidden and without a manifest) and `latest` pointers (`.latest.*`). A step moved aside
    to be replaced (`.old-step_*`) is put back if its replacement never arrived, and removed otherwise."""
    root = Path(root)
    if not root.is_dir():
        return
    for junk in root.iterdir():
        if junk.name.startswith(".old-" + PREFIX):
            name = junk.name[len(".old-") :].rsplit("-", 1)[0]
            if not (root / name).exists():
                os.replace(junk, root / name)
                continue
        if junk.name.startswith((".tmp-", ".old-")):
            shutil.rmtree(junk, ignore_errors=True)
        elif junk.name.startswith(f".{LATEST}."):
            junk.unlink(missing_ok=True)


# --------------------------------------------------------------------------------------------------- reading


def validate_checkpoint(directory: str | os.PathLike, verify_hashes: bool = True) -> dict:
    """The manifest of a complete checkpoint; raises CheckpointError if anything is missing or altered."""
    d = Path(directory)
    if not d.is_dir():
        raise CheckpointError(f"checkpoint {str(d)!r} does not exist")
    mpath = d / MANIFEST
    if not mpath.is_file():
        raise CheckpointError(
            f"checkpoint {str(d)!r} is incomplete (no {MANIFEST}; was the writer interrupted?)"
        )
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
        files = manifest["files"]
        if manifest.get("format") not in (FORMAT, EXPORT_FORMAT):
            raise CheckpointError(
                f"checkpoint {str(d)!r} has format {manifest.get('format')!r}, expected {FORMAT!r}"
            )
    except (ValueError, KeyError, TypeError):
        raise CheckpointError(f"checkpoint {str(d)!r} has a corrupt {MANIFEST}") from None
    for fname, meta in files.items():
        f = d / fname
        if not f.is_file():
            raise CheckpointError(f"checkpoint {str(d)!r} is missing {fname}")
        if f.stat().st_size != meta["bytes"] or (verify_hashes and file_digest(f) != meta["sha256"]):
            raise CheckpointError(f"checkpoint {str(d)!r} is corrupt: {fname} does not match its checksum")
    return manifest


def _is_checkpoint_dir(p: Path) -> bool:
    return p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit()


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Checkpoint directories under `root`, oldest first (complete or not)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(
        (p for p in root.iterdir() if _is_checkpoint_dir(p)), key=lambda p: int(p.name[len(PREFIX) :])
    )


def _checkpoints_root(path: Path) -> Path | None:
    """The directory holding step_* directories for a run directory or a checkpoints directory."""
    if (path / "checkpoints").is_dir():
        return path / "checkpoints"
    if (path / LATEST).exists() or list_checkpoints(path):
        return path
    return None


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A complete checkpoint directory from a step directory, a checkpoints directory or a run directory.

    For the latter two: the one `latest` points to, else (if that one is damaged) the newest complete one,
    with a warning naming what was skipped."""
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint {str(p)!r} does not exist")
    if p.is_file():
        raise CheckpointError(
            f"{str(p)!r} is a file; give a checkpoint directory (step_*) or a run directory"
        )
    if (p / MANIFEST).exists() or _is_checkpoint_dir(p) or is_export_dir(p):
        validate_checkpoint(p)
        if is_export_dir(p):
            _read_export(p)  # the model card's tokenizer and config are checked before any weight is used
        return p
    root = _checkpoints_root(p)
    if root is None:
        if (p / "config.json").is_file():
            raise CheckpointError(_not_an_export(p))
        raise CheckpointError(f"no checkpoint found in {str(p)!r}")
    candidates = list(reversed(list_checkpoints(root)))
    try:
        pointed = (root / LATEST).read_text(encoding="utf-8").strip()
    except OSError:
        pointed = ""
    if pointed and (root / pointed).is_dir():
        candidates.remove(root / pointed) if (root / pointed) in candidates else None
        candidates.insert(0, root / pointed)
    problems = []
    for c in candidates:
        try:
            validate_checkpoint(c)
        except CheckpointError as e:
            problems.append(str(e))
            continue
        if problems:
            warnings.warn(
                f"skipped damaged checkpoint(s): {'; '.join(problems)}; using {str(c)!r}", stacklevel=2
            )
        return c
    if problems:
        raise CheckpointError(f"no complete checkpoint in {str(root)!r}: {problems[0]}")
    raise CheckpointError(f"no checkpoint found in {str(p)!r}")


def is_export_dir(directory: str | os.PathLike) -> bool:
    """True if `directory` holds a `tcsm export` (a config.json whose `tcsm.format` is EXPORT_FORMAT)."""
    f = Path(directory) / "config.json"
    try:
        meta = json.loads(f.read_text(encoding="utf-8")) if f.is_file() else None
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and isinstance(meta.get("tcsm"), dict) and meta["tcsm"].get("format") == EXPORT_FORMAT


def _not_an_export(d: Path) -> str:
    try:
        kind = json.loads((d / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        kind = None
    what = f"a Hugging Face {kind!r} model" if kind else "a directory with a config.json"
    return (
        f"{str(d)!r} is {what}, not a tcsm export or run (a tcsm export has config.json with model_type 'tcsm' "
        "and a manifest.json; make one with `tcsm export RUN -o DIR`)"
    )


def tokenizer_vocab_size(directory: str | os.PathLike) -> int | None:
    """Number of regular (non-added) token ids of the Hugging Face `tokenizer.json` in `directory`, or None."""
    f = Path(directory) / "tokenizer.json"
    if not f.is_file():
        return None
    try:
        vocab = json.loads(f.read_text(encoding="utf-8"))["model"]["vocab"]
        ids = vocab.values() if isinstance(vocab, dict) else range(len(vocab))  # Unigram: a list of pieces
        return max(int(i) for i in ids) + 1
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise CheckpointError(f"{str(f)!r} is not a readable Hugging Face tokenizer.json") from None


def _read_export(d: Path) -> tuple[int, dict]:
    """(step, {"config", "data_info"}) of an export directory, after checking its tokenizer fits the weights."""
    try:
        meta = json.loads((d / "config.json").read_text(encoding="utf-8"))["tcsm"]
        step, state = int(meta["step"]), {"config": meta["config"], "data_info": meta["data_info"]}
        V = int(meta["data_info"]["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckpointError(f"export {str(d)!r} has a corrupt config.json (no tcsm section)") from None
    model = state["config"].get("model") if isinstance(state["config"], dict) else None
    base = model.get("name_or_path") if isinstance(model, dict) else None
    if isinstance(base, str) and not Path(base).is_absolute() and (d / base).is_dir():
        model["name_or_path"] = str((d / base).resolve())  # a pretrained model's architecture, carried in the export
    n = tokenizer_vocab_size(d)
    if n is not None and n != V:
        raise CheckpointError(
            f"export {str(d)!r}: its tokenizer.json has {n} tokens but the model was trained on {V}; the tokenizer "
            "does not belong to these weights (export the run again, or restore its own tokenizer.json)"
        )
    return step, state


def read_state(directory: str | os.PathLike) -> tuple[int, dict]:
    """(step, training state) of a validated checkpoint directory (for an export: its config and data only)."""
    d = Path(directory)
    if is_export_dir(d):
        step, state = _read_export(d)
        migrate_saved_config(state["config"])
        return step, state
    try:
        meta = json.loads((d / "state.json").read_text(encoding="utf-8"))
        tensors = load_file(str(d / "state.safetensors"))
        step, state = int(meta["step"]), unpack(meta["state"], tensors)
    except (OSError, ValueError, KeyError, SafetensorError) as e:
        raise CheckpointError(f"checkpoint {str(d)!r} has an unreadable state: {e}") from None
    migrate_saved_config(state.get("config") if isinstance(state, dict) else None)
    return step, state


def read_weights(directory: str | os.PathLike, ema: bool = False, device="cpu") -> dict[str, torch.Tensor]:
    """The model (or EMA) state dict of a checkpoint directory (consolidated from its shards if it has no
    single-file weights)."""
    f = Path(directory) / ("ema.safetensors" if ema else "model.safetensors")
    if not f.is_file() and (Path(directory) / SHARDS).is_dir():
        return consolidate_shards(directory, "ema" if ema else "model", device)
    if not f.is_file():
        raise CheckpointError(
            f"checkpoint {str(directory)!r} has no {'EMA ' if ema else ''}weights ({f.name})"
        )
    try:
        return load_file(str(f), device=str(device))
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"checkpoint {str(directory)!r}: cannot read {f.name}: {e}") from None


def load_weights_into(model: torch.nn.Module, weights: dict[str, torch.Tensor], where: str) -> None:
    """`model.load_state_dict(weights)` with a one-line CheckpointError when the architecture differs."""
    own = model.state_dict()
    missing = sorted(set(own) - set(weights))
    unexpected = sorted(set(weights) - set(own))
    shapes = [k for k in own if k in weights and tuple(own[k].shape) != tuple(weights[k].shape)]
    if missing or unexpected or shapes:
        detail = (
            f"missing {missing[:3]}"
            if missing
            else f"unexpected {unexpected[:3]}"
            if unexpected
            else f"{shapes[0]} is {tuple(weights[shapes[0]].shape)} in the checkpoint, {tuple(own[shapes[0]].shape)} in the model"
        )
        raise CheckpointError(f"checkpoint {where!r} does not match the model architecture: {detail}")
    model.load_state_dict(weights)


def consolidate_shards(directory: str | os.PathLike, which: str = "model", device="cpu") -> dict[str, torch.Tensor]:
    """The whole `which` ("model" or "ema") state dict from a sharded checkpoint's `sharded/` directory, read in
    this process alone whatever the number of processes that wrote it (torch.distributed.checkpoint)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    d = Path(directory)
    out: dict = {}
    try:
        with warnings.catch_warnings():  # DCP's note that it reads in one process: what we ask for
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            # The loader behind dcp.load, which copies its argument: only this one fills a dict with no template
            # (torch.distributed.checkpoint.format_utils reads DCP into one file the same way).
            _load_state_dict(
                out,
                storage_reader=dcp.FileSystemReader(d / SHARDS),
                planner=_EmptyStateDictLoadPlanner(keys={which}),
                no_dist=True,
            )
    except (CheckpointException, OSError, RuntimeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {str(d)!r}: cannot read its sharded {which} weights: {e}") from None
    if which not in out:
        raise CheckpointError(f"checkpoint {str(d)!r} has no {'EMA ' if which == 'ema' else ''}weights")
    return {k: v.to(device) for k, v in out[which].items()}


# --------------------------------------------------------------------------------------------------- public
