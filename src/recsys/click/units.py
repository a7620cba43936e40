"""Units for binary click prediction (BCE loss for training; AUC, log loss, NE, calibration, PR-AUC and
the positive rate for validation, with GAUC by group and NE and calibration by slice where the config
asks), for several tasks at once (``recsys.click.tasks``: the weighted sum of their losses, each one's metrics
under its name, MSE and MAE for a regression task), and the parts a click-prediction recipe returns."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.functional import binary_cross_entropy_with_logits
from torchmetrics import Metric

from recipes import ConfigError, DataReader, RecipeContext, RecipeParts, Validation
from recsys.click.batch import CTRBatch
from recsys.click.metric_columns import MetricColumns, metric_columns, row_ids
from recsys.click.models import TaskModel
from recsys.click.tasks import Task
from units import (
    Accuracy,
    BinaryAUC,
    BinaryAveragePrecision,
    Calibration,
    EvalUnit,
    GroupedAUC,
    LogLoss,
    MeanAbsoluteError,
    MeanSquaredError,
    MetricBag,
    NormalizedEntropy,
    PositiveRate,
    SlicedCalibration,
    SlicedNormalizedEntropy,
    TooManySlicesError,
    TrainUnit,
)


def task_losses(logits: torch.Tensor, labels: torch.Tensor, tasks: Sequence[Task]) -> torch.Tensor:
    """The loss of every sample, ``[B]``: over the tasks (the columns of ``logits`` and ``labels``, ``[B, T]``, or
    ``[B]`` for one), the ``weight``-weighted sum of each task's BCE of its logit (binary) or squared error of its
    output (regression)."""
    logits, labels = logits.float().reshape(len(labels), -1), labels.reshape(len(labels), -1)
    total = torch.zeros(len(labels), dtype=torch.float32, device=logits.device)
    for t, task in enumerate(tasks):
        if task.binary:
            loss = binary_cross_entropy_with_logits(logits[:, t], labels[:, t], reduction="none")
        else:
            loss = (logits[:, t] - labels[:, t]).square()
        total = total + task.weight * loss
    return total


class _Tasks:
    """The tasks of a unit: the one binary label, whose metrics keep their bare names (``auc``) and whose
    predictions are ``label`` and ``score``, or those of ``dataset.labels``, whose names prefix theirs (``<task>/auc``,
    ``<task>_score``)."""

    def __init__(self, tasks: Sequence[Task] | None) -> None:
        self.named = tasks is not None
        self.tasks = list(tasks) if tasks is not None else [Task("")]

    def metric(self, task: Task, name: str) -> str:
        return f"{task.name}/{name}" if self.named else name

    def column(self, task: Task, name: str) -> str:
        return f"{task.name}_{name}" if self.named else name

    def split(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        """The tasks' columns of ``tensor`` (``[B, T]``, or ``[B]`` for one task)."""
        return list(tensor.reshape(len(tensor), -1).unbind(1)) if len(self.tasks) > 1 else [tensor.reshape(-1)]


class CTRTrainUnit(TrainUnit[CTRBatch]):
    """The loss of each of the batch's samples, unreduced: one target per sample (BCE; with ``tasks``, their
    weighted sum, ``task_losses``)."""

    def __init__(
        self, model: nn.Module, metric_bag: MetricBag, device: torch.device, tasks: Sequence[Task] | None = None
    ) -> None:
        super().__init__(model, metric_bag)
        self._device = device
        self._tasks = _Tasks(tasks)
        for task in self._tasks.tasks:
            if task.binary:
                metric_bag.register(self._tasks.metric(task, "accuracy"), Accuracy())

    def __call__(self, batch: CTRBatch) -> torch.Tensor:
        batch = batch.to(self._device)
        logits = self.model(batch)
        if not self._tasks.named:
            loss = binary_cross_entropy_with_logits(logits.float(), batch.labels, reduction="none")
        else:
            loss = task_losses(logits, batch.labels, self._tasks.tasks)
        detached = self._tasks.split(logits.detach())
        for task, task_logits, labels in zip(self._tasks.tasks, detached, self._tasks.split(batch.labels)):
            if task.binary:
                num_correct = ((task_logits > 0).float() == labels).sum()
                accuracy = self.metric_bag[self._tasks.metric(task, "accuracy")]
                accuracy.update(num_correct / max(batch.batch_size, 1), weight=batch.batch_size)
        return loss


