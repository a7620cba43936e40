"""Units for binary click prediction: BCE loss for training, AUC and log-loss for validation."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.functional import binary_cross_entropy_with_logits

from recipes.data.batch import CTRBatch
from units import BinaryAUC, EvalUnit, Mean, MetricBag, TrainUnit


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
        correct = ((logits.detach() > 0).float() == batch.labels).float()
        self.metric_bag["accuracy"].update(correct.mean(), weight=batch.batch_size)
        return loss, batch.batch_size


class CTREvalUnit(EvalUnit[CTRBatch]):
    """AUC, log-loss and accuracy of the click predictions."""

    def __init__(self, model: nn.Module, metric_bag: MetricBag, device: torch.device, name: str = "valid") -> None:
        super().__init__(model, metric_bag, name)
        self._device = device
        metric_bag.register("auc", BinaryAUC())
        metric_bag.register("log_loss", Mean())
        metric_bag.register("accuracy", Mean())

    def __call__(self, batch: CTRBatch) -> None:
        batch = batch.to(self._device)
        logits = self.model(batch).float()
        loss = binary_cross_entropy_with_logits(logits, batch.labels, reduction="mean")
        self.metric_bag["auc"].update(torch.sigmoid(logits), batch.labels.long())
        self.metric_bag["log_loss"].update(loss, weight=batch.batch_size)
        self.metric_bag["accuracy"].update(
            ((logits > 0).float() == batch.labels).float().mean(), weight=batch.batch_size
        )
