"""User-facing errors: the CLI prints their message in one line and exits non-zero (CONTRIBUTING.md).

Raise these for mistakes a user can fix (a config key, a data file, a checkpoint, a CLI argument); the
message must say what was wrong and how to fix it. Bugs stay ordinary exceptions with a traceback.
"""

from __future__ import annotations


class TCSMError(Exception):
    """Base of every error the CLI reports as `tcsm <command>: error: <message>`."""


class ConfigError(TCSMError, ValueError):
    """An unknown config key, a value of the wrong type, an unknown component name or preset."""


class CheckpointError(TCSMError, ValueError):
    """A missing, incomplete or corrupt checkpoint, or one that does not match the requested config."""


class TrainingError(TCSMError, RuntimeError):
    """Training cannot go on (e.g. the loss became non-finite); the message says what to change."""