class CTREvalUnit(EvalUnit[CTRBatch]):
    """The standard click-prediction metrics, each reduced exactly over the data-parallel ranks.

    Every metric is updated on every batch, an empty one included (a rank may run out of rows
    in the last step): a metric some rank never updated is left out of the results.

    With ``columns.group_by``, ``gauc`` and ``gauc_groups`` group the rows by that feature's ids;
    with ``columns.slice_by``, ``ne/<value>`` and ``calibration/<value>`` slice them by that one's.

    With ``tasks`` (``dataset.labels``), each binary task has these metrics under its name (``<task>/auc``), and
    each regression task ``<task>/mse`` and ``<task>/mae`` of its outputs as they are.
    """

    def __init__(
        self,
        model: nn.Module,
        metric_bag: MetricBag,
        device: torch.device,
        name: str = "valid",
        columns: MetricColumns | None = None,
        tasks: Sequence[Task] | None = None,
    ) -> None:
        super().__init__(model, metric_bag, name)
        self._device = device
        self._columns = columns or MetricColumns()
        self._tasks = _Tasks(tasks)
        for task in self._tasks.tasks:
            for metric, make in self._metrics(task).items():
                metric_bag.register(self._tasks.metric(task, metric), make())

    def _metrics(self, task: Task) -> dict[str, Callable[[], Metric]]:
        if not task.binary:
            return {"mse": MeanSquaredError, "mae": MeanAbsoluteError}
        metrics: dict[str, Callable[[], Metric]] = {
            "auc": BinaryAUC,
            "pr_auc": BinaryAveragePrecision,
            "log_loss": LogLoss,
            "ne": NormalizedEntropy,
            "calibration": Calibration,
            "positive_rate": PositiveRate,
            "accuracy": Accuracy,
        }
        if self._columns.group_by is not None:
            metrics["gauc"] = GroupedAUC
        if (slice_by := self._columns.slice_by) is not None:
            names = self._columns.slice_names
            metrics["ne/"] = lambda: SlicedNormalizedEntropy(slice_by, names)
            metrics["calibration/"] = lambda: SlicedCalibration(slice_by, names)
        return metrics

    def __call__(self, batch: CTRBatch) -> None:
        self.predict(batch)

    def predict(self, batch: CTRBatch) -> dict[str, torch.Tensor]:
        """Update the metrics; the label and predicted probability (a regression task's prediction) of every
        example, per task."""
        batch = batch.to(self._device)
        # Taken before the model runs, which may look the ids up in place.
        groups = None if self._columns.group_by is None else row_ids(batch, self._columns.group_by)
        slices = None if self._columns.slice_by is None else row_ids(batch, self._columns.slice_by)
        outputs = self.model(batch).float()
        columns: dict[str, torch.Tensor] = {}
        for task, logits, labels in zip(self._tasks.tasks, self._tasks.split(outputs), self._tasks.split(batch.labels)):
            if task.binary:
                scores = self._update_binary(task, logits, labels, groups, slices)
            else:
                scores = logits
                for name in ("mse", "mae"):
                    self.metric_bag[self._tasks.metric(task, name)].update(logits, labels)
            columns[self._tasks.column(task, "label")] = labels
            columns[self._tasks.column(task, "score")] = scores
        return columns

    def _update_binary(
        self,
        task: Task,
        logits: torch.Tensor,
        labels: torch.Tensor,
        groups: torch.Tensor | None,
        slices: torch.Tensor | None,
    ) -> torch.Tensor:
        """Update a binary task's metrics; its probabilities."""
        bag, key = self.metric_bag, lambda name: self._tasks.metric(task, name)
        probabilities = torch.sigmoid(logits)
        bag[key("auc")].update(probabilities, labels.long())
        bag[key("pr_auc")].update(probabilities, labels.long())
        for name in ("log_loss", "ne", "calibration"):
            bag[key(name)].update(logits, labels)
        bag[key("positive_rate")].update(labels)
        num_correct = ((logits > 0).float() == labels).sum()
        bag[key("accuracy")].update(num_correct / max(len(labels), 1), weight=len(labels))
        if groups is not None:
            bag[key("gauc")].update(probabilities, labels, groups)
        if slices is not None:
            try:
                for name in ("ne/", "calibration/"):
                    bag[key(name)].update(logits, labels, slices)
            except TooManySlicesError as error:
                raise ConfigError(str(error)) from None
        return probabilities


def click_prediction_parts(
    context: RecipeContext[Any],
    model: nn.Module,
    train_reader: DataReader[CTRBatch],
    valid_reader: DataReader[CTRBatch],
    splits: Mapping[str, DataReader[CTRBatch]] | None = None,
    columns: Mapping[str, int | None] | None = None,
    slice_names: Mapping[int, str] | None = None,
    tasks: Sequence[Task] | None = None,
) -> RecipeParts:
    """The parts of a click-prediction recipe: BCE for training, AUC and friends for validation and
    the further ``splits`` (such as ``test``) that ``eval`` and ``predict`` may score.

    ``columns`` are the single-valued sparse features that ``metrics.group_by`` and ``metrics.slice_by``
    may name, each with its number of values where known (``recsys.click.metric_columns``); ``slice_names``
    names slice ids. The framework finds the model's sparse tables itself and steps them beside the dense
    layers.
    """
    dp, device = context.gangs.dp, context.device
    grouping = metric_columns(context.config, columns or {}, slice_names)
    if tasks is not None and isinstance(model, TaskModel):
        model.tasks = tuple(tasks)
    evaluation = CTREvalUnit(model, MetricBag(dp), device, columns=grouping, tasks=tasks)
    return RecipeParts(
        train_unit=CTRTrainUnit(model, MetricBag(dp), device, tasks),
        train_reader=train_reader,
        validations=[Validation(evaluation, valid_reader)],
        splits=dict(splits or {}),
    )
