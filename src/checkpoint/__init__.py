"""Checkpoints: atomic, checksummed saves over fsspec, with keep policies, async writes and sharded state."""

from checkpoint.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    UnsafeCheckpointError,
)
from checkpoint.init_from import load_model_state_for_init
from checkpoint.manager import CheckpointInfo, CheckpointManager, LoadedCheckpoint
from checkpoint.metadata import CheckpointMetadata, FileRecord
from checkpoint.policy import CheckpointPolicy

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointManager",
    "CheckpointMetadata",
    "CheckpointNotFoundError",
    "CheckpointPolicy",
    "CorruptCheckpointError",
    "FileRecord",
    "LoadedCheckpoint",
    "UnsafeCheckpointError",
    "load_model_state_for_init",
]
