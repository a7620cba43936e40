"""When the Trainer saves (``training.checkpoint_schedule``): the config's periods, new bests, window ends, the end."""

from __future__ import annotations

import pytest

from recipes.config.sections import CheckpointSection
from recipes.training.checkpoint_schedule import CheckpointSchedule, period_ended


def test_the_checkpoint_section_gives_the_periods_and_keeping_the_best_saves_each_new_best() -> None:
    schedule = CheckpointSchedule.of(
        CheckpointSection(every_n_steps=4, every_n_data_epochs=2, every_n_windows=3, keep_best_n=1)
    )

    assert (schedule.every_n_steps, schedule.every_n_data_epochs, schedule.every_n_windows) == (4, 2, 3)
    assert schedule.due_after_step(5, 0, epoch_ended=False, new_best=True)
    assert not CheckpointSchedule.of(CheckpointSection()).due_after_step(5, 0, epoch_ended=False, new_best=True)


@pytest.mark.parametrize(
    ("step_nr", "epoch_nr", "epoch_ended", "due"),
    [(4, 0, False, True), (5, 0, False, False), (5, 2, True, True), (5, 2, False, False), (5, 3, True, False)],
)
def test_a_step_or_a_data_epoch_that_reaches_its_period_is_due(
    step_nr: int, epoch_nr: int, epoch_ended: bool, due: bool
) -> None:
    assert period_ended(4, 2, step_nr, epoch_nr, epoch_ended) is due
    assert (
        CheckpointSchedule(every_n_steps=4, every_n_data_epochs=2).due_after_step(
            step_nr, epoch_nr, epoch_ended, new_best=False
        )
        is due
    )


def test_a_window_end_saves_every_n_windows_but_not_a_step_saved_already() -> None:
    schedule = CheckpointSchedule(every_n_steps=8, every_n_windows=2)

    assert [schedule.due_after_window(4 * n, n) for n in (1, 2, 3)] == [False, True, False]
    schedule.saved(8, final=False)
    assert not schedule.due_after_window(8, 2)
    assert not CheckpointSchedule().due_after_window(8, 2)


def test_the_end_saves_a_final_checkpoint_once_even_after_a_periodic_one_at_the_same_step() -> None:
    schedule = CheckpointSchedule(every_n_steps=4)

    assert schedule.due_at_end(4)
    schedule.saved(4, final=False)
    assert schedule.due_at_end(4)
    schedule.saved(4, final=True)
    assert not schedule.due_at_end(4)
    assert schedule.due_at_end(5)
