"""Readers of a run's checkpoints while the run prunes them (issue 45): a lease on local disk, a retry elsewhere."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import fsspec
import pytest
import torch

from checkpoint import CheckpointManager, CheckpointNotFoundError, CheckpointPolicy
from checkpoint.reading import MAX_CHOICES
from checkpoint.store import READ_LOCK_FILE_NAME
from gang import FakeGang


def save(manager: CheckpointManager, step: int) -> None:
    manager.save(step, {"model": {"w": torch.full((2,), float(step))}}, {"rng": torch.tensor([step])})


def steps(manager: CheckpointManager) -> list[int]:
    return [info.step for info in manager.list_checkpoints()]


def last(manager: CheckpointManager) -> int:
    return max(steps(manager))


def keep_last_one(root: str) -> CheckpointManager:
    return CheckpointManager(root, FakeGang(), CheckpointPolicy(keep_last_n=1))


def test_a_prune_leaves_the_checkpoint_a_reader_holds_until_it_is_done(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainer = keep_last_one(str(tmp_path / "checkpoints"))
    reader = CheckpointManager(trainer.root, FakeGang(), clean_up=False)
    save(trainer, 1)

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
    trainer = keep_last_one(root)
    reader = CheckpointManager(root, FakeGang(), clean_up=False)
    save(trainer, 1)
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
    trainer = keep_last_one(root)
    reader = CheckpointManager(root, FakeGang(), clean_up=False)
    save(trainer, 1)

    def step_1_then_the_run_saves() -> int:
        if steps(reader) == [1]:
            save(trainer, 2)
        return 1

    with pytest.raises(CheckpointNotFoundError, match=r"step 1 .* must be there to be read, but the run"):
        reader.read(step_1_then_the_run_saves, lambda step: reader.load(step))


def test_without_a_lease_a_checkpoint_that_vanishes_mid_read_is_read_again_on_the_next_choice() -> None:
    root = "memory://reading/checkpoints"
    trainer = keep_last_one(root)
    reader = CheckpointManager(root, FakeGang(), clean_up=False)
    save(trainer, 1)
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
    trainer = keep_last_one(root)
    reader = CheckpointManager(root, FakeGang(), clean_up=False)
    save(trainer, 1)

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
