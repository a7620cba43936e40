"""Linear regression on synthetic data: a recipe of my own."""

from dataclasses import dataclass, field

import torch
from torch import nn

from recipes import (
    GlobalBatchSize,
    RecipeConfig,
    RecipeContext,
    RecipeParts,
    Validation,
    per_rank_batch_size,
    register_recipe,
)
from recsys.data.memory import InMemoryReader
from units import EvalUnit, Mean, MetricBag, TrainUnit

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class DataSection:
    num_features: int = 8
    num_samples: int = 4096
    batch_size: GlobalBatchSize = 64  # split over the data-parallel ranks (checked at the first step)
    noise: float = 0.1


@dataclass
class LinRegConfig(RecipeConfig):
    data: DataSection = field(default_factory=DataSection)


class RegressionReader(InMemoryReader[Batch]):
    """This rank's share of (features, targets) batches, reshuffled every epoch."""

    def __init__(self, features: torch.Tensor, targets: torch.Tensor, context: RecipeContext, shuffle: bool) -> None:
        def make_batch(rows: torch.Tensor) -> Batch:
            return features[rows].to(context.device), targets[rows].to(context.device)

        super().__init__(
            make_batch,
            num_samples=len(targets),
            batch_size=per_rank_batch_size(context.config.data.batch_size, context.gangs.dp.size),
            num_accumulate=context.config.trainer.grad_accumulation if shuffle else 1,
            dp_rank=context.gangs.dp.rank,
            dp_size=context.gangs.dp.size,
            shuffle=shuffle,
            seed=context.config.seed,
            drop_last=shuffle,  # validation scores every row, the last partial batch too
        )


class RegressionTrainUnit(TrainUnit[Batch]):
    def __call__(self, batch: Batch) -> torch.Tensor:
        features, targets = batch
        return (self.model(features).squeeze(1) - targets) ** 2  # One loss per target: the Trainer sums them.


class RegressionEvalUnit(EvalUnit[Batch]):
    def __init__(self, model: nn.Module, metric_bag: MetricBag) -> None:
        super().__init__(model, metric_bag)
        metric_bag.register("mse", Mean())

    def __call__(self, batch: Batch) -> None:
        features, targets = batch
        errors = (self.model(features).squeeze(1) - targets) ** 2
        self.metric_bag["mse"].update(errors.mean(), weight=len(targets))


@register_recipe("linreg", LinRegConfig, "Linear regression on synthetic data.")
def build_linreg(context: RecipeContext[LinRegConfig]) -> RecipeParts:
    data = context.config.data
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(data.num_samples, data.num_features, generator=generator)
    true_weights = torch.randn(data.num_features, generator=generator)
    targets = features @ true_weights + data.noise * torch.randn(data.num_samples, generator=generator)
    split = data.num_samples * 3 // 4

    model = nn.Linear(data.num_features, 1).to(context.device)
    dp = context.gangs.dp
    return RecipeParts(
        train_unit=RegressionTrainUnit(model, MetricBag(dp)),
        train_reader=RegressionReader(features[:split], targets[:split], context, shuffle=True),
        validations=[
            Validation(
                RegressionEvalUnit(model, MetricBag(dp)),
                RegressionReader(features[split:], targets[split:], context, shuffle=False),
            )
        ],
    )
