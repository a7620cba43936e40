"""Readers of a run's checkpoints while the run prunes them (issue 45): a lease on local disk, a retry elsewhere."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
from pathlib import Path

import fsspec
import pytest
import torch

from checkpoint import CheckpointManager, CheckpointNotFoundError, CheckpointPolicy, CorruptCheckpointError
from checkpoint.reading import MAX_CHOICES, unread
from checkpoint.store import READ_LOCK_FILE_NAME, CheckpointStore
from gang import FakeGang


def save(manager: CheckpointManager, step: int, value: int | None = None) -> None:
    """A checkpoint of ``step`` whose model and rank state hold ``value`` (by default, the step)."""
    value = step if value is None else value
    manager.save(step, {"model": {"w": torch.full((2,), float(value))}}, {"rng": torch.tensor([value])})


def steps(manager: CheckpointManager) -> list[int]:
    return [info.step for info in manager.list_checkpoints()]


def last(manager: CheckpointManager) -> int:
    return max(steps(manager))


def keep_last_one(root: str) -> CheckpointManager:
    return CheckpointManager(root, FakeGang(), CheckpointPolicy(keep_last_n=1))


def a_run_and_its_reader(root: str) -> tuple[CheckpointManager, CheckpointManager]:
    """A run that keeps its last checkpoint, which is of step 1, and a reader of its checkpoints."""
    trainer = keep_last_one(root)
    save(trainer, 1)
    return trainer, CheckpointManager(root, FakeGang(), clean_up=False)


def test_a_prune_leaves_the_checkpoint_a_reader_holds_until_it_is_done(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainer, reader = a_run_and_its_reader(str(tmp_path / "checkpoints"))

    def read_while_the_run_saves(step: int) -> torch.Tensor:
        first_half = reader.load(step).shared_state["model"]["w"]
        save(trainer, 2)  # Its prune drops step 1, which is being read.
        assert reader.load(step).load_rank_state(0)["rng"].tolist() == [step]
        return first_half

    with caplog.at_level(logging.INFO, logger="checkpoint"):
        read = reader.read(lambda: last(reader), read_while_the_run_saves)

    assert read.tolist() == [1.0, 1.0]
    assert "Keeping the checkpoint of step 1, which no policy keeps, while it is read." in caplog.text
    assert steps(trainer) == [1, 2]
    save(trainer, 3)
    assert steps(trainer) == [3]


def test_a_checkpoint_pruned_before_it_was_held_is_chosen_again(root: str) -> None:
    trainer, reader = a_run_and_its_reader(root)
    chosen: list[int] = []

    def choose_last_then_the_run_saves() -> int:
        chosen.append(last(reader))
        if len(chosen) == 1:
            save(trainer, 2)  # Between the choice and the lease, the chosen checkpoint goes.
        return chosen[-1]

    read = reader.read(choose_last_then_the_run_saves, lambda step: reader.load(step).shared_state["model"]["w"])

    assert chosen == [1, 2]
    assert read.tolist() == [2.0, 2.0]


def test_an_explicit_step_pruned_before_it_was_held_is_gone(root: str) -> None:
    trainer, reader = a_run_and_its_reader(root)

    def step_1_then_the_run_saves() -> int:
        if steps(reader) == [1]:
            save(trainer, 2)
        return 1

    with pytest.raises(CheckpointNotFoundError, match=r"step 1 .* must be there to be read, but the run"):
        reader.read(step_1_then_the_run_saves, lambda step: reader.load(step))


def test_without_a_lease_a_checkpoint_that_vanishes_mid_read_is_read_again_on_the_next_choice() -> None:
    root = "memory://reading/checkpoints"
    trainer, reader = a_run_and_its_reader(root)
    tried: list[int] = []

    def read_cut_short_by_a_save(step: int) -> list[int]:
        tried.append(step)
        loaded = reader.load(step)
        if len(tried) == 1:
            save(trainer, 2)  # Nothing holds step 1 in memory://: its rank file goes.
        return list(loaded.load_rank_state(0)["rng"].tolist())

    try:
        assert reader.read(lambda: last(reader), read_cut_short_by_a_save) == [2]
        assert tried == [1, 2]
    finally:
        fsspec.filesystem("memory").rm("/reading", recursive=True)


def test_a_reader_gives_up_in_one_line_after_checkpoints_vanished_mid_read_too_often() -> None:
    root = "memory://reading/checkpoints"
    trainer, reader = a_run_and_its_reader(root)

    def read_cut_short_every_time(step: int) -> None:
        loaded = reader.load(step)
        save(trainer, step + 1)
        loaded.load_rank_state(0)

    try:
        with pytest.raises(RuntimeError, match=f"deleted {MAX_CHOICES} in a row before they were read"):
            reader.read(lambda: last(reader), read_cut_short_every_time)
    finally:
        fsspec.filesystem("memory").rm("/reading", recursive=True)


def test_a_failure_of_a_read_whose_checkpoint_is_still_there_is_not_retried(root: str) -> None:
    manager = keep_last_one(root)
    save(manager, 1)
    calls: list[int] = []

    def fail(step: int) -> None:
        calls.append(step)
        raise OSError("the disk failed")

    with pytest.raises(OSError, match="the disk failed"):
        manager.read(lambda: 1, fail)
    assert calls == [1]


def test_the_read_lock_is_part_of_a_local_checkpoint_and_harmless_to_listing_checksums_and_resume(
    tmp_path: Path,
) -> None:
    manager = CheckpointManager(str(tmp_path / "checkpoints"), FakeGang(), CheckpointPolicy(keep_last_n=2))
    save(manager, 1)
    save(manager, 2)

    lock = tmp_path / "checkpoints" / "step_2" / READ_LOCK_FILE_NAME
    assert lock.is_file() and lock.stat().st_size == 0
    assert READ_LOCK_FILE_NAME not in manager.load(2).metadata.files
    reopened = CheckpointManager(str(tmp_path / "checkpoints"), FakeGang(), CheckpointPolicy(keep_last_n=2))
    assert [info.step for info in reopened.list_checkpoints()] == [1, 2] and reopened.list_damaged() == []
    resumed = reopened.load_newest_intact()
    assert resumed is not None and resumed.step == 2
    save(reopened, 3)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["step_2", "step_3"]  # Pruned lock and all.


def test_a_listing_that_the_run_commits_and_prunes_under_is_listed_again(
    root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader's listing saw step 1 and not yet step 2; by the time it checked step 1, the run had committed step 2
    and pruned step 1: that listing held no checkpoint ("holds no checkpoint to load", once in 20 reads)."""
    trainer = keep_last_one(root)
    save(trainer, 1)
    reader = CheckpointManager(root, FakeGang(), CheckpointPolicy(keep_last_n=1), clean_up=False)
    store = reader._store
    check = store._check_step_dir
    saved = []

    def check_after_the_run_saved(path: str, step: int) -> object:
        if not saved:
            saved.append(True)
            save(trainer, 2)  # Commits step 2 and prunes step 1, which the listing named.
        return check(path, step)

    monkeypatch.setattr(store, "_check_step_dir", check_after_the_run_saved)

    assert steps(reader) == [2]


