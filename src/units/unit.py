"""The units a user writes: what one batch means for training and for validation.

The Trainer owns the loop (when to step, validate, publish, stop); a unit owns only the
model's loss and metrics for one batch. This split, from fairseq2, keeps a new model down
to one small class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, TypeVar

import torch
from torch import nn

from units.metric_bag import MetricBag

BatchT = TypeVar("BatchT")
BatchT_contra = TypeVar("BatchT_contra", contravariant=True)


class TrainUnit(ABC, Generic[BatchT_contra]):
    """Computes the training loss of a batch.

    ``__call__`` returns the loss *unreduced*: one element per target, shape ``[N]`` or ``[N, ...]`` with the
    batch's ``N`` rows first (``binary_cross_entropy_with_logits(logits, labels, reduction="none")``). The
    Trainer sums it and counts its elements itself, and divides the step's sum by the step's count over every
    micro-batch and every data-parallel rank, so that gradient accumulation and data parallelism give the
    gradient of one big batch. Reducing is the Trainer's alone, so a unit cannot reduce wrongly: a mean or a
    sum (torch's default ``reduction``, a 0-dim tensor) is refused at the first step.

    A weighted loss multiplies each target's loss by its weight (``loss * weights``: the step still divides
    by the number of targets); a masked one returns the targets it keeps (``loss[mask]``), which are then the
    ones counted. Where the recipe's config types its train batch size as ``recipes.GlobalBatchSize``, the
    first step also checks that the loss's first dimension is the rank's share of it: a loss that selects its
    targets has no such dimension, so its config keeps a plain ``int``.
    """

    def __init__(self, model: nn.Module, metric_bag: MetricBag) -> None:
        self._model = model
        self._metric_bag = metric_bag
        self._step_nr = 0

    @abstractmethod
    def __call__(self, batch: BatchT_contra) -> torch.Tensor:
        """Return the unreduced loss, one element per target, and update the metric bag."""

    @property
    def model(self) -> nn.Module:
        """The model being trained; the Trainer may wrap it (DDP) and hand the wrapper back."""
        return self._model

    @model.setter
    def model(self, model: nn.Module) -> None:
        self._model = model

    @property
    def metric_bag(self) -> MetricBag:
        return self._metric_bag

    @property
    def step_nr(self) -> int:
        return self._step_nr

    def set_step_nr(self, step_nr: int) -> None:
        """Told by the Trainer before each step, for units whose behaviour depends on it."""
        self._step_nr = step_nr


class EvalUnit(ABC, Generic[BatchT_contra]):
    """Updates validation metrics from a batch.

    ``name`` names the validation in recorders (``tb/<name>``) and in the score metric
    (``<name>/<metric>``).
    """

    def __init__(self, model: nn.Module, metric_bag: MetricBag, name: str = "valid") -> None:
        self._model = model
        self._metric_bag = metric_bag
        self.name = name

    @abstractmethod
    def __call__(self, batch: BatchT_contra) -> None:
        """Update the metric bag from ``batch``."""

    @property
    def model(self) -> nn.Module:
        return self._model

    @model.setter
    def model(self, model: nn.Module) -> None:
        self._model = model

    @property
    def metric_bag(self) -> MetricBag:
        return self._metric_bag


def ran_base_init(unit: TrainUnit[Any] | EvalUnit[Any]) -> bool:
    """Whether ``unit``'s constructor ran its base class's, which sets what the framework reads of it (its model,
    metric bag and name): a subclass whose ``__init__`` forgets ``super().__init__`` fails only where one is first
    read, on an ``AttributeError`` that names no cause."""
    return "_metric_bag" in vars(unit)
