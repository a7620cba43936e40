"""Units for binary click prediction (BCE loss for training; AUC, log loss, NE, calibration, PR-AUC and
the positive rate for validation, with GAUC by group and NE and calibration by slice where the config
asks), and the parts a click-prediction recipe returns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.functional import binary_cross_entropy_with_logits

from recipes import ConfigError, DataReader, RecipeContext, RecipeParts, Validation
from recsys.click.batch import CTRBatch
from recsys.click.metric_columns import MetricColumns, metric_columns, row_ids
from units import (
    Accuracy,
    BinaryAUC,
    BinaryAveragePrecision,
    Calibration,
    EvalUnit,
    GroupedAUC,
    LogLoss,
    MetricBag,
    NormalizedEntropy,
    PositiveRate,
    SlicedCalibration,
    SlicedNormalizedEntropy,
    TooManySlicesError,
    TrainUnit,
)


class CTRTrainUnit(TrainUnit[CTRBatch]):
    """BCE of each of the batch's samples, unreduced: one target per sample."""

    def __init__(self, model: nn.Module, metric_bag: MetricBag, device: torch.device) -> None:
        super().__init__(model, metric_bag)
        self._device = device
        metric_bag.register("accuracy", Accuracy())

    def __call__(self, batch: CTRBatch) -> torch.Tensor:
        batch = batch.to(self._device)
        logits = self.model(batch)
        loss = binary_cross_entropy_with_logits(logits.float(), batch.labels, reduction="none")
        num_correct = ((logits.detach() > 0).float() == batch.labels).sum()
        self.metric_bag["accuracy"].update(num_correct / max(batch.batch_size, 1), weight=batch.batch_size)
        return loss


class CTREvalUnit(EvalUnit[CTRBatch]):
    """The standard click-prediction metrics, each reduced exactly over the data-parallel ranks.

    Every metric is updated on every batch, an empty one included (a rank may run out of rows
    in the last step): a metric some rank never updated is left out of the results.

    With ``columns.group_by``, ``gauc`` and ``gauc_groups`` group the rows by that feature's ids;
    with ``columns.slice_by``, ``ne/<value>`` and ``calibration/<value>`` slice them by that one's.
    """

    def __init__(
        self,
        model: nn.Module,
        metric_bag: MetricBag,
        device: torch.device,
        name: str = "valid",
        columns: MetricColumns | None = None,
    ) -> None:
        super().__init__(model, metric_bag, name)
        self._device = device
        self._columns = columns or MetricColumns()
        metric_bag.register("auc", BinaryAUC())
        metric_bag.register("pr_auc", BinaryAveragePrecision())
        metric_bag.register("log_loss", LogLoss())
        metric_bag.register("ne", NormalizedEntropy())
        metric_bag.register("calibration", Calibration())
        metric_bag.register("positive_rate", PositiveRate())
        metric_bag.register("accuracy", Accuracy())
        if self._columns.group_by is not None:
            metric_bag.register("gauc", GroupedAUC())
        if (slice_by := self._columns.slice_by) is not None:
            metric_bag.register("ne/", SlicedNormalizedEntropy(slice_by, self._columns.slice_names))
            metric_bag.register("calibration/", SlicedCalibration(slice_by, self._columns.slice_names))

    def __call__(self, batch: CTRBatch) -> None:
        self.predict(batch)

    def predict(self, batch: CTRBatch) -> dict[str, torch.Tensor]:
        """Update the metrics; the click label and predicted probability of every example."""
        batch = batch.to(self._device)
        # Taken before the model runs, which may look the ids up in place.
        groups = None if self._columns.group_by is None else row_ids(batch, self._columns.group_by)
        slices = None if self._columns.slice_by is None else row_ids(batch, self._columns.slice_by)
        logits = self.model(batch).float()
        labels = batch.labels
        probabilities = torch.sigmoid(logits)
        self.metric_bag["auc"].update(probabilities, labels.long())
        self.metric_bag["pr_auc"].update(probabilities, labels.long())
        for name in ("log_loss", "ne", "calibration"):
            self.metric_bag[name].update(logits, labels)
        self.metric_bag["positive_rate"].update(labels)
        num_correct = ((logits > 0).float() == labels).sum()
        self.metric_bag["accuracy"].update(num_correct / max(batch.batch_size, 1), weight=batch.batch_size)
        if groups is not None:
            self.metric_bag["gauc"].update(probabilities, labels, groups)
        if slices is not None:
            try:
                for name in ("ne/", "calibration/"):
                    self.metric_bag[name].update(logits, labels, slices)
            except TooManySlicesError as error:
                raise ConfigError(str(error)) from None
        return {"label": labels, "score": probabilities}


def click_prediction_parts(
    context: RecipeContext[Any],
    model: nn.Module,
    train_reader: DataReader[CTRBatch],
    valid_reader: DataReader[CTRBatch],
    splits: Mapping[str, DataReader[CTRBatch]] | None = None,
    columns: Mapping[str, int | None] | None = None,
    slice_names: Mapping[int, str] | None = None,
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
    return RecipeParts(
        train_unit=CTRTrainUnit(model, MetricBag(dp), device),
        train_reader=train_reader,
        validations=[Validation(CTREvalUnit(model, MetricBag(dp), device, columns=grouping), valid_reader)],
        splits=dict(splits or {}),
    )
