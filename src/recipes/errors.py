"""Errors the user can cause, which the CLI reports in one line with exit code 2."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(ValueError):
    """A mistake in what the user asked for: a bad preset, key, value, path or data."""


class ConfigError(UserError):
    """A config key or value does not fit the recipe's config schema."""


def closest(name: str, candidates: Iterable[str], n: int = 1) -> str:
    """A ' Did you mean ...?' suffix naming the ``n`` closest candidates, or '' when none is close."""
    matches = difflib.get_close_matches(name, list(candidates), n=n, cutoff=0.6)
    if not matches:
        return ""
    return " Did you mean " + " or ".join(f"'{m}'" for m in matches) + "?"


class WriteError(RuntimeError):
    """Writing a file of the run failed (a full disk, a lost mount): a runtime failure that names the file."""

    def __init__(self, path: str, cause: OSError) -> None:
        reason = cause.strerror if cause.strerror else str(cause)
        errno = f"[Errno {cause.errno}] " if cause.errno is not None else ""
        super().__init__(f"Could not write {path}: {errno}{reason}.")


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped training after its checkpoint was committed.

    A KeyboardInterrupt, so that the CLI exits 130 as for any Ctrl-C; unlike a bare one it comes
    after the save, and its message says where the run stopped.
    """
