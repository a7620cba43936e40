from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
from pathlib import Path

import pytest
import torch

from checkpoint import CheckpointManager, UnsafeCheckpointError
from gang import FakeGang


class CreatesMarkerWhenUnpickled:
    """A payload whose unpickling runs a shell command, as a hostile checkpoint file would."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def test_malicious_pickle_is_refused_and_never_runs(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    marker = tmp_path / "pwned"
    manager = CheckpointManager(str(root), FakeGang())
    manager.save(1, {"model": {"w": torch.ones(2)}})
    buffer = io.BytesIO()
    torch.save({"model": CreatesMarkerWhenUnpickled(marker)}, buffer)
    payload = buffer.getvalue()
    # Make the metadata vouch for the hostile file, so that only the weights-only load stands in the way.
    (root / "step_1" / "shared.pt").write_bytes(payload)
    metadata_path = root / "step_1" / "metadata.json"
    metadata = json.loads(metadata_path.read_text())
    metadata["files"]["shared.pt"] = {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    metadata_path.write_text(json.dumps(metadata))

    with pytest.raises(UnsafeCheckpointError, match=r"shared\.pt.* weights-only load refuses"):
        manager.load(1)
    assert not marker.exists()

    # The payload is real: an unsafe load would have run it.
    torch.load(io.BytesIO(payload), weights_only=False)
    assert marker.exists()
