"""Errors a user can cause with checkpoints; I/O failures are not wrapped and propagate as they are."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint, a checkpoint path or a checkpoint setting is not usable."""


class CheckpointNotFoundError(CheckpointError):
    """No committed checkpoint exists where one was asked for."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's files do not match its metadata: truncated, missing or altered."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint file holds objects that a weights-only load refuses, such as code to run."""
