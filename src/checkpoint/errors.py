"""Errors a user can cause with checkpoints, and the one failure of the machine that a save reports itself.

A failed write is a ``CheckpointWriteError`` (an ``OSError``, not a ``CheckpointError``): the
CLI reports it as a runtime failure, since no change to the command would fix a full disk.
Other I/O failures are not wrapped and propagate as they are.
"""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint, a checkpoint path or a checkpoint setting is not usable."""


class CheckpointNotFoundError(CheckpointError):
    """No committed checkpoint exists where one was asked for."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's files do not match its metadata: truncated, missing or altered."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file holds objects that a weights-only load refuses, such as code to run."""


class CheckpointWriteError(OSError):
    """Writing a checkpoint failed (a full disk, a failing device): one line naming the path and the free space."""


def describe_failure(error: BaseException | None) -> str | None:
    """A rank's failure as the other ranks are told it: its type and message; None for no failure."""
    return None if error is None else f"{type(error).__name__}: {error}"


def classify_load_failure(error: BaseException | None) -> tuple[str, str | None]:
    """What kind of failure a rank met loading a checkpoint (damage, a user's error, any other), and its message."""
    if error is None:
        return "ok", None
    if isinstance(error, CorruptCheckpointError):
        return "damaged", str(error)
    return ("user" if isinstance(error, CheckpointError) else "failure"), describe_failure(error)
