"""`tcsm <command>`: one module per subcommand, registered by one line in `COMMANDS`.

A command module defines `HELP` (one line), `add_arguments(parser)` and `run(args) -> int`; it should import
heavy modules (torch, models) inside `run` so that `tcsm --help` stays fast. Errors a user can cause
(`tcsm.core.errors.TCSMError`, `tcsm.data.DataError`, bad files) are printed as one line on stderr with exit status
2; set TCSM_TRACEBACK=1 to see the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Sequence

__all__ = ["COMMANDS", "Parser", "main"]

#: command name → module implementing it
COMMANDS: dict[str, str] = {
    "quickstart": "tcsm.cli.quickstart",
    "train": "tcsm.cli.train",
    "eval": "tcsm.cli.eval",  # the bound, --zeroshot, --genppl
    "sample": "tcsm.cli.sample",
    "finetune": "tcsm.cli.finetune",
    "distill": "tcsm.cli.distill",  # AR teacher → diffusion student (MATH.md §5.4)
    "pairs": "tcsm.cli.pairs",  # preference pairs from a model's own samples, judged by a reward
    "demo": "tcsm.cli.demo",
    "prepare": "tcsm.cli.prepare",  # a corpus → token shards for data.kind=shards
    "export": "tcsm.cli.export",  # a run as a Hugging Face-style directory
}


#: a config override token, `dotted.key=value` (the value may be empty or start with '-')
_OVERRIDE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)*=")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose epilog may be a function, computed only when help is printed."""

    def __init__(self, *args, epilog_fn=None, **kwargs):
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self.epilog_fn = epilog_fn

    def format_help(self) -> str:
        if self.epilog_fn is not None and self.epilog is None:
            self.epilog = self.epilog_fn()
        return super().format_help()

    def error(self, message: str):  # one line, no usage dump: the user asked for --help if they want it
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _user_errors() -> tuple[type[BaseException], ...]:
    from tcsm.core.errors import TCSMError

    errors: list[type[BaseException]] = [TCSMError, OSError]
    try:
        from tcsm.data import DataError

        errors.append(DataError)
    except ImportError:
        pass
    # Models and the math raise ValueError for inputs that cannot work (e.g. a too-long sequence).
    errors.append(ValueError)
    return tuple(errors)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        text = f"{e.strerror}: {e.filename}"
    return text


def _rank_tag() -> str:
    """"[rank r/W] " under torchrun with several processes (each rank reports its own failure), else ""."""
    world = os.environ.get("WORLD_SIZE", "1")
    return f"[rank {os.environ.get('RANK', '0')}/{world}] " if world.isdigit() and int(world) > 1 else ""


#: Under torchrun the launcher prints its own traceback when it is interrupted, after its workers have exited: a
#: detached helper waits for the launcher to exit and then prints rank 0's line, so that the job ends with it.
_AFTER_LAUNCHER = """import sys, time
pid, line, end = int(sys.argv[1]), sys.argv[2], time.time() + 60
def alive():
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
while alive() and time.time() < end:
    time.sleep(0.05)
sys.stderr.write(line + "\\n")
"""


def _resume_hint(argv: list[str], run_dir: str | None) -> str:
    """"; resume with `…`" for a run that has a checkpoint, what to do for one that has none, or ""."""
    if run_dir is None:
        return ""
    import warnings

    from tcsm.core.errors import CheckpointError
    from tcsm.storage.checkpoint import resolve_checkpoint

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            resolve_checkpoint(run_dir)
    except CheckpointError:
        return f"; {run_dir} has no checkpoint yet, so there is nothing to resume: start the run again"
    words = argv[:2] if argv[:1] == ["finetune"] else argv[:1]
    prefix = "tcsm"
    if "LOCAL_WORLD_SIZE" in os.environ:  # under torchrun: the same launch, resumed
        nodes = int(os.environ.get("WORLD_SIZE", "1")) // max(int(os.environ["LOCAL_WORLD_SIZE"]), 1)
        options = "with the same options" if nodes > 1 else f"--nproc_per_node {os.environ['LOCAL_WORLD_SIZE']}"
        prefix = f"torchrun {options} -m tcsm.cli"
    return f"; resume with `{prefix} {' '.join(words)} -o {run_dir} --resume`"


def _preempted(e: BaseException) -> bool:
    preempt = sys.modules.get("tcsm.train.preempt")  # loaded by whatever trained
    return preempt is not None and isinstance(e, preempt.Preempted)


def _say_interrupted(argv: list[str], e: KeyboardInterrupt) -> None:
    """One line for Ctrl-C (or a rank whose launcher died): what happened and how to resume. Under torchrun rank 0
    speaks for the job."""
    if os.environ.get("RANK", "0") != "0":
        return
    gone = getattr(sys.modules.get("tcsm.train.distributed"), "launcher_gone", None)
    what = f"stopped: its launcher (pid {gone}) is gone" if gone else "interrupted"
    if _preempted(e):
        what = "stopped by SIGTERM" + (f" after step {e.step}, saved as a checkpoint" if e.step is not None else "")
    line = f"tcsm {argv[0]}: {what}{_resume_hint(argv, getattr(e, 'run_dir', None))}"
    launcher = os.getppid()
    if "LOCAL_WORLD_SIZE" in os.environ and not gone and os.path.isdir(f"/proc/{launcher}"):
        import subprocess

        try:
            subprocess.Popen(
                [sys.executable, "-c", _AFTER_LAUNCHER, str(launcher), line],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            return
        except OSError:
            pass
    print(line, file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `tcsm` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from tcsm import __version__

    parser = Parser(prog="tcsm", description="Target Concrete Score Matching for discrete diffusion models.")
    parser.add_argument("--version", action="version", version=f"tcsm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", parser_class=Parser)
    # Only the invoked command's module is imported, unless help over all commands is requested.
    wanted = [argv[0]] if argv and argv[0] in COMMANDS else list(COMMANDS)
    for name, module_name in COMMANDS.items():
        if name in wanted:
            module = importlib.import_module(module_name)
            p = sub.add_parser(name, help=module.HELP, description=module.HELP, epilog=getattr(module, "EPILOG", None))
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
        else:
            sub.add_parser(name)
    args, extra = parser.parse_known_args(argv)
    if extra:
        # argparse gives a `key=value ...` positional only the tokens before the first flag; the rest come back
        # unrecognized. Overrides are accepted anywhere after the command (they still apply in the order given).
        if hasattr(args, "overrides") and all(_OVERRIDE.match(token) for token in extra):
            args.overrides = [*(args.overrides or []), *extra]
        else:
            stray = [t for t in extra if not (hasattr(args, "overrides") and _OVERRIDE.match(t))]
            parser.error(f"unrecognized arguments: {' '.join(stray)}")
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt as e:
        _say_interrupted(argv, e)
        return 143 if _preempted(e) else 130
    except _user_errors() as e:
        if os.environ.get("TCSM_TRACEBACK"):
            raise
        print(f"{_rank_tag()}tcsm {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2
