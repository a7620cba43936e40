from __future__ import annotations

import errno
import json
import logging
import re
import threading
from pathlib import Path
from typing import Any

import fsspec
import pytest
import torch

from checkpoint import (
    CheckpointError,
    CheckpointManager,
    CheckpointNotFoundError,
    CheckpointPolicy,
    CheckpointWriteError,
    CorruptCheckpointError,
)
from checkpoint.store import READ_LOCK_FILE_NAME, CheckpointStore
from gang import FakeGang


def make_state(seed: int) -> dict[str, object]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "model": {"embed.weight": torch.randn(8, 4, generator=generator), "head.bias": torch.zeros(3)},
        "optimizer": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(8, 4, generator=generator)}},
            "param_groups": [{"lr": 0.1, "params": [0, 1], "betas": (0.9, 0.999)}],
        },
        "trainer": {"step_nr": seed, "data_epoch": 2, "name": "run", "done": False},
        "dtype": torch.bfloat16,
        "ints": torch.arange(5, dtype=torch.int64),
    }


def assert_equal(actual: object, expected: object) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor)
        assert actual.dtype == expected.dtype and torch.equal(actual, expected)
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys()
        for key in expected:
            assert_equal(actual[key], expected[key])
    elif isinstance(expected, list | tuple):
        assert type(actual) is type(expected) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_equal(a, e)
    else:
        assert actual == expected


def test_round_trip_is_exact_and_metadata_complete(root: str) -> None:
    manager = CheckpointManager(root, FakeGang(), gang_sizes={"dp": 1, "tp": 1}, config_hash="abc123")
    shared, rank = make_state(7), {"reader": {"position": 42}, "rng": torch.get_rng_state()}
    manager.save(7, shared, rank, score=0.25, extras={"data_epoch": 2})

    loaded = manager.load(7)

    assert_equal(loaded.shared_state, shared)
    assert loaded.num_ranks == 1
    assert_equal(loaded.load_rank_state(0), rank)
    metadata = loaded.metadata
    assert (metadata.step, metadata.score, metadata.world_size) == (7, 0.25, 1)
    assert metadata.gang_sizes == {"dp": 1, "tp": 1} and metadata.config_hash == "abc123"
    assert set(metadata.versions) == {"python", "torch", "numpy", "recipes-trainer"}
    assert set(metadata.files) == {"model.pt", "optimizer.pt", "trainer.pt", "dtype.pt", "ints.pt", "rank_0.pt"}
    assert metadata.extras == {"data_epoch": 2} and metadata.resumable
    fs, path = fsspec.core.url_to_fs(root)
    document = json.loads(fs.cat_file(f"{path}/step_7/metadata.json"))
    assert document["resumable"] is True
    assert document["files"]["model.pt"]["size"] == fs.size(f"{path}/step_7/model.pt")
    assert sorted(fs.ls(path, detail=False)) == [f"{path}/step_7"]


def test_model_only_is_never_chosen_for_resume(root: str) -> None:
    manager = CheckpointManager(root, FakeGang())
    manager.save(10, make_state(10))
    manager.save(20, {"model": make_state(20)["model"]}, model_only=True)

    assert manager.last_resumable_step() == 10
    assert not manager.load(20).metadata.resumable
    assert [(info.step, info.resumable) for info in manager.list_checkpoints()] == [(10, True), (20, False)]


def test_save_of_an_existing_step_replaces_it(root: str) -> None:
    manager = CheckpointManager(root, FakeGang())
    manager.save(5, {"value": torch.tensor(1)})
    manager.save(5, {"value": torch.tensor(2)})

    assert manager.load(5).shared_state["value"].item() == 2
    assert [info.step for info in manager.list_checkpoints()] == [5]


def test_load_of_a_missing_step_names_the_committed_ones(root: str) -> None:
    manager = CheckpointManager(root, FakeGang())
    manager.save(3, {"value": torch.tensor(1)})

    with pytest.raises(CheckpointNotFoundError, match=r"committed checkpoints .* \(\[3\]\), but is 4"):
        manager.load(4)
    assert CheckpointManager(root + "/nothing", FakeGang()).last_resumable_step() is None


