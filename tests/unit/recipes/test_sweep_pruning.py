"""The sweep's pruner: the median of the trials that had completed when a trial started, at the same step."""

from __future__ import annotations

import optuna

from recipes.cli.sweep_study import MedianOfEarlier


def _completed(study: optuna.Study, values: list[float]) -> None:
    trial = study.ask()
    for step, value in enumerate(values):
        trial.report(value, step)
    study.tell(trial, values[-1])


def test_a_trial_below_the_median_of_earlier_trials_is_pruned_and_one_above_is_not() -> None:
    study = optuna.create_study(direction="maximize", pruner=MedianOfEarlier(startup=2))
    _completed(study, [0.6, 0.7])
    _completed(study, [0.8, 0.9])
    low, high = study.ask(), study.ask()

    low.report(0.5, 0)
    high.report(0.75, 0)

    assert low.should_prune() and not high.should_prune()


def test_trials_completed_after_a_trial_started_are_not_its_measure() -> None:
    study = optuna.create_study(direction="maximize", pruner=MedianOfEarlier(startup=1))
    _completed(study, [0.4])
    running = study.ask()
    _completed(study, [0.9])  # Ended while `running` ran: a parallel sweep's timing, not its order.

    running.report(0.5, 0)

    assert not running.should_prune()


def test_no_trial_is_pruned_before_startup_trials_completed() -> None:
    study = optuna.create_study(direction="maximize", pruner=MedianOfEarlier(startup=2))
    _completed(study, [0.9])
    trial = study.ask()

    trial.report(0.1, 0)

    assert not trial.should_prune()
