from __future__ import annotations

import pytest
import torch

from checkpoint import CheckpointManager, CheckpointPolicy
from gang import FakeGang


def score_of(step: int) -> float:
    """Scores in a fixed shuffled order: the lowest at steps 9 and 18, the highest at steps 22 and 13."""
    return float((step * 7) % 31)


@pytest.mark.parametrize(("lower_better", "best_two"), [(True, {9, 18}), (False, {22, 13})])
def test_a_long_run_keeps_exactly_what_any_policy_keeps(root: str, lower_better: bool, best_two: set[int]) -> None:
    policy = CheckpointPolicy(keep_last_n=2, keep_best_n=2, keep_every_n_steps=10, lower_better=lower_better)
    manager = CheckpointManager(root, FakeGang(), policy)
    for step in range(1, 31):
        manager.save(step, {"value": torch.tensor(step)}, score=score_of(step))

    infos = {info.step: info for info in manager.list_checkpoints()}

    assert set(infos) == {29, 30, 10, 20} | best_two
    best = min(best_two, key=score_of) if lower_better else max(best_two, key=score_of)
    assert manager.best_step() == best
    assert [step for step, info in infos.items() if info.is_best] == [best]
    assert "keep_best_n" in infos[best].kept_by and "keep_every_n_steps" in infos[10].kept_by
    assert set(infos[30].kept_by) == {"keep_last_n", "keep_every_n_steps", "newest", "newest_resumable"}
    for step in infos:
        assert manager.load(step).shared_state["value"].item() == step


def test_newest_is_never_deleted_even_when_worst(root: str) -> None:
    manager = CheckpointManager(root, FakeGang(), CheckpointPolicy(keep_best_n=1))
    manager.save(1, {}, score=0.9)
    manager.save(2, {}, score=0.1)

    assert [(info.step, info.kept_by) for info in manager.list_checkpoints()] == [
        (1, ("keep_best_n",)),
        (2, ("newest", "newest_resumable")),
    ]


def test_newest_resumable_survives_later_model_only_saves(root: str) -> None:
    manager = CheckpointManager(root, FakeGang(), CheckpointPolicy(keep_last_n=1))
    manager.save(1, {"optimizer": {}})
    manager.save(2, {"model": {}}, model_only=True)
    manager.save(3, {"model": {}}, model_only=True)

    assert [info.step for info in manager.list_checkpoints()] == [1, 3]
    assert manager.last_resumable_step() == 1


def test_no_rule_keeps_everything(root: str) -> None:
    manager = CheckpointManager(root, FakeGang())
    for step in range(1, 5):
        manager.save(step, {})
    assert [info.step for info in manager.list_checkpoints()] == [1, 2, 3, 4]
    assert manager.best_step() is None


def test_a_checkpoint_saved_on_a_stop_counts_for_no_rule_and_goes_once_a_later_one_is_saved(root: str) -> None:
    manager = CheckpointManager(root, FakeGang(), CheckpointPolicy(keep_last_n=2, keep_best_n=1, lower_better=True))
    manager.save(10, {}, score=0.5)
    manager.save(13, {}, score=0.1, extras={"interrupted": True})

    # The stop's checkpoint is the newest, so it stays, but it pushes no regular checkpoint out of the last two.
    assert [(info.step, info.kept_by) for info in manager.list_checkpoints()] == [
        (10, ("keep_last_n", "keep_best_n")),
        (13, ("newest", "newest_resumable")),
    ]

    manager.save(20, {}, score=0.9)

    assert [info.step for info in manager.list_checkpoints()] == [10, 20]
    assert manager.best_step() == 10