def test_corrupted_file_is_refused_naming_it(root: str) -> None:
    manager = CheckpointManager(root, FakeGang())
    manager.save(1, make_state(1))
    fs, path = fsspec.core.url_to_fs(root)
    file_path = f"{path}/step_1/model.pt"
    data = bytearray(fs.cat_file(file_path))
    data[len(data) // 2] ^= 0xFF  # Same size, so only the checksum can tell.
    fs.pipe_file(file_path, bytes(data))

    with pytest.raises(CorruptCheckpointError, match=r"model\.pt.* SHA-256"):
        manager.load(1)


DAMAGES = ["truncate_file", "delete_rank_file", "delete_metadata", "garble_metadata", "flip_byte"]


def damage_checkpoint(fs: Any, step_dir: str, damage: str) -> None:
    """Do to ``step_dir`` what a failing disk, a person or a killed copy would."""
    if damage == "truncate_file":
        fs.pipe_file(f"{step_dir}/model.pt", fs.cat_file(f"{step_dir}/model.pt")[:100])
    elif damage == "delete_rank_file":
        fs.rm(f"{step_dir}/rank_0.pt")
    elif damage == "delete_metadata":
        fs.rm(f"{step_dir}/metadata.json")
    elif damage == "garble_metadata":
        fs.pipe_file(f"{step_dir}/metadata.json", b"{not json")
    else:
        data = bytearray(fs.cat_file(f"{step_dir}/model.pt"))
        data[len(data) // 2] ^= 0xFF  # Same size: only the checksum can tell.
        fs.pipe_file(f"{step_dir}/model.pt", bytes(data))


def file_contents(fs: Any, directory: str) -> dict[str, bytes]:
    return {path.rsplit("/", 1)[-1]: fs.cat_file(path) for path in fs.find(directory)}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_checkpoint_is_moved_aside_with_its_files_and_the_previous_one_resumed(
    root: str, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    manager = CheckpointManager(root, FakeGang())
    manager.save(1, make_state(1), {"position": 1})
    manager.save(2, make_state(2), {"position": 2})
    fs, path = fsspec.core.url_to_fs(root)
    step_dir = f"{path}/step_2"
    damage_checkpoint(fs, step_dir, damage)
    damaged_files = file_contents(fs, step_dir)

    with caplog.at_level(logging.WARNING, logger="checkpoint"):
        restarted = CheckpointManager(root, FakeGang())
        loaded = restarted.load_newest_intact()

    assert loaded is not None and loaded.step == 1
    assert_equal(loaded.shared_state, make_state(1))
    assert loaded.load_rank_state(0) == {"position": 1}
    assert not fs.exists(step_dir)
    moved = file_contents(fs, f"{step_dir}.damaged")
    note = moved.pop("why_damaged.txt").decode().strip()
    assert moved == damaged_files  # Every file left as it was found: nothing deleted, nothing rewritten.
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "step_2" in warnings[0] and "step_2.damaged" in warnings[0], warnings
    assert note in warnings[0]
    (info,) = restarted.list_damaged()
    assert (info.step, info.path, info.damage, info.resumable) == (2, f"{step_dir}.damaged", note, False)
    assert [i.step for i in restarted.list_checkpoints()] == [1]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("truncate_file", r"model\.pt is 100 bytes instead of \d+"),
        ("delete_rank_file", r"rank_0\.pt is missing"),
        ("delete_metadata", r"it has no metadata\.json"),
        ("garble_metadata", r"metadata\.json` must be valid checkpoint metadata"),
        ("flip_byte", r"model\.pt` does not match the SHA-256"),
    ],
)
def test_the_warning_says_why_the_checkpoint_is_damaged(
    root: str, damage: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    manager = CheckpointManager(root, FakeGang())
    manager.save(1, make_state(1))
    fs, path = fsspec.core.url_to_fs(root)
    damage_checkpoint(fs, f"{path}/step_1", damage)

    with caplog.at_level(logging.WARNING, logger="checkpoint"):
        assert CheckpointManager(root, FakeGang()).load_newest_intact() is None

    assert re.search(
        r"Moved the damaged checkpoint \S+/step_1 aside to step_1\.damaged \(kept, never deleted\): ", caplog.text
    )
    assert re.search(reason, caplog.text), caplog.text


def test_a_checkpoint_damaged_again_is_moved_aside_under_a_new_name(root: str) -> None:
    fs, path = fsspec.core.url_to_fs(root)
    for attempt in range(3):
        manager = CheckpointManager(root, FakeGang())
        manager.save(4, {"value": torch.tensor(attempt)})
        damage_checkpoint(fs, f"{path}/step_4", "delete_metadata")
        CheckpointManager(root, FakeGang())

    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)) == [
        "step_4.damaged",
        "step_4.damaged-2",
        "step_4.damaged-3",
    ]
    assert sorted(info.path.rsplit("/", 1)[-1] for info in CheckpointManager(root, FakeGang()).list_damaged()) == [
        "step_4.damaged",
        "step_4.damaged-2",
        "step_4.damaged-3",
    ]


