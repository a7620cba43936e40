"""Checkpoints: atomic, checksummed saves over fsspec, with keep policies, async writes and sharded state."""

from checkpoint.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointWriteError,
    CorruptCheckpointError,
    UnsafeCheckpointError,
)
from checkpoint.init_from import load_model_state_for_init
from checkpoint.loaded import CheckpointInfo, LoadedCheckpoint
from checkpoint.manager import CheckpointManager
from checkpoint.metadata import CheckpointMetadata, FileRecord
from checkpoint.policy import CheckpointPolicy

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointMetadata",
    "CheckpointNotFoundError",
    "CheckpointPolicy",
    "CheckpointWriteError",
    "CorruptCheckpointError",
    "FileRecord",
    "LoadedCheckpoint",
    "UnsafeCheckpointError",
    "load_model_state_for_init",
]
