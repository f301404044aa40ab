"""Run directories are never changed except by the run that owns them: a new run refuses a directory that already
holds one (`refuse_existing_run`, called by the Trainer, so every command that trains inherits it), a directory
that is something else (an export, prepared shards: `refuse_foreign_dir`) is never a run directory, and only an
explicit overwrite removes a run's files (`clear_run`), never anything else in the directory.

One writer at a time: the process that trains a run holds its lock (`hold_run_lock`, the file `.tcsm-run.lock`,
locked with flock so that the kernel frees it when the holder dies, and naming the holder's pid, host and command
for the message a second writer gets). A lock file whose holder is gone (a crash, `kill -9`) is taken over with a
note; a normal exit, a handled error and Ctrl-C remove it."""

from __future__ import annotations

import atexit
import errno
import json
import os
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

from tcsm.core.errors import ConfigError

__all__ = [
    "LOCK_FILE",
    "RUN_FILES",
    "SOURCE_KEYS",
    "RunDirectoryExists",
    "RunDirectoryInUse",
    "clear_run",
    "existing_run",
    "hold_run_dir",
    "hold_run_lock",
    "refuse_existing_run",
    "refuse_foreign_dir",
    "refuse_overwriting_sources",
    "refuse_run_in_use",
    "release_all_run_locks",
    "run_lock_holder",
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
    from tcsm.storage.checkpoint import list_checkpoints

    steps = list_checkpoints(d / "checkpoints")
    return f"checkpoints up to step {int(steps[-1].name.split('_')[1])}" if steps else "no checkpoint yet"


def refuse_existing_run(run_dir: str | Path | None) -> None:
    """Raise RunDirectoryExists (one line naming the ways out) if `run_dir` already holds a run; --resume is
    offered only to a run that has a checkpoint to continue from."""
    what = existing_run(run_dir)
    if what is not None:
        resume = "continue it with --resume, " if what != "no checkpoint yet" else ""
        raise RunDirectoryExists(
            f"run directory {str(run_dir)!r} already holds a run ({what}); {resume}choose a "
            "new directory (-o NEW_DIR), or pass --overwrite to replace it"
        )


def foreign_dir(run_dir: str | Path | None) -> str | None:
    """What `run_dir` holds if it is not a place for a run — "a tcsm export", "prepared token shards" — or None."""
    if run_dir is None:
        return None
    d = Path(run_dir)
    if not d.is_dir():
        return None
    from tcsm.storage.checkpoint import is_export_dir

    if is_export_dir(d):
        return "a tcsm export (tcsm export)"
    index = d / "index.json"
    if index.is_file():
        from tcsm.data.shards import FORMAT

        try:
            is_shards = json.loads(index.read_text(encoding="utf-8")).get("format") == FORMAT
        except (OSError, ValueError, AttributeError):
            is_shards = False
        if is_shards:
            return "prepared token shards (tcsm prepare)"
    return None


def refuse_foreign_dir(run_dir: str | Path | None) -> None:
    """ConfigError (one line) if `run_dir` holds an export or prepared shards: a run directory is a run directory
    (a run written there would hide behind the export for every reader, and --overwrite would not remove it)."""
    what = foreign_dir(run_dir)
    if what is not None:
        raise ConfigError(
            f"{str(run_dir)!r} holds {what}, not a run; write the run to its own directory (-o NEW_DIR)"
        )
    outer = enclosing_run(run_dir)
    if outer is not None:
        raise ConfigError(f"{str(run_dir)!r} is inside the run {str(outer)!r}; a run goes in its own directory, "
                          "not in another run's (-o NEW_DIR)")  # fmt: skip


def enclosing_run(run_dir: str | Path | None) -> Path | None:
    """The run directory (its config.yaml beside its checkpoints/) that holds `run_dir` somewhere below it, or None."""
    if run_dir is None:
        return None
    for parent in Path(run_dir).expanduser().resolve().parents:
        if (parent / "config.yaml").is_file() and (parent / "checkpoints").is_dir():
            return parent
    return None


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


def _kept(out: Path, source: Path) -> bool:
    """`source` lies inside the run `out` but outside its run files, which are all an overwrite deletes (the import
    a recipe run keeps in RUN/source)."""
    return out in source.parents and source.relative_to(out).parts[0] not in RUN_FILES


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
        if any(_overlaps(out, r) and not _kept(out, r) for r in runs):
            raise ConfigError(
                f"--overwrite -o {str(run_dir)!r} would delete {str(source)!r}, the run this one starts from "
                f"({key}, set by {flag}); write the new run to another directory"
            )


# ------------------------------------------------------------------------------------------------------ the lock

#: the lock file of a run directory (hidden: not a run file, never copied by an export)
LOCK_FILE = ".tcsm-run.lock"



class RunDirectoryInUse(ConfigError):
    """Another live process writes this run directory."""


try:
    import fcntl
except ImportError:  # no flock (Windows): the holder's pid says whether it is alive
    fcntl = None


class _Lock:
    def __init__(self, path: Path, fd: int, created_dir: bool):
        self.path, self.fd, self.created_dir, self.count = path, fd, created_dir, 0


_HELD: dict[str, _Lock] = {}
_GUARD = threading.Lock()


def _key(run_dir: Path) -> str:
    return str(run_dir.expanduser().resolve())


def _read_holder(path: Path) -> dict | None:
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and "pid" in info else None


def _describe(info: dict | None) -> str:
    if not info:
        return "another process"
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info.get("started", 0))))
    command = f", `{info['command']}`" if info.get("command") else ""
    return f"pid {info.get('pid')} on host {info.get('host')}{command}, since {since}"


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError, TypeError):
        return True
    return True