def test_a_reader_lists_a_damaged_checkpoint_without_moving_it(root: str) -> None:
    CheckpointManager(root, FakeGang()).save(1, make_state(1))
    fs, path = fsspec.core.url_to_fs(root)
    damage_checkpoint(fs, f"{path}/step_1", "truncate_file")

    (info,) = CheckpointManager(root, FakeGang(), clean_up=False).list_damaged()

    assert (info.step, info.path) == (1, f"{path}/step_1")
    assert info.damage is not None and "model.pt is 100 bytes" in info.damage
    assert fs.exists(f"{path}/step_1/model.pt")


def test_keep_policies_count_only_intact_checkpoints_and_touch_nothing_the_run_did_not_write(root: str) -> None:
    fs, path = fsspec.core.url_to_fs(root)
    manager = CheckpointManager(root, FakeGang(), CheckpointPolicy(keep_last_n=1))
    manager.save(10, make_state(10))
    theirs = {
        f"{path}/notes/todo.txt": b"a user's notes",
        f"{path}/step_5.damaged/model.pt": b"moved aside by an earlier run",
        f"{path}/step_7x/model.pt": b"not a checkpoint name",
        f"{path}/README": b"a user's file",
    }
    for file_path, data in theirs.items():
        fs.makedirs(file_path.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(file_path, data)
    # A newer checkpoint that turns out damaged does not count as the newest: step 10 stays.
    fs.makedirs(f"{path}/step_30", exist_ok=True)
    fs.pipe_file(f"{path}/step_30/model.pt", b"no metadata")
    restarted = CheckpointManager(root, FakeGang(), CheckpointPolicy(keep_last_n=1))
    assert [(info.step, info.kept_by) for info in restarted.list_checkpoints()] == [
        (10, ("keep_last_n", "newest", "newest_resumable"))
    ]

    for step in (20, 40):
        restarted.save(step, make_state(step))

    assert [info.step for info in restarted.list_checkpoints()] == [40]
    for file_path, data in theirs.items():
        assert fs.cat_file(file_path) == data
    assert fs.cat_file(f"{path}/step_30.damaged/model.pt") == b"no metadata"


@pytest.mark.parametrize("cut_short", ["removal", "commit_without_atomic_rename"])
def test_the_managers_own_unfinished_work_is_cleaned_not_taken_for_damage(
    root: str, cut_short: str, caplog: pytest.LogCaptureFixture
) -> None:
    manager = CheckpointManager(root, FakeGang())
    manager.save(1, make_state(1))
    manager.save(2, make_state(2))
    fs, path = fsspec.core.url_to_fs(root)
    if cut_short == "removal":
        CheckpointStore(root).begin_removal(f"{path}/step_1")  # Killed before the rest was deleted.
    else:  # Killed while the files were moved into step_3/, before its metadata: what an object store sees.
        fs.makedirs(f"{path}/step_3", exist_ok=True)
        fs.pipe_file(f"{path}/step_3/.unfinished", b"")
        fs.pipe_file(f"{path}/step_3/model.pt", b"moved in")

    with caplog.at_level(logging.WARNING, logger="checkpoint"):
        restarted = CheckpointManager(root, FakeGang())

    expected = ["step_2"] if cut_short == "removal" else ["step_1", "step_2"]
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(path, detail=False)) == expected
    assert "cut short" in caplog.text and "damaged" not in caplog.text
    assert restarted.list_damaged() == []


def test_a_replaced_checkpoint_whose_replacement_never_arrived_is_restored(tmp_path: Path) -> None:
    root = str(tmp_path / "checkpoints")
    CheckpointManager(root, FakeGang()).save(5, make_state(5))
    # A save of step 5 again, killed between renaming the old step_5 away and renaming the new one in.
    (tmp_path / "checkpoints" / "step_5").rename(tmp_path / "checkpoints" / "step_5.old-0123abcd")
    (tmp_path / "checkpoints" / "step_5.tmp-0123abcd").mkdir()

    restarted = CheckpointManager(root, FakeGang())

    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_5"]
    assert_equal(restarted.load(5).shared_state, make_state(5))


