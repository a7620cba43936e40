from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
from pathlib import Path

import fsspec
import pytest
import torch

from checkpoint import CheckpointManager, CheckpointPolicy, UnsafeCheckpointError
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
    (root / "step_1" / "model.pt").write_bytes(payload)
    metadata_path = root / "step_1" / "metadata.json"
    metadata = json.loads(metadata_path.read_text())
    metadata["files"]["model.pt"] = {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
    metadata_path.write_text(json.dumps(metadata))

    with pytest.raises(UnsafeCheckpointError, match=r"model\.pt.* weights-only load refuses"):
        manager.load(1)
    assert not marker.exists()

    # The payload is real: an unsafe load would have run it.
    torch.load(io.BytesIO(payload), weights_only=False)
    assert marker.exists()


def test_recorded_sha256_is_that_of_the_bytes_on_disk(root: str) -> None:
    manager = CheckpointManager(root, FakeGang())
    manager.save(1, {"model": {"w": torch.randn(512, 1024)}}, {"position": 3})

    fs, path = fsspec.core.url_to_fs(root)
    for name, record in manager.load(1).metadata.files.items():
        data = fs.cat_file(f"{path}/step_1/{name}")
        assert (len(data), hashlib.sha256(data).hexdigest()) == (record.size, record.sha256)


def test_saving_restores_the_torch_settings_it_changes(root: str) -> None:
    manager = CheckpointManager(root, FakeGang())

    manager.save(1, {"w": torch.ones(3)})
    assert torch.serialization.get_crc32_options()
    manager.save(2, {"w": torch.ones(3)}, blocking=False)
    manager.wait()

    assert torch.serialization.get_crc32_options()


def test_a_loaded_state_owns_its_memory(tmp_path: Path) -> None:
    # Loaded tensors own their memory: changing them or pruning their file affects neither the other.
    manager = CheckpointManager(str(tmp_path / "checkpoints"), FakeGang(), CheckpointPolicy(keep_last_n=1))
    manager.save(1, {"w": torch.arange(6.0)})
    weights = manager.load(1).shared_state["w"]
    weights.add_(10.0)

    assert torch.equal(manager.load(1).shared_state["w"], torch.arange(6.0))  # The file still matches.
    manager.save(2, {"w": torch.zeros(6)})
    assert not (tmp_path / "checkpoints" / "step_1").exists()
    assert torch.equal(weights, torch.arange(6.0) + 10.0)
