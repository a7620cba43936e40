from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import threading
import types
from pathlib import Path

import fsspec
import pytest
import torch

from checkpoint import CheckpointManager, CheckpointPolicy, UnsafeCheckpointError
from checkpoint.serialization import _HashingWriter, read_torch_file, write_torch_file
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


def test_the_hashing_writer_is_done_with_each_chunk_when_write_returns() -> None:
    # torch.save hands `write` views of memory it may free as soon as `write` returns: a CUDA
    # storage's temporary CPU copy, the pickle's bytes. Here the caller (the main thread, on CPU)
    # releases each view and overwrites its buffer right after `write`; a writer that still
    # reads it later on its hashing thread records a SHA-256 of other bytes, or of freed memory.
    written = io.BytesIO()
    chunks = [bytearray(os.urandom(n)) for n in (64 << 20, 3 << 20, 100, 2 << 20)]
    expected = hashlib.sha256(b"".join(chunks)).hexdigest()

    with _HashingWriter(written) as writer:
        for chunk in chunks:
            view = memoryview(chunk)
            assert writer.write(view) == len(chunk)
            view.release()  # Raises BufferError if the hashing thread holds the view.
            chunk[:] = bytes(len(chunk))
        digest = writer.finish()

    assert digest == expected
    assert hashlib.sha256(written.getvalue()).hexdigest() == expected


def test_a_pickle_larger_than_a_hash_batch_is_recorded_as_written(tmp_path: Path) -> None:
    # The pickled object tree reaches `write` as one view of a bytes object that torch.save frees
    # when it returns, before the writer's hash is read: the one short-lived buffer a CPU save has.
    fs = fsspec.filesystem("file")
    state = {"positions": list(range(300_000)), "w": torch.arange(4.0)}
    record = write_torch_file(fs, str(tmp_path / "state.pt"), state)

    data = (tmp_path / "state.pt").read_bytes()
    assert (record.size, record.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert read_torch_file(fs, str(tmp_path / "state.pt"), record)["positions"] == state["positions"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (benchmarks/gpu_checks.sh runs it)")
def test_cuda_tensors_are_saved_and_load_on_cpu(tmp_path: Path) -> None:
    # torch.save copies each CUDA storage to a temporary CPU buffer and frees it after `write`.
    manager = CheckpointManager(str(tmp_path / "checkpoints"), FakeGang())
    state = {"w": torch.randn(4096, 1024, device="cuda"), "b": torch.arange(5.0, device="cuda")}
    manager.save(1, {"model": state})
    manager.save(2, {"model": state}, blocking=False)
    manager.wait()

    for step in (1, 2):
        loaded = manager.load(step).shared_state["model"]
        assert all(torch.equal(loaded[key], value.cpu()) for key, value in state.items())


@pytest.mark.parametrize("per_thread", [True, False], ids=["option per thread", "option per process"])
def test_files_written_on_several_threads_at_once_leave_the_crc32_option_as_it_was(
    per_thread: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two writers on two threads, the second in before the first is out: the option ends as it
    began, whether torch keeps it per thread (2.13) or for the process (2.11, where each writer
    restoring what it had read itself left it off)."""
    from checkpoint import serialization

    options = threading.local() if per_thread else types.SimpleNamespace()
    monkeypatch.setattr(torch.serialization, "get_crc32_options", lambda: getattr(options, "crc32", True))
    monkeypatch.setattr(torch.serialization, "set_crc32_options", lambda value: setattr(options, "crc32", value))
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, tuple[bool, bool]] = {}

    def write(name: str, wait_in: threading.Event | None, now_in: threading.Event, wait_out: threading.Event) -> None:
        if wait_in is not None:
            wait_in.wait()
        with serialization._zip_crc32_disabled():
            inside = torch.serialization.get_crc32_options()
            now_in.set()
            wait_out.wait()
        seen[name] = (inside, torch.serialization.get_crc32_options())

    serialization._crc32_option_is_per_thread.cache_clear()  # asked again, of the stand-in option
    try:
        first = threading.Thread(target=write, args=("first", None, first_in, second_in))
        second = threading.Thread(target=write, args=("second", first_in, second_in, first_out))
        first.start()
        second.start()
        first.join()
        first_out.set()
        second.join()
    finally:
        serialization._crc32_option_is_per_thread.cache_clear()

    # Per process, the first writer out leaves the option off: the second still writes.
    assert seen == {"first": (False, per_thread), "second": (False, True)}
    assert torch.serialization.get_crc32_options()