def test_unfinished_save_directory_is_cleaned_at_startup(root: str, caplog: pytest.LogCaptureFixture) -> None:
    fs, path = fsspec.core.url_to_fs(root)
    fs.makedirs(f"{path}/step_9.tmp-0123abcd", exist_ok=True)
    fs.pipe_file(f"{path}/step_9.tmp-0123abcd/model.pt", b"partial")
    fs.pipe_file(f"{path}/notes.txt", b"a user's file")

    with caplog.at_level(logging.WARNING, logger="checkpoint.store"):
        manager = CheckpointManager(root, FakeGang())

    assert manager.list_checkpoints() == []
    assert not fs.exists(f"{path}/step_9.tmp-0123abcd")
    assert fs.exists(f"{path}/notes.txt")
    assert "an unfinished save" in caplog.text


def test_async_save_commits_the_same_files_as_a_sync_save(root: str) -> None:
    manager = CheckpointManager(root, FakeGang())
    state = make_state(4)
    manager.save(1, state, {"position": 1})
    manager.save(2, state, {"position": 1}, blocking=False)
    # The copy is taken at save time: changing the live tensors afterwards must not leak in.
    state["model"]["embed.weight"].add_(1.0)  # type: ignore[index]
    manager.wait()

    sync, async_ = manager.load(1), manager.load(2)
    assert_equal(async_.shared_state, sync.shared_state)
    assert async_.metadata.files == sync.metadata.files
    fs, path = fsspec.core.url_to_fs(root)
    read_lock = [] if root.startswith("memory://") else [READ_LOCK_FILE_NAME]  # Readers lock it on local disk.
    assert sorted(fs.ls(f"{path}/step_2", detail=False)) == sorted(
        f"{path}/step_2/{name}" for name in ("metadata.json", *sync.metadata.files, *read_lock)
    )


def test_async_failure_surfaces_at_the_next_call(root: str) -> None:
    manager = CheckpointManager(root, FakeGang())
    fs, _ = fsspec.core.url_to_fs(root)
    original_open = fs.open

    def failing_open(file_path: str, mode: str = "rb", **kwargs: object) -> object:
        if mode == "wb" and file_path.endswith(".pt"):
            raise OSError("disk full")
        return original_open(file_path, mode, **kwargs)

    fs.open = failing_open  # fsspec caches file system instances, so the manager sees this one.
    try:
        manager.save(1, make_state(1), blocking=False)
        with pytest.raises(OSError, match="disk full"):
            manager.wait()
    finally:
        del fs.open
    manager.wait()  # The failure is reported once.
    manager.save(2, make_state(2))
    assert [info.step for info in manager.list_checkpoints()] == [2]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"score": float("nan")}, "`score` must be None or a finite number"),
        ({"extras": {"obj": object()}}, "`extras` must hold only JSON values"),
    ],
)
def test_bad_save_arguments_are_refused(root: str, kwargs: dict[str, object], message: str) -> None:
    manager = CheckpointManager(root, FakeGang())
    with pytest.raises(CheckpointError, match=message):
        manager.save(1, {"value": torch.tensor(1)}, **kwargs)  # type: ignore[arg-type]
    assert manager.list_checkpoints() == []


def test_state_that_a_weights_only_load_cannot_read_is_refused_at_save(root: str) -> None:
    import numpy as np

    manager = CheckpointManager(root, FakeGang())
    with pytest.raises(CheckpointError, match=r"`rank_state\['rng'\]\['numpy'\]` must be a tensor.*numpy"):
        manager.save(1, {}, {"rng": {"numpy": np.zeros(3)}})


def test_bad_policy_value_is_refused() -> None:
    with pytest.raises(CheckpointError, match=r"`keep_last_n` must be None or an integer >= 1, but is 0 instead\."):
        CheckpointPolicy(keep_last_n=0)


def test_consecutive_async_saves_each_keep_their_own_values(root: str) -> None:
    manager = CheckpointManager(root, FakeGang())
    weights = torch.zeros(4, 3)
    for step in range(1, 4):
        weights.fill_(step)
        # The copy of the previous save is reused as the buffer of the next one.
        manager.save(step, {"model": {"w": weights}, "history": [torch.tensor(step)]}, blocking=False)
    manager.wait()

    for step in range(1, 4):
        state = manager.load(step).shared_state
        assert torch.equal(state["model"]["w"], torch.full((4, 3), float(step)))
        assert state["history"][0].item() == step