def run_lock_holder(run_dir: str | Path | None) -> dict | None:
    """The holder ({pid, host, command, started}) of `run_dir`'s lock when a live process other than this one
    holds it, else None."""
    if run_dir is None:
        return None
    d = Path(run_dir)
    path = d / LOCK_FILE
    if not path.is_file() or _key(d) in _HELD:
        return None
    info = _read_holder(path)
    if fcntl is not None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return info or {}
        finally:
            os.close(fd)
        return None
    return info if info and info.get("host") == socket.gethostname() and _alive(info.get("pid")) else None


def refuse_run_in_use(run_dir: str | Path | None) -> None:
    """RunDirectoryInUse (one line naming the holder) if another live process holds `run_dir`'s lock; a check
    before any work, which takes nothing (the trainer takes the lock)."""
    info = run_lock_holder(run_dir)
    if info is not None:
        raise _in_use(Path(run_dir), info)


def _in_use(d: Path, info: dict | None) -> RunDirectoryInUse:
    pid = info.get("pid") if info else None
    stop = f"stop it (kill {pid})" if pid and info.get("host") == socket.gethostname() else "stop it"
    return RunDirectoryInUse(
        f"run directory {str(d)!r} is being written by another tcsm process ({_describe(info)}); wait for it "
        f"to finish or {stop}, then try again"
    )


class RunLockHold:
    """One hold of a run directory's lock; `release()` is idempotent. The lock file goes when the last hold of
    this process is released (holds nest: the trainer and `fit` both hold it)."""

    def __init__(self, key: str | None):
        self.key = key

    def release(self) -> None:
        key, self.key = self.key, None
        if key is None:
            return
        with _GUARD:
            lock = _HELD.get(key)
            if lock is None:
                return
            lock.count -= 1
            if lock.count > 0:
                return
            del _HELD[key]
        _drop(lock)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def _drop(lock: _Lock) -> None:
    try:
        if os.fstat(lock.fd).st_ino == os.stat(lock.path).st_ino:
            lock.path.unlink()
    except OSError:
        pass
    try:
        os.close(lock.fd)
    except OSError:
        pass
    if lock.created_dir:  # a run that wrote nothing leaves no empty directory behind
        try:
            lock.path.parent.rmdir()
        except OSError:
            pass


def hold_run_lock(run_dir: str | Path | None, *, say=None) -> RunLockHold:
    """Hold the lock of `run_dir` (created if needed) for this process; RunDirectoryInUse (naming the holder) if
    another live process holds it. A lock file left by a holder that is gone is taken over, and `say` (default:
    stderr) is told so. `run_dir=None` holds nothing."""
    if run_dir is None:
        return RunLockHold(None)
    d = Path(run_dir)
    key = _key(d)
    with _GUARD:
        if key in _HELD:
            _HELD[key].count += 1
            return RunLockHold(key)
        created = not d.exists()
        d.mkdir(parents=True, exist_ok=True)
        path = d / LOCK_FILE
        try:
            fd, previous = _acquire(path, d)
        except BaseException:
            if created:
                try:
                    d.rmdir()
                except OSError:
                    pass
            raise
        lock = _Lock(path, fd, created)
        lock.count = 1
        _HELD[key] = lock
    if previous is not None and previous.get("pid") != os.getpid():
        (say or _stderr)(
            f"note: run directory {str(d)!r} was locked by {_describe(previous)}, which is no longer running "
            "(a crash or kill?); taking the lock over"
        )
    return RunLockHold(key)


def _command() -> str:
    """This process's command line as the user typed it: `tcsm train ...` for the console script and for
    `python -m tcsm.cli` (torchrun's ranks too), else the script and its arguments."""
    argv = [str(a) for a in sys.argv]
    if not argv:
        return ""
    head = Path(argv[0])
    if head.name == "tcsm" or head.name == "__main__.py" and head.parent.name in ("cli", "tcsm"):
        argv = ["tcsm", *argv[1:]]
    text = " ".join(argv)
    return text if len(text) <= 200 else text[:199] + "…"


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _acquire(path: Path, d: Path) -> tuple[int, dict | None]:
    """(fd holding the lock, the previous holder's record if a stale one was there)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            flocked = fcntl is not None
            if flocked:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as e:
                    if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                        raise _in_use(d, _read_holder(path)) from None
                    flocked = False  # a file system without locks (ENOLCK): the holder's pid decides
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # the holder removed the file between our open and our lock: lock the new one
                os.close(fd)
                continue
            previous = _read_holder(path)
            here = previous is not None and previous.get("host") == socket.gethostname()
            if not flocked and here and previous.get("pid") != os.getpid() and _alive(previous.get("pid")):
                raise _in_use(d, previous)
            record = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": time.time(),
                "command": _command(),
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)
            return fd, previous
        except BaseException:
            os.close(fd)
            raise


def release_all_run_locks() -> None:
    """Remove every lock this process holds (at exit, and by a rank that stops because its launcher died)."""
    with _GUARD:
        locks = list(_HELD.values())
        _HELD.clear()
    for lock in locks:
        _drop(lock)


atexit.register(release_all_run_locks)


def hold_run_dir(run_dir: str | Path | None, is_main: bool = True) -> RunLockHold:
    """Rank 0's hold of the run directory it trains in (other ranks write nothing there; they get an empty hold):
    refused when the directory is an export or prepared shards (`refuse_foreign_dir`), or while another process
    writes it (`hold_run_lock`)."""
    if not is_main or run_dir is None:
        return RunLockHold(None)
    refuse_foreign_dir(run_dir)
    return hold_run_lock(run_dir)
