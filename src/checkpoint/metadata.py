"""``metadata.json``: what a checkpoint holds, where it came from, and the checksums that vouch for it.

The metadata file is the commit record of a checkpoint: a directory without a valid one is
never loaded. It is plain JSON so that a person (or ``python -m recipes checkpoints``) can read
it without torch.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy
import torch

from checkpoint.errors import CorruptCheckpointError

METADATA_FILE_NAME = "metadata.json"

FORMAT_VERSION = 1

_PROJECT_DISTRIBUTION = "recipes-trainer"


@dataclass(frozen=True)
class FileRecord:
    """The size and SHA-256 of one file of a checkpoint, taken while it was written."""

    size: int
    sha256: str


@dataclass(frozen=True)
class CheckpointMetadata:
    step: int
    score: float | None
    model_only: bool
    world_size: int
    gang_sizes: Mapping[str, int]
    config_hash: str | None
    versions: Mapping[str, str]
    files: Mapping[str, FileRecord]
    extras: Mapping[str, Any] = field(default_factory=dict)
    base_step: int | None = None
    """The step of the earlier checkpoint whose files this one's rank files lie over (deltas of the sparse
    tables): reading it needs that one too, which is kept as long as this one is."""

    @property
    def resumable(self) -> bool:
        """A model-only checkpoint lacks optimizer and trainer state, so training cannot resume from it."""
        return not self.model_only

    @property
    def interrupted(self) -> bool:
        """Saved because the run was stopped (a signal) rather than by the run's schedule: a resume point only."""
        return bool(self.extras.get("interrupted", False))

    @property
    def size_bytes(self) -> int:
        return sum(record.size for record in self.files.values())

    def to_json(self) -> str:
        document = {
            "format_version": FORMAT_VERSION,
            "step": self.step,
            "score": self.score,
            "model_only": self.model_only,
            "resumable": self.resumable,
            "world_size": self.world_size,
            "gang_sizes": dict(self.gang_sizes),
            "config_hash": self.config_hash,
            "versions": dict(self.versions),
            "files": {name: {"size": r.size, "sha256": r.sha256} for name, r in sorted(self.files.items())},
            "extras": dict(self.extras),
            "base_step": self.base_step,
        }
        return json.dumps(document, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str) -> CheckpointMetadata:
        """Parse ``text``, read from ``where``; raise ``CorruptCheckpointError`` if it is not metadata."""
        try:
            document = json.loads(text)
            if document["format_version"] != FORMAT_VERSION:
                raise ValueError(f"format version {document['format_version']} is not {FORMAT_VERSION}")
            score = document["score"]
            return cls(
                step=int(document["step"]),
                score=None if score is None else float(score),
                model_only=bool(document["model_only"]),
                world_size=int(document["world_size"]),
                gang_sizes={str(name): int(size) for name, size in document["gang_sizes"].items()},
                config_hash=document["config_hash"],
                versions={str(name): str(v) for name, v in document["versions"].items()},
                files={
                    str(name): FileRecord(size=int(r["size"]), sha256=str(r["sha256"]))
                    for name, r in document["files"].items()
                },
                extras=dict(document["extras"]),
                base_step=None if document.get("base_step") is None else int(document["base_step"]),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as ex:
            raise CorruptCheckpointError(f"`{where}` must be valid checkpoint metadata, but is not: {ex!r}") from ex


def package_versions() -> dict[str, str]:
    """The versions that decide whether a checkpoint can be read back, recorded to explain failures later."""
    try:
        project_version = version(_PROJECT_DISTRIBUTION)
    except PackageNotFoundError:
        project_version = "unknown"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        _PROJECT_DISTRIBUTION: project_version,
    }