def test_clean_up_false_never_deletes_leftovers(root: str) -> None:
    fs, path = fsspec.core.url_to_fs(root)
    CheckpointManager(root, FakeGang()).save(1, make_state(1))
    # A running job's save in flight, and a checkpoint that never committed.
    fs.makedirs(f"{path}/step_2.tmp-0123abcd", exist_ok=True)
    fs.pipe_file(f"{path}/step_2.tmp-0123abcd/model.pt", b"partial")
    fs.makedirs(f"{path}/step_3", exist_ok=True)
    fs.pipe_file(f"{path}/step_3/model.pt", b"partial")

    reader = CheckpointManager(root, FakeGang(), clean_up=False)

    assert [info.step for info in reader.list_checkpoints()] == [1]
    assert reader.last_resumable_step() == 1 and reader.load(1).step == 1
    assert fs.exists(f"{path}/step_2.tmp-0123abcd/model.pt") and fs.exists(f"{path}/step_3/model.pt")
    CheckpointManager(root, FakeGang())  # The default still cleans up, and moves damage aside.
    assert not fs.exists(f"{path}/step_2.tmp-0123abcd") and not fs.exists(f"{path}/step_3")
    assert fs.cat_file(f"{path}/step_3.damaged/model.pt") == b"partial"


@pytest.mark.parametrize("key", ["rank_0", "a/b", "", "../up", 3])
def test_shared_keys_that_cannot_name_a_file_are_refused(root: str, key: object) -> None:
    manager = CheckpointManager(root, FakeGang())
    with pytest.raises(CheckpointError, match=r"keys of `shared_state` name its files"):
        manager.save(1, {key: torch.ones(1)})  # type: ignore[dict-item]
    assert manager.list_checkpoints() == []


def test_shared_state_is_one_file_per_key_and_each_reads_alone(root: str) -> None:
    manager = CheckpointManager(root, FakeGang())
    state = make_state(3)
    manager.save(3, state)

    fs, path = fsspec.core.url_to_fs(root)
    with fs.open(f"{path}/step_3/optimizer.pt", "rb") as file:
        alone = torch.load(file, weights_only=True)
    assert_equal(alone, {"optimizer": state["optimizer"]})


