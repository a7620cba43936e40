"""A tiny linear regression for the Trainer's tests: 64 samples of 3 features, a squared-error unit (NaN at
chosen steps) and an evaluation unit that reports the next value of a known sequence as its ``score``."""

from __future__ import annotations

import torch
from torch import nn

from gang import FakeGang
from recipes.training.protocols import Validation
from recsys.data.memory import InMemoryReader
from units import EvalUnit, Mean, MetricBag, TrainUnit

Batch = tuple[torch.Tensor, torch.Tensor]
NUM_FEATURES = 3
generator = torch.Generator().manual_seed(0)
FEATURES = torch.randn(64, NUM_FEATURES, generator=generator)
TARGETS = FEATURES @ torch.tensor([1.0, -2.0, 0.5]) + 0.3


def reader(batch_size: int, num_accumulate: int = 1, num_samples: int = 64) -> InMemoryReader[Batch]:
    return InMemoryReader(
        lambda rows: (FEATURES[rows], TARGETS[rows]), num_samples, batch_size, num_accumulate, shuffle=False
    )


class SquaredErrorUnit(TrainUnit[Batch]):
    """Squared error of each target; ``nan_at_steps`` turns the loss of those steps into NaN."""

    def __init__(self, model: nn.Module, nan_at_steps: frozenset[int] = frozenset()) -> None:
        super().__init__(model, MetricBag(FakeGang()))
        self._nan_at_steps = nan_at_steps

    def __call__(self, batch: Batch) -> torch.Tensor:
        features, targets = batch
        loss = (self.model(features).squeeze(1) - targets) ** 2
        if self.step_nr in self._nan_at_steps:
            loss = loss * float("nan")
        return loss


class SequenceEvalUnit(EvalUnit[Batch]):
    """Reports ``score`` = the next value of a known sequence at each validation (one batch each)."""

    def __init__(self, model: nn.Module, scores: list[float]) -> None:
        super().__init__(model, MetricBag(FakeGang()))
        self.metric_bag.register("score", Mean())
        self._scores = iter(scores)

    def __call__(self, batch: Batch) -> None:
        self.metric_bag["score"].update(torch.tensor(next(self._scores)))


def linear_model() -> nn.Linear:
    torch.manual_seed(1)
    return nn.Linear(NUM_FEATURES, 1)


def sequence_validation(model: nn.Module, scores: list[float]) -> Validation[Batch]:
    return Validation(SequenceEvalUnit(model, scores), reader(batch_size=8, num_samples=8))
