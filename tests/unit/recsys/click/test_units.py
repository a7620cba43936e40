"""The click units' metrics say which way is better, so that any of them that ranks checkpoints needs no
``trainer.lower_better`` (GitHub issue 45)."""

from __future__ import annotations

import torch
from torch import nn

from gang import FakeGang
from recsys.click.units import CTREvalUnit, CTRTrainUnit
from units import MetricBag


def test_accuracy_is_higher_better_in_training_and_validation() -> None:
    model = nn.Linear(1, 1)
    train = CTRTrainUnit(model, MetricBag(FakeGang()), torch.device("cpu"))
    valid = CTREvalUnit(model, MetricBag(FakeGang()), torch.device("cpu"))

    assert train.metric_bag["accuracy"].higher_is_better is True
    assert valid.metric_bag["accuracy"].higher_is_better is True