def test_async_save_copies_the_tensors_left_unchanged_in_the_background(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tensors the caller promises to leave alone are copied by the writer thread: ``save`` returns before
    they are, and ``wait_until_staged`` is what the caller must wait for before changing them."""
    import checkpoint.manager as manager_module

    gate = threading.Event()
    copy_tensors = manager_module.copy_tensors

    def gated_copy(copies: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        gate.wait()
        copy_tensors(copies)

    monkeypatch.setattr(manager_module, "copy_tensors", gated_copy)
    manager = CheckpointManager(root, FakeGang())
    weights, buffer = torch.zeros(64, 8), torch.zeros(3)
    weights_storage = weights.untyped_storage().data_ptr()
    manager.save(
        1,
        {"model": {"w": weights, "running_mean": buffer}},
        blocking=False,
        unchanged_until_staged=lambda t: t.untyped_storage().data_ptr() == weights_storage,
    )
    buffer.add_(5.0)  # Not promised: copied before save returned.
    staged = threading.Thread(target=manager.wait_until_staged)
    staged.start()
    staged.join(timeout=0.2)
    assert staged.is_alive()  # The weights' copy is still waiting on the gate.
    gate.set()
    staged.join()
    weights.add_(1.0)  # Allowed once staged, while the files are still being written.
    manager.wait()

    state = manager.load(1).shared_state["model"]
    assert torch.equal(state["w"], torch.zeros(64, 8)) and torch.equal(state["running_mean"], torch.zeros(3))


def test_load_reads_only_the_parts_of_the_shared_state_asked_for(root: str) -> None:
    manager = CheckpointManager(root, FakeGang())
    state = make_state(5)
    manager.save(5, state, {"position": 3})

    model_only = manager.load(5, keys=["model"])
    assert_equal(model_only.shared_state, {"model": state["model"]})
    assert manager.load(5, keys=[]).shared_state == {}
    assert manager.load(5, keys=[]).load_rank_state(0) == {"position": 3}
    with pytest.raises(
        CheckpointError, match=r"`keys` must name parts of the shared state of step 5 .*, but net are not"
    ):
        manager.load(5, keys=["model", "net"])


class FullDiskFile:
    """An open file on a disk that fills up after ``room`` bytes: its ``write`` fails as the OS's would."""

    def __init__(self, file: Any, room: int) -> None:
        self._file = file
        self._room = room

    def write(self, data: bytes) -> int:
        if len(data) > self._room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room -= len(data)
        return int(self._file.write(data))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> FullDiskFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._file.close()


def fill_disk_under(fs: Any, monkeypatch: pytest.MonkeyPatch, path_part: str, room: int = 100) -> None:
    """Make every file opened for writing under a path containing ``path_part`` run out of space."""
    original_open = fs.open

    def open_on_a_full_disk(file_path: str, mode: str = "rb", **kwargs: Any) -> Any:
        file = original_open(file_path, mode, **kwargs)
        return FullDiskFile(file, room) if "w" in mode and path_part in file_path else file

    monkeypatch.setattr(fs, "open", open_on_a_full_disk)  # fsspec caches instances: the manager's fs is this one.


WRITE_FAILED = re.compile(
    r"Could not save the checkpoint of step 2: writing \S+/step_2\.tmp-[0-9a-f]+/\S+\.pt failed with "
    r"\[Errno 28\] No space left on device \(free space there: (?P<free>\d+ B|[\d.]+ [KMGT]B|unknown)\)\. "
    r"The earlier checkpoints are intact, and no part of step 2 is visible\."
)


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "async"])
def test_a_full_disk_fails_the_save_in_one_line_naming_the_path_and_the_free_space(
    root: str, blocking: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = CheckpointManager(root, FakeGang())
    manager.save(1, make_state(1), {"position": 1})
    fs, path = fsspec.core.url_to_fs(root)
    before = file_contents(fs, f"{path}/step_1")
    fill_disk_under(fs, monkeypatch, "/step_2.tmp-")

    with pytest.raises(CheckpointWriteError) as raised:
        manager.save(2, make_state(2), {"position": 2}, blocking=blocking)
        manager.wait()  # Where an asynchronous save's failure surfaces (or at the next save).

    match = WRITE_FAILED.fullmatch(str(raised.value))
    assert match is not None, str(raised.value)
    assert (match["free"] == "unknown") == root.startswith("memory://")  # Only local disks can say.
    assert isinstance(raised.value, OSError) and not isinstance(raised.value, CheckpointError)  # Exit 1, not 2.
    monkeypatch.undo()
    assert [name.rsplit("/", 1)[-1] for name in fs.ls(path, detail=False)] == ["step_1"]  # No half step 2.
    assert file_contents(fs, f"{path}/step_1") == before
    assert_equal(manager.load(1).shared_state, make_state(1))
    loaded = CheckpointManager(root, FakeGang()).load_newest_intact()
    assert loaded is not None and loaded.step == 1 and loaded.load_rank_state(0) == {"position": 1}


@pytest.mark.parametrize("foreign", ["file", "folder"])
def test_what_the_manager_did_not_write_at_a_checkpoints_place_is_set_aside_never_deleted(
    root: str, foreign: str, caplog: pytest.LogCaptureFixture
) -> None:
    fs, path = fsspec.core.url_to_fs(root)
    manager = CheckpointManager(root, FakeGang())
    manager.save(5, make_state(5))
    fs.makedirs(path, exist_ok=True)
    theirs = f"{path}/step_10/notes.txt" if foreign == "folder" else f"{path}/step_10"
    if foreign == "folder":
        fs.makedirs(f"{path}/step_10", exist_ok=True)
    fs.pipe_file(theirs, b"a user's file")

    with caplog.at_level(logging.WARNING, logger="checkpoint"):
        manager.save(10, make_state(10))

    assert [info.step for info in manager.list_checkpoints()] == [5, 10]
    assert_equal(manager.load(10).shared_state, make_state(10))
    kept = theirs.replace("step_10", "step_10.not-a-checkpoint")
    assert fs.cat_file(kept) == b"a user's file"
    assert "which is no checkpoint, aside to step_10.not-a-checkpoint (kept, never deleted)" in caplog.text
