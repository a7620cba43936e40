"""`metrics.group_by`/`slice_by` that no eval unit's metric honours stop the run at start-up, and a metric says it
honours them by its marker (`units.grouped_metrics.ByGroup`, `BySlice`), which a user's own metric can carry."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torchmetrics import Metric

from gang import FakeGang
from recipes.config.sections import MetricsSection
from recipes.errors import ConfigError
from recipes.training.protocols import Validation
from recipes.training.validator import refuse_ignored_metric_columns
from support.linear_regression import Batch, reader
from units import EvalUnit, GroupedAUC, Mean, MetricBag, SlicedCalibration
from units.grouped_metrics import ByGroup, BySlice


class UsersGroupedMean(ByGroup, Mean):
    """A user's own metric over the groups of `metrics.group_by`, marked so."""


class UsersSlicedMean(BySlice, Mean):
    """A user's own metric per slice of `metrics.slice_by`, marked so."""


class Unit(EvalUnit[Batch]):
    def __init__(self, metrics: dict[str, Metric]) -> None:
        super().__init__(nn.Linear(1, 1), MetricBag(FakeGang()), "valid")
        for name, metric in metrics.items():
            self.metric_bag.register(name, metric)

    def __call__(self, batch: Batch) -> None:
        self.metric_bag["mean"].update(torch.tensor(1.0))


def validations(metrics: dict[str, Metric]) -> list[Validation[Any]]:
    return [Validation(Unit(metrics), reader(batch_size=8, num_samples=8))]


@pytest.mark.parametrize(
    ("metrics", "section"),
    [
        ({"mine": UsersGroupedMean()}, MetricsSection(group_by="user")),
        ({"mine": UsersSlicedMean()}, MetricsSection(slice_by="hour")),
        ({"gauc": GroupedAUC(), "calibration/": SlicedCalibration()}, MetricsSection(group_by="u", slice_by="h")),
    ],
    ids=["users_grouped_metric", "users_sliced_metric", "built_in"],
)
def test_a_metric_marked_as_grouping_or_slicing_honours_the_key(metrics: dict[str, Metric], section: Any) -> None:
    """Before, only the built-in GroupedAUC and Sliced* classes did: a user's own grouped metric was refused."""
    refuse_ignored_metric_columns(section, validations({"mean": Mean(), **metrics}))


def test_a_key_no_metric_honours_is_refused_in_one_line_naming_the_marker() -> None:
    with pytest.raises(ConfigError) as info:
        refuse_ignored_metric_columns(MetricsSection(group_by="user"), validations({"mine": UsersSlicedMean()}))

    assert str(info.value) == (
        "`metrics.group_by` is 'user', but no metric of the recipe's eval units groups the rows (one marked "
        "`units.grouped_metrics.ByGroup`, such as GroupedAUC): the recipe ignores it. Unset it, or give the recipe's "
        "eval unit such a metric over that column."
    )
