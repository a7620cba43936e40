"""PatienceEarlyStopper: stop after `patience` validations without improvement."""

from __future__ import annotations

import pytest

from recipes.training.early_stopping import PatienceEarlyStopper


def first_stop(stopper: PatienceEarlyStopper, scores: list[float]) -> int | None:
    """The 1-based index of the validation at which the stopper says stop, or None."""
    for index, score in enumerate(scores, start=1):
        if stopper.should_stop(index * 10, score):
            return index
    return None


def test_stops_after_patience_validations_without_improvement() -> None:
    assert first_stop(PatienceEarlyStopper(2), [0.5, 0.6, 0.55, 0.58, 0.7]) == 4


def test_an_improvement_resets_the_count() -> None:
    assert first_stop(PatienceEarlyStopper(2), [0.5, 0.4, 0.6, 0.5, 0.7, 0.6, 0.6]) == 7


def test_lower_better_for_losses() -> None:
    assert first_stop(PatienceEarlyStopper(1, lower_better=True), [1.0, 0.8, 0.9]) == 3
    assert first_stop(PatienceEarlyStopper(1, lower_better=True), [1.0, 0.8, 0.7]) is None


def test_an_improvement_smaller_than_min_delta_does_not_count() -> None:
    assert first_stop(PatienceEarlyStopper(2, min_delta=0.05), [0.5, 0.52, 0.54, 0.6]) == 3


def test_state_dict_round_trip_continues_the_count() -> None:
    stopper = PatienceEarlyStopper(2)
    stopper.should_stop(10, 0.9)
    stopper.should_stop(20, 0.8)
    resumed = PatienceEarlyStopper(2)

    resumed.load_state_dict(stopper.state_dict())

    assert stopper.state_dict() == {"best": 0.9, "num_bad": 1}
    assert resumed.should_stop(30, 0.85)


def test_a_patience_below_one_is_an_error() -> None:
    with pytest.raises(ValueError, match="`patience` must be >= 1, but is 0 instead"):
        PatienceEarlyStopper(0)
