"""The score's metric and direction (``training.score``): a metric knows which way is better, and a score that is
no number stops the run at its validation (GitHub issue 45)."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import pytest
import torch
from torch import nn
from torchmetrics import Metric

from gang import FakeGang
from recipes.errors import ConfigError
from recipes.recorders import CompositeRecorder
from recipes.training.data_reader import DataError
from recipes.training.protocols import Validation
from recipes.training.score import Score, ScoreMetric, resolve_score
from recipes.training.validator import make_validator
from support.linear_regression import Batch, reader
from units import (
    BinaryAUC,
    Calibration,
    EvalUnit,
    GroupedAUC,
    LogLoss,
    Mean,
    MeanSquaredError,
    MetricBag,
    NormalizedEntropy,
    SlicedNormalizedEntropy,
)


class MetricsUnit(EvalUnit[Batch]):
    """Holds the given metrics; each validation updates the AUC with ``labels``, whatever the batch."""

    def __init__(self, metrics: dict[str, Metric], name: str = "valid", labels: list[int] | None = None) -> None:
        super().__init__(nn.Linear(1, 1), MetricBag(FakeGang()), name)
        for metric_name, metric in metrics.items():
            self.metric_bag.register(metric_name, metric)
        self._labels = torch.tensor(labels or [0, 1])

    def __call__(self, batch: Batch) -> None:
        if "auc" in self.metric_bag:
            self.metric_bag["auc"].update(torch.linspace(0.1, 0.9, len(self._labels)), self._labels)


def validations(*units: MetricsUnit) -> list[Validation[Any]]:
    return [Validation(unit, reader(batch_size=8, num_samples=8)) for unit in units]


def click_metrics() -> dict[str, Metric]:
    return {"auc": BinaryAUC(), "log_loss": LogLoss(), "ne": NormalizedEntropy(), "calibration": Calibration()}


@pytest.mark.parametrize(("name", "lower_better"), [("auc", False), ("log_loss", True), ("valid/ne", True)])
def test_the_direction_is_the_metrics_own_when_lower_better_is_unset(name: str, lower_better: bool) -> None:
    score = resolve_score(ScoreMetric(name), validations(MetricsUnit(click_metrics())))

    assert (score.key, score.lower_better) == (f"valid/{name.removeprefix('valid/')}", lower_better)


def test_a_lower_better_that_contradicts_the_metric_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        resolve_score(ScoreMetric("log_loss", lower_better=False), validations(MetricsUnit(click_metrics())))

    assert str(info.value) == (
        "`trainer.lower_better` must be true for `trainer.score_metric: valid/log_loss` (LogLoss: lower is better), "
        "but is false instead; leave it unset to take the metric's own direction."
    )
    agreeing = resolve_score(ScoreMetric("log_loss", lower_better=True), validations(MetricsUnit(click_metrics())))
    assert agreeing.lower_better


def test_a_metric_that_does_not_say_needs_lower_better_and_takes_it() -> None:
    units = validations(MetricsUnit({"mine": Mean()}))

    with pytest.raises(
        ConfigError, match=r"^`trainer.lower_better` must be set for `trainer.score_metric: valid/mine`"
    ):
        resolve_score(ScoreMetric("mine"), units)
    assert resolve_score(ScoreMetric("mine", lower_better=True), units).lower_better


@pytest.mark.parametrize("lower_better", [None, True, False])
def test_a_metric_without_a_better_side_cannot_score(lower_better: bool | None) -> None:
    with pytest.raises(ConfigError, match=r"valid/calibration \(Calibration\) has no better side"):
        resolve_score(ScoreMetric("calibration", lower_better), validations(MetricsUnit(click_metrics())))


def test_a_missing_metric_suggests_the_same_metric_elsewhere_never_another_that_ends_alike() -> None:
    gauc_only = validations(MetricsUnit({"gauc": GroupedAUC(), "log_loss": LogLoss()}))
    with pytest.raises(ConfigError) as info:
        resolve_score(ScoreMetric("auc"), gauc_only)
    assert "Did you mean" not in str(info.value)  # Before: "Did you mean 'valid/gauc'?"

    two_units = validations(MetricsUnit({"gauc": GroupedAUC()}), MetricsUnit({"auc": BinaryAUC()}, name="test"))
    with pytest.raises(ConfigError, match=r"Did you mean 'test/auc'\?$"):
        resolve_score(ScoreMetric("auc"), two_units)
    with pytest.raises(ConfigError, match=r"Did you mean 'valid/log_loss'\?$"):
        resolve_score(ScoreMetric("LogLoss"), gauc_only)


def test_a_task_metric_of_no_task_suggests_that_of_a_task_and_a_tasks_loss_ranks_lower_first() -> None:
    tasks = validations(MetricsUnit({"click/auc": BinaryAUC(), "rating/mse": MeanSquaredError()}))
    with pytest.raises(ConfigError, match=r"but is 'valid/clicks/auc' instead\. Did you mean 'valid/click/auc'\?$"):
        resolve_score(ScoreMetric("valid/clicks/auc"), tasks)

    assert resolve_score(ScoreMetric("valid/rating/mse"), tasks) == Score("valid/rating/mse", lower_better=True)
    assert resolve_score(ScoreMetric("valid/click/auc"), tasks) == Score("valid/click/auc", lower_better=False)


def refusal_at_validation(units: list[Validation[Any]], score: str, error: type[Exception]) -> str:
    """The one line that the validation of step 10 stops the run with."""
    validator = make_validator(units, nn.Linear(1, 1), CompositeRecorder([]), 0, nullcontext, ScoreMetric(score))
    with pytest.raises(error) as info:
        validator.validate(10)
    return str(info.value)


def test_a_score_undefined_on_one_class_stops_the_run_at_its_validation_saying_why() -> None:
    units = validations(MetricsUnit(click_metrics(), labels=[0, 0, 0]))

    assert refusal_at_validation(units, "auc", DataError) == (
        "`trainer.score_metric` valid/auc must be a number to rank checkpoints, but is NaN at the validation of "
        "step 10: the data holds only label 0 (3 rows)."
    )


def test_a_sliced_metric_cannot_score_and_is_refused_at_start_up() -> None:
    """It reports a value per slice (`valid/ne/mobile`), none under `valid/ne/`: once, no checkpoint was ever the best
    and early stopping never stopped, without a word."""
    units = validations(MetricsUnit({"ne/": SlicedNormalizedEntropy("device")}))

    with pytest.raises(ConfigError) as info:
        resolve_score(ScoreMetric("valid/ne/"), units)

    assert str(info.value) == (
        "`trainer.score_metric` must name a metric of one value, but valid/ne/ (SlicedNormalizedEntropy) reports one "
        "per slice (valid/ne/<slice>) and none under its own name; score by a metric of all rows, such as an AUC or a "
        "loss."
    )


class PerHalf(Metric):
    """A user's metric of several values, none under its own name: ``{"_first": ..., "_second": ...}``."""

    higher_is_better = False

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", default=torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, value: torch.Tensor) -> None:
        self.total += value.sum()

    def compute(self) -> dict[str, torch.Tensor]:
        return {"_first": self.total / 2, "_second": self.total / 2}


class PerHalfUnit(MetricsUnit):
    def __call__(self, batch: Batch) -> None:
        self.metric_bag["halves"].update(batch[1])


def test_a_score_its_metric_reports_no_value_under_stops_the_run_at_the_first_validation() -> None:
    """What start-up cannot know of a metric that does not say it reports several values, the first validation
    does: before, its score was None at every validation, silently."""
    units = validations(PerHalfUnit({"halves": PerHalf()}))

    assert refusal_at_validation(units, "halves", ConfigError) == (
        "`trainer.score_metric` must name a value the validation reports, but the validation of step 10 reported none "
        "under valid/halves: its metric reported valid/halves_first, valid/halves_second instead."
    )
