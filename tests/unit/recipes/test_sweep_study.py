"""The sweep's study: its pruner (the median of the trials that had completed when a trial started, at the same
step), and the trials a killed sweep left running, told or run again."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.trial import TrialState

from recipes.cli.sweep_study import (
    KILLED,
    SCORE,
    MedianOfEarlier,
    TrialResult,
    counted,
    recover,
    start_attrs,
    write_result,
)


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


def test_a_killed_sweeps_trials_are_told_if_they_ended_and_run_again_if_not(tmp_path: Path) -> None:
    study = optuna.create_study(direction="maximize")
    distributions = {"optimizer.lr": optuna.distributions.FloatDistribution(1e-4, 0.1, log=True)}
    ended, killed, elsewhere = (study.ask(distributions) for _ in range(3))
    for trial in (ended, killed):
        for key, value in start_attrs(str(tmp_path), str(tmp_path / f"trial_{trial.number}"), False).items():
            trial.set_user_attr(key, value)
    elsewhere.set_user_attr("sweep_dir", "/another/sweep")
    write_result(str(tmp_path / "trial_0"), TrialResult("complete", score=0.25, step=10, lower_better=True))

    lines = recover(study, str(tmp_path))

    trials = study.get_trials()
    assert trials[0].state == TrialState.COMPLETE and trials[0].value == -0.25 and trials[0].user_attrs[SCORE] == 0.25
    assert trials[1].state == TrialState.FAIL and trials[1].user_attrs[KILLED]
    assert trials[2].state == TrialState.RUNNING  # Another sweep's: not this one's to settle.
    assert trials[3].state == TrialState.WAITING
    assert counted(trials) == 3
    assert study.ask(distributions).params == trials[1].params  # The rerun, with the killed trial's values.
    assert lines == [
        "Trial 0 had ended (complete) when the sweep stopped: recorded.",
        "Trial 1 was stopped mid-run: marked failed, and its values run again.",
    ]
