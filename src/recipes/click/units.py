"""Units for binary click prediction (BCE loss for training, AUC and log-loss for validation), and the
parts a click-prediction recipe returns."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.functional import binary_cross_entropy_with_logits
from torch.optim import Optimizer

from embedding import CombinedOptimizer, ShardedEmbeddingCollection, SparseOptimizer
from recipes.click.batch import CTRBatch
from recipes.data.reader import DataReader
from recipes.models.embeddings import EmbeddingSection
from recipes.parts import RecipeContext, RecipeParts, build_optimizer
from recipes.protocols import ShardedStateful, Validation
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


def click_prediction_parts(
    context: RecipeContext[Any],
    model: nn.Module,
    embeddings: nn.Module,
    embedding_section: EmbeddingSection,
    train_reader: DataReader[CTRBatch],
    valid_reader: DataReader[CTRBatch],
) -> RecipeParts:
    """The parts every built-in click-prediction recipe shares: BCE/AUC units, and an optimizer that
    steps the dense layers with the ``optimizer`` section and sparse tables with their fused one."""
    dp, device = context.gangs.dp, context.device

    def make_optimizer(wrapped: nn.Module) -> Optimizer:
        dense = build_optimizer(context.config.optimizer, wrapped.parameters())
        if isinstance(embeddings, ShardedEmbeddingCollection):
            return CombinedOptimizer(dense, SparseOptimizer(embeddings, embedding_section.sparse_optimizer.to_config()))
        return dense

    # Dense tables are parameters of the model; sparse ones are checkpointed as sharded state.
    sharded_state: dict[str, ShardedStateful] = {}
    if isinstance(embeddings, ShardedEmbeddingCollection):
        sharded_state["embeddings"] = embeddings

    return RecipeParts(
        train_unit=CTRTrainUnit(model, MetricBag(dp), device),
        train_reader=train_reader,
        validations=[Validation(CTREvalUnit(model, MetricBag(dp), device), valid_reader)],
        make_optimizer=make_optimizer,
        sharded_state=sharded_state,
    )
