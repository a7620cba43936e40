"""Matrix factorisation of MovieLens ratings, with sparse embedding tables."""

from dataclasses import dataclass, field
from importlib.resources import files

import numpy as np
import torch
from torch import nn
from torch.nn.functional import binary_cross_entropy_with_logits

from embedding import JaggedIds, SparseFeatures
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
from recsys.models.embeddings import EmbeddingSection, TableSpec, build_embeddings
from units import BinaryAUC, EvalUnit, LogLoss, MetricBag, NormalizedEntropy, TrainUnit

Batch = tuple[SparseFeatures, torch.Tensor]
SHIPPED_RATINGS = str(files("recsys.builtin.movielens") / "ml-latest-small" / "ratings.csv")


@dataclass
class DataSection:
    ratings: str = SHIPPED_RATINGS  # a MovieLens ratings.csv: userId,movieId,rating,timestamp
    valid_fraction: float = 0.2
    batch_size: GlobalBatchSize = 1024  # split over the data-parallel ranks (checked at the first step)


@dataclass
class MFConfig(RecipeConfig):
    data: DataSection = field(default_factory=DataSection)
    embeddings: EmbeddingSection = field(default_factory=EmbeddingSection)


class MatrixFactorization(nn.Module):
    """The click logit of a (user, movie) pair: the dot product of their embeddings, plus a bias."""

    def __init__(self, tables: nn.Module) -> None:
        super().__init__()
        self.tables = tables
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, features: SparseFeatures) -> torch.Tensor:
        vectors = self.tables(features)
        return (vectors["user"] * vectors["movie"]).sum(1) + self.bias


class RatingsReader(InMemoryReader[Batch]):
    def __init__(
        self, users: torch.Tensor, movies: torch.Tensor, clicks: torch.Tensor, context: RecipeContext, train: bool
    ) -> None:
        def make_batch(rows: torch.Tensor) -> Batch:
            ids = {"user": JaggedIds.from_dense(users[rows, None]), "movie": JaggedIds.from_dense(movies[rows, None])}
            return SparseFeatures(ids), clicks[rows]

        super().__init__(
            make_batch,
            num_samples=len(clicks),
            batch_size=per_rank_batch_size(context.config.data.batch_size, context.gangs.dp.size),
            num_accumulate=context.config.trainer.grad_accumulation if train else 1,
            dp_rank=context.gangs.dp.rank,
            dp_size=context.gangs.dp.size,
            shuffle=train,
            seed=context.config.seed,
            drop_last=train,  # validation scores every row: the last partial step too
        )


class ClickTrainUnit(TrainUnit[Batch]):
    def __call__(self, batch: Batch) -> torch.Tensor:
        features, clicks = batch
        return binary_cross_entropy_with_logits(self.model(features), clicks, reduction="none")


class ClickEvalUnit(EvalUnit[Batch]):
    def __init__(self, model: nn.Module, metric_bag: MetricBag) -> None:
        super().__init__(model, metric_bag)
        metric_bag.register("auc", BinaryAUC())
        metric_bag.register("log_loss", LogLoss())
        metric_bag.register("ne", NormalizedEntropy())

    def __call__(self, batch: Batch) -> None:
        features, clicks = batch
        logits = self.model(features)
        self.metric_bag["auc"].update(torch.sigmoid(logits), clicks.long())
        self.metric_bag["log_loss"].update(logits, clicks)
        self.metric_bag["ne"].update(logits, clicks)


@register_recipe("mf", MFConfig, "Matrix factorisation of MovieLens ratings (rating >= 4 is a click).")
def build_mf(context: RecipeContext[MFConfig]) -> RecipeParts:
    data = context.config.data
    ratings = np.loadtxt(data.ratings, delimiter=",", skiprows=1)
    users = torch.from_numpy(np.unique(ratings[:, 0], return_inverse=True)[1])
    movies = torch.from_numpy(np.unique(ratings[:, 1], return_inverse=True)[1])
    clicks = torch.from_numpy(ratings[:, 2] >= 4).float()
    order = torch.randperm(len(clicks), generator=torch.Generator().manual_seed(0))
    num_valid = int(len(clicks) * data.valid_fraction)
    valid, train = order[:num_valid], order[num_valid:]

    tables = build_embeddings(
        context.config.embeddings,
        [TableSpec("user", int(users.max()) + 1, ("user",)), TableSpec("movie", int(movies.max()) + 1, ("movie",))],
        context.gangs.dp,
        context.config.seed,
    )
    model = MatrixFactorization(tables).to(context.device)
    dp = context.gangs.dp
    return RecipeParts(
        train_unit=ClickTrainUnit(model, MetricBag(dp)),
        train_reader=RatingsReader(users[train], movies[train], clicks[train], context, train=True),
        validations=[
            Validation(
                ClickEvalUnit(model, MetricBag(dp)),
                RatingsReader(users[valid], movies[valid], clicks[valid], context, train=False),
            )
        ],
    )
