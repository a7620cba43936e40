"""Checkpoints whose rank files lie over an earlier one (deltas of the sparse tables): kept, read and refused
with their base."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from checkpoint import CheckpointError, CheckpointManager, CheckpointPolicy
from gang import FakeGang


def save(manager: CheckpointManager, step: int, base_step: int | None = None) -> None:
    shared = {"model": {"w": torch.tensor([float(step)])}}
    manager.save(step, shared, {"rows": torch.tensor([step])}, base_step=base_step)


def save_full_every_3(manager: CheckpointManager, steps: range) -> None:
    """Steps 1, 4, 7... full; the two after each a delta over it."""
    for step in steps:
        save(manager, step, None if step % 3 == 1 else step - (step - 1) % 3)


def kept(manager: CheckpointManager) -> dict[int, tuple[str, ...]]:
    return {info.step: info.kept_by for info in manager.list_checkpoints()}


def test_keep_last_one_keeps_the_base_of_the_newest_delta_and_lets_it_go_at_the_next_full(root: str) -> None:
    manager = CheckpointManager(root, FakeGang(), CheckpointPolicy(keep_last_n=1))
    save_full_every_3(manager, range(1, 4))
    assert kept(manager) == {1: ("base_of_kept",), 3: ("keep_last_n", "newest", "newest_resumable")}

    loaded = manager.load(3)
    assert loaded.base is not None and loaded.base.step == 1
    assert loaded.base.load_rank_state(0)["rows"].tolist() == [1]

    save(manager, 4)
    assert list(kept(manager)) == [4]


def test_keep_best_keeps_the_base_of_a_kept_delta(root: str) -> None:
    manager = CheckpointManager(root, FakeGang(), CheckpointPolicy(keep_best_n=1))
    manager.save(1, {}, score=0.1)
    manager.save(2, {}, score=0.9, base_step=1)
    manager.save(3, {}, score=0.2)
    manager.save(4, {}, score=0.3)
    assert kept(manager) == {1: ("base_of_kept",), 2: ("keep_best_n",), 4: ("newest", "newest_resumable")}


def test_the_base_of_a_checkpoint_being_read_outlives_the_prune(tmp_path: Path) -> None:
    root = str(tmp_path / "checkpoints")
    run = CheckpointManager(root, FakeGang(), CheckpointPolicy(keep_last_n=1))
    reader = CheckpointManager(root, FakeGang(), clean_up=False)
    save_full_every_3(run, range(1, 3))

    def read_while_the_run_saves(step: int) -> list[int]:
        save_full_every_3(run, range(3, 5))  # step 4 is full: steps 1 and 2 no policy keeps
        loaded = reader.load(step)
        assert loaded.base is not None
        return [*loaded.load_rank_state(0)["rows"].tolist(), *loaded.base.load_rank_state(0)["rows"].tolist()]

    assert reader.read(lambda: 2, read_while_the_run_saves) == [2, 1]
    assert list(kept(run)) == [1, 2, 4]
    run.close()
    assert list(kept(run)) == [4]


def test_a_base_that_is_gone_is_refused_and_its_delta_is_moved_aside_not_deleted(root: str) -> None:
    manager = CheckpointManager(root, FakeGang())
    with pytest.raises(CheckpointError, match="committed checkpoint's step, which the save of step 2 lies over, but 1"):
        save(manager, 2, base_step=1)
    save(manager, 1)
    save(manager, 2, base_step=1)
    manager._store.remove(manager._store.step_dir(1))

    with pytest.raises(CheckpointError, match="`base_step` must be None or a step before 2, but is 2 instead"):
        save(manager, 2, base_step=2)
    with pytest.raises(CheckpointError, match="must have its base, the checkpoint of step 1, but it is not there"):
        manager.load(2)
    assert manager.load_newest_intact() is None
    assert [info.step for info in manager.list_damaged()] == [2]
