"""Units for binary click prediction (BCE loss for training; AUC, log loss, NE, calibration, PR-AUC and
the positive rate for validation), and the parts a click-prediction recipe returns."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.nn.functional import binary_cross_entropy_with_logits

from recipes import DataReader, RecipeContext, RecipeParts, Validation
from recsys.click.batch import CTRBatch
from units import (
    BinaryAUC,
    BinaryAveragePrecision,
    Calibration,
    EvalUnit,
    LogLoss,
    Mean,
    MetricBag,
    NormalizedEntropy,
    PositiveRate,
    TrainUnit,
)


class CTRTrainUnit(TrainUnit[CTRBatch]):
    """Summed BCE over the batch's samples; one target per sample."""

    def __init__(self, model: nn.Module, metric_bag: MetricBag, device: torch.device) -> None:
        super().__init__(model, metric_bag)
        self._device = device
        metric_bag.register("accuracy", Mean())

    def __call__(self, batch: CTRBatch) -> tuple[torch.Tensor, int]:
        batch = batch.to(self._device)
        logits = self.model(batch)
        loss = binary_cross_entropy_with_logits(logits.float(), batch.labels, reduction="sum")
        num_correct = ((logits.detach() > 0).float() == batch.labels).sum()
        self.metric_bag["accuracy"].update(num_correct / max(batch.batch_size, 1), weight=batch.batch_size)
        return loss, batch.batch_size


class CTREvalUnit(EvalUnit[CTRBatch]):
    """The standard click-prediction metrics, each reduced exactly over the data-parallel ranks.

    Every metric is updated on every batch, an empty one included (a rank may run out of rows
    in the last step): a metric some rank never updated is left out of the results.
    """

    def __init__(self, model: nn.Module, metric_bag: MetricBag, device: torch.device, name: str = "valid") -> None:
        super().__init__(model, metric_bag, name)
        self._device = device
        metric_bag.register("auc", BinaryAUC())
        metric_bag.register("pr_auc", BinaryAveragePrecision())
        metric_bag.register("log_loss", LogLoss())
        metric_bag.register("ne", NormalizedEntropy())
        metric_bag.register("calibration", Calibration())
        metric_bag.register("positive_rate", PositiveRate())
        metric_bag.register("accuracy", Mean())

    def __call__(self, batch: CTRBatch) -> None:
        self.predict(batch)

    def predict(self, batch: CTRBatch) -> dict[str, torch.Tensor]:
        """Update the metrics; the click label and predicted probability of every example."""
        batch = batch.to(self._device)
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
        return {"label": labels, "score": probabilities}


def click_prediction_parts(
    context: RecipeContext[Any],
    model: nn.Module,
    train_reader: DataReader[CTRBatch],
    valid_reader: DataReader[CTRBatch],
    splits: Mapping[str, DataReader[CTRBatch]] | None = None,
) -> RecipeParts:
    """The parts of a click-prediction recipe: BCE for training, AUC and friends for validation and
    the further ``splits`` (such as ``test``) that ``eval`` and ``predict`` may score.

    The framework finds the model's sparse tables itself and steps them beside the dense layers.
    """
    dp, device = context.gangs.dp, context.device
    return RecipeParts(
        train_unit=CTRTrainUnit(model, MetricBag(dp), device),
        train_reader=train_reader,
        validations=[Validation(CTREvalUnit(model, MetricBag(dp), device), valid_reader)],
        splits=dict(splits or {}),
    )
