"""Several tasks in the click units: the weighted loss of each sample, each task's metrics under its name (equal to
the one-task metrics of its column), and a predict column pair per task."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from embedding import JaggedIds, SparseFeatures
from gang import FakeGang
from recsys.click.batch import CTRBatch
from recsys.click.metric_columns import MetricColumns
from recsys.click.tasks import Task
from recsys.click.units import CTREvalUnit, CTRTrainUnit, task_losses
from units import MetricBag

CPU = torch.device("cpu")
TASKS = [Task("click", "binary", 2.0), Task("rating", "regression", 0.5)]


class Columns(nn.Module):
    """Outputs the batch's dense columns ``columns`` as they are: logits chosen by the test."""

    def __init__(self, *columns: int) -> None:
        super().__init__()
        self.columns = list(columns)

    def forward(self, batch: CTRBatch) -> torch.Tensor:
        outputs = batch.dense[:, self.columns]
        return outputs[:, 0] if len(self.columns) == 1 else outputs


def batch_of(outputs: torch.Tensor, labels: torch.Tensor, users: torch.Tensor) -> CTRBatch:
    return CTRBatch(outputs, SparseFeatures({"user": JaggedIds.from_dense(users.unsqueeze(1))}), labels)


def generated(rows: int = 200, seed: int = 0) -> CTRBatch:
    generator = torch.Generator().manual_seed(seed)
    clicks = (torch.rand(rows, generator=generator) < 0.4).float()
    ratings = torch.randint(1, 6, (rows,), generator=generator).float()
    outputs = torch.randn(rows, 2, generator=generator) + torch.stack([clicks, ratings], dim=1)
    users = torch.randint(0, 10, (rows,), generator=generator)
    return batch_of(outputs, torch.stack([clicks, ratings], dim=1), users)


def test_the_loss_of_a_sample_is_the_weighted_sum_of_each_tasks_bce_or_squared_error() -> None:
    logits = torch.tensor([[0.3, 2.0], [-1.0, 4.5]])
    labels = torch.tensor([[1.0, 3.0], [0.0, 4.0]])

    losses = task_losses(logits, labels, TASKS)

    first = 2.0 * math.log(1 + math.exp(-0.3)) + 0.5 * (2.0 - 3.0) ** 2
    second = 2.0 * math.log(1 + math.exp(-1.0)) + 0.5 * (4.5 - 4.0) ** 2
    assert losses.tolist() == pytest.approx([first, second], rel=1e-6)


def test_the_train_unit_returns_that_loss_unreduced_and_an_accuracy_per_binary_task() -> None:
    batch = generated()
    unit = CTRTrainUnit(Columns(0, 1), MetricBag(FakeGang()), CPU, TASKS)

    loss = unit(batch)

    assert torch.equal(loss, task_losses(batch.dense, batch.labels, TASKS))
    assert list(unit.metric_bag) == ["click/accuracy"]
    expected = ((batch.dense[:, 0] > 0).float() == batch.labels[:, 0]).float().mean()
    assert float(unit.metric_bag["click/accuracy"].compute()) == pytest.approx(float(expected))


def values(unit: CTREvalUnit) -> dict[str, float]:
    return unit.metric_bag.compute()


def test_each_tasks_metrics_are_under_its_name_and_equal_the_one_task_metrics_of_its_column() -> None:
    batch = generated()
    columns = MetricColumns(group_by="user")
    several = CTREvalUnit(Columns(0, 1), MetricBag(FakeGang()), CPU, columns=columns, tasks=TASKS)
    one = CTREvalUnit(Columns(0), MetricBag(FakeGang()), CPU, columns=columns)
    several(batch)
    one(batch_of(batch.dense, batch.labels[:, 0], batch.sparse["user"].ids))

    binary = values(one)
    assert set(binary) >= {"auc", "gauc", "log_loss", "ne", "pr_auc", "calibration"}
    assert values(several) == {
        **{f"click/{name}": value for name, value in binary.items()},
        "rating/mse": pytest.approx(float((batch.dense[:, 1] - batch.labels[:, 1]).square().mean())),
        "rating/mae": pytest.approx(float((batch.dense[:, 1] - batch.labels[:, 1]).abs().mean())),
    }
    assert several.metric_bag["rating/mse"].higher_is_better is False
    assert several.metric_bag["click/auc"].higher_is_better is True


def test_predict_gives_each_task_a_label_and_a_score_column_a_regression_score_as_it_is() -> None:
    batch = generated(rows=8)
    unit = CTREvalUnit(Columns(0, 1), MetricBag(FakeGang()), CPU, tasks=TASKS)

    columns = unit.predict(batch)

    assert list(columns) == ["click_label", "click_score", "rating_label", "rating_score"]
    assert torch.equal(columns["click_label"], batch.labels[:, 0])
    assert torch.equal(columns["click_score"], torch.sigmoid(batch.dense[:, 0]))
    assert torch.equal(columns["rating_label"], batch.labels[:, 1])
    assert torch.equal(columns["rating_score"], batch.dense[:, 1])


def test_one_task_of_labels_keeps_one_dimension_and_its_name() -> None:
    batch = generated(rows=8)
    one = batch_of(batch.dense, batch.labels[:, 1], batch.sparse["user"].ids)
    unit = CTREvalUnit(Columns(1), MetricBag(FakeGang()), CPU, tasks=[TASKS[1]])

    columns = unit.predict(one)

    assert list(unit.metric_bag) == ["rating/mse", "rating/mae"]
    assert torch.equal(columns["rating_score"], batch.dense[:, 1])
    loss = CTRTrainUnit(Columns(1), MetricBag(FakeGang()), CPU, [TASKS[1]])(one)
    assert torch.allclose(loss, 0.5 * (batch.dense[:, 1] - batch.labels[:, 1]).square())