def test_where_the_file_system_refuses_flock_readers_read_without_a_lease_and_the_run_prunes_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A FUSE mount, Lustre ``noflock`` or NFS without its lock daemon answers flock with ENOLCK (or ENOSYS,
    EOPNOTSUPP): the prune's error killed the run after its checkpoint was committed, and readers failed."""
    trainer, reader = a_run_and_its_reader(str(tmp_path / "checkpoints"))

    def refuse(descriptor: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", refuse)
    tried: list[int] = []

    def read_cut_short_by_a_save(step: int) -> list[int]:
        tried.append(step)
        loaded = reader.load(step)
        if len(tried) == 1:
            save(trainer, 2)  # No lease holds step 1: its prune deletes it, and the read is tried again.
        return list(loaded.load_rank_state(0)["rng"].tolist())

    with caplog.at_level(logging.WARNING, logger="checkpoint"):
        assert reader.read(lambda: last(reader), read_cut_short_by_a_save) == [2]
        save(trainer, 3)
        save(trainer, 3, value=30)  # A new save of a step replaces it without waiting for readers.

    assert tried == [1, 2]
    assert steps(trainer) == [3] and trainer.load(3).shared_state["model"]["w"].tolist() == [30.0, 30.0]
    assert caplog.text.count("refuses flock ([Errno 37] No locks available)") == 1  # Once, not per checkpoint.


def test_a_new_save_of_a_step_waits_for_its_readers_and_leaves_their_files_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An online run saves a window's last step, then again as it stops (or a stop comes right after a periodic
    save): the commit renamed the old checkpoint away and deleted it while a reader held it."""
    trainer, reader = a_run_and_its_reader(str(tmp_path / "checkpoints"))
    seen: list[str] = []
    waiting_or_done = threading.Event()
    flock = fcntl.flock

    def noting_a_wait_for_readers(descriptor: int, operation: int) -> None:
        if operation == fcntl.LOCK_EX:
            seen.append("waits for the readers")
            waiting_or_done.set()
        flock(descriptor, operation)

    monkeypatch.setattr(fcntl, "flock", noting_a_wait_for_readers)

    def save_step_1_again() -> None:
        try:
            save(trainer, 1, value=10)
        finally:
            seen.append("saved")
            waiting_or_done.set()

    def read_while_step_1_is_saved_again(step: int) -> tuple[list[str], list[float], list[int]]:
        saving.start()
        waiting_or_done.wait()  # The lease held, the commit can only wait; without it, the save is done.
        loaded = reader.load(step)
        model = loaded.shared_state["model"]["w"].tolist()
        return list(seen), model, loaded.load_rank_state(0)["rng"].tolist()

    saving = threading.Thread(target=save_step_1_again)
    with caplog.at_level(logging.WARNING, logger="checkpoint"):
        seen_while_read, model, rng = reader.read(lambda: 1, read_while_step_1_is_saved_again)
        saving.join()

    assert seen_while_read == ["waits for the readers"]
    assert model == [1.0, 1.0] and rng == [1]
    assert seen == ["waits for the readers", "saved"]
    assert f"Waiting for the readers of {trainer.root}/step_1 to finish before replacing it." in caplog.text
    assert steps(trainer) == [1] and reader.load(1).load_rank_state(0)["rng"].tolist() == [10]


def test_a_reader_whose_checkpoint_was_saved_again_while_it_waited_for_its_lease_holds_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer, reader = a_run_and_its_reader(str(tmp_path / "checkpoints"))
    flock = fcntl.flock
    saved_again: list[bool] = []

    def saved_again_before_the_lease_is_granted(descriptor: int, operation: int) -> None:
        if operation == fcntl.LOCK_SH and not saved_again:
            saved_again.append(True)
            save(trainer, 1, value=10)  # Its commit renames the lock file the reader opened away.
        flock(descriptor, operation)

    monkeypatch.setattr(fcntl, "flock", saved_again_before_the_lease_is_granted)

    def read_and_prune(step: int) -> tuple[bool, list[float]]:
        with unread(CheckpointStore(trainer.root), f"{trainer.root}/step_1") as free:
            return free, reader.load(step).shared_state["model"]["w"].tolist()

    assert reader.read(lambda: 1, read_and_prune) == (False, [10.0, 10.0])


def test_an_explicit_step_caught_between_the_renames_of_a_new_save_of_it_is_read(root: str) -> None:
    _, reader = a_run_and_its_reader(root)
    fs, path = fsspec.core.url_to_fs(root)
    chosen: list[int] = []

    def step_1_while_it_is_replaced() -> int:
        chosen.append(1)
        if len(chosen) == 1:
            fs.mv(f"{path}/step_1", f"{path}/step_1.old-0123abcd", recursive=True)  # The first rename.
        else:
            fs.mv(f"{path}/step_1.old-0123abcd", f"{path}/step_1", recursive=True)  # Committed again.
        return 1

    read = reader.read(step_1_while_it_is_replaced, lambda step: reader.load(step).shared_state["model"]["w"])

    assert chosen == [1, 1] and read.tolist() == [1.0, 1.0]


def test_an_explicit_step_that_is_damaged_is_said_to_be_damaged_not_deleted(root: str) -> None:
    trainer = CheckpointManager(root, FakeGang(), CheckpointPolicy(keep_last_n=2))
    save(trainer, 1)
    save(trainer, 2)
    fs, path = fsspec.core.url_to_fs(root)
    fs.pipe_file(f"{path}/step_1/metadata.json", b"{not json")
    reader = CheckpointManager(root, FakeGang(), clean_up=False)

    with pytest.raises(CorruptCheckpointError, match=r"step 1 .* must be intact to be read, but it is damaged: "):
        reader.read(lambda: 1, reader.load)
    trainer.list_checkpoints()  # The run moves it aside.
    with pytest.raises(CorruptCheckpointError, match=r"but it is damaged \(.+\) and was moved aside to step_1.damaged"):
        reader.read(lambda: 1, reader.load)


def test_closing_the_manager_prunes_what_its_last_save_kept_while_it_was_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainer, reader = a_run_and_its_reader(str(tmp_path / "checkpoints"))
    reader.read(lambda: 1, lambda step: save(trainer, 2))  # The last save of the run, while step 1 is read.
    assert steps(trainer) == [1, 2]
    trainer.close()
    assert steps(trainer) == [2]

    def the_last_save_and_the_close_while_read(step: int) -> list[int]:
        save(trainer, 3)
        trainer.close()
        return steps(trainer)

    with caplog.at_level(logging.WARNING, logger="checkpoint"):
        assert reader.read(lambda: 2, the_last_save_and_the_close_while_read) == [2, 3]
    assert "Keeping the checkpoint of step 2, which no policy keeps, as it is still read when the run ends" in (
        caplog.text
    )
