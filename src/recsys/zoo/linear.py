"""The linear end of the zoo: logistic regression, the factorization machine and DeepFM.

A feature is one field: a multi-hot feature's ids are pooled by its table (sum or mean) into one
vector before any interaction, so its own ids never interact with each other, only with other
fields (the field-level FM of DeepFM and DCN-v2, not Rendle's per-id one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from recipes import megatron_mlp_plan
from recsys.click.models import FIRST_ORDER, VECTORS, Pooled, PooledModel, mlp_with_dropout, plus_shared, task_logits
from recsys.zoo.zoo_model import ZOO_MODELS, DeepModelConfig, ModelInputs, OneDimTables, ZooModelConfig, stack_fields

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


class DenseLinear(nn.Module):
    """``x w + b`` over the dense features, from zero: the linear model's optimum does not depend on where it
    starts, and zero lets a model without dense features (``[B, 0]``) keep just its bias."""

    def __init__(self, num_dense: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_dense))
        self.bias = nn.Parameter(torch.zeros(()))

    def forward(self, dense: torch.Tensor) -> torch.Tensor:
        return dense @ self.weight + self.bias


def fm_interaction(vectors: torch.Tensor) -> torch.Tensor:
    """``sum_{i<j} <v_i, v_j>`` of ``[B, n, d]`` vectors, ``[B]``, in ``O(n d)`` rather than ``O(n^2 d)``:
    half of the square of the sum less the sum of the squares (Rendle, Factorization Machines, ICDM 2010)."""
    summed = vectors.sum(dim=1)
    return 0.5 * (summed.square() - vectors.square().sum(dim=1)).sum(dim=1)


class LogisticRegression(PooledModel):
    """A weight per id and per dense feature, and a bias: the baseline every CTR model must beat.

    The weights are dim-1 tables that start at zero, so a hashed id space of any size costs one
    float per row and an id never seen in training scores as absent.
    """

    def __init__(self, first_order: nn.Module, features: list[str], num_dense: int) -> None:
        super().__init__()
        self.first_order = first_order
        self.features = features
        self.num_dense = num_dense
        self.dense = DenseLinear(num_dense)

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        return {}  # Weights per id and a bias: nothing to split.

    def lookups(self) -> dict[str, tuple[nn.Module, list[str]]]:
        return {FIRST_ORDER: (self.first_order, self.features)}

    def dense_logits(self, dense: torch.Tensor, pooled: Pooled) -> torch.Tensor:
        weights = stack_fields(pooled[FIRST_ORDER], self.features)
        logits: torch.Tensor = self.dense(dense) + weights.sum(dim=(1, 2))
        return logits


class FM(PooledModel):
    """Logistic regression plus every pairwise interaction of the fields' vectors (Rendle, ICDM 2010).

    Dense features enter as Rendle's real-valued inputs do: dense feature ``j`` has a weight ``w_j``
    (the linear term) and a vector ``v_j``, and takes part in the pairwise term as ``x_j v_j``, so that
    it interacts with every categorical field (a count with a user, say), not only adds to the logit.
    """

    def __init__(
        self, first_order: nn.Module, embeddings: nn.Module, features: list[str], num_dense: int, dim: int
    ) -> None:
        super().__init__()
        self.first_order = first_order
        self.embeddings = embeddings
        self.features = features
        self.num_dense = num_dense
        self.dense = DenseLinear(num_dense)
        # Small, as the tables start: interactions begin near zero and the linear terms lead early on.
        self.dense_vectors = nn.Parameter(torch.randn(num_dense, dim) * 0.01)

    def fm_logits(self, dense: torch.Tensor, pooled: Pooled) -> tuple[torch.Tensor, torch.Tensor]:
        """The FM's logit ``[B]`` and the fields' vectors ``[B, F, dim]`` (for DeepFM's deep part to share)."""
        weights = stack_fields(pooled[FIRST_ORDER], self.features)
        fields = stack_fields(pooled[VECTORS], self.features)
        dense_fields = dense.unsqueeze(2) * self.dense_vectors
        interaction = fm_interaction(torch.cat([dense_fields, fields], dim=1))
        logits = self.dense(dense) + weights.sum(dim=(1, 2)) + interaction
        return logits, fields

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        return {}  # A sum of products: nothing to split.

    def lookups(self) -> dict[str, tuple[nn.Module, list[str]]]:
        return {FIRST_ORDER: (self.first_order, self.features), VECTORS: (self.embeddings, self.features)}

    def dense_logits(self, dense: torch.Tensor, pooled: Pooled) -> torch.Tensor:
        return self.fm_logits(dense, pooled)[0]


class DeepFM(FM):
    """An FM and an MLP over the same field vectors, their logits summed (Guo et al., DeepFM, IJCAI 2017).

    The FM catches the second-order interactions that an MLP learns poorly from products, the MLP
    the higher-order ones; sharing the vectors means no separate pre-training, unlike FNN. With several tasks,
    the MLP has an output per task and the FM's logit is every task's.
    """

    def __init__(
        self,
        first_order: nn.Module,
        embeddings: nn.Module,
        features: list[str],
        num_dense: int,
        dim: int,
        hidden_dims: list[int],
        dropout: float,
        num_tasks: int = 1,
    ) -> None:
        super().__init__(first_order, embeddings, features, num_dense, dim)
        self.mlp = mlp_with_dropout(num_dense + dim * len(features), hidden_dims, num_tasks, dropout)

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        return megatron_mlp_plan(self.mlp, "mlp")

    def dense_logits(self, dense: torch.Tensor, pooled: Pooled) -> torch.Tensor:
        fm, fields = self.fm_logits(dense, pooled)
        return plus_shared(fm, task_logits(self.mlp(torch.cat([dense, fields.flatten(1)], dim=1))))


@dataclass
class LinearModelConfig(OneDimTables, ZooModelConfig):
    """``logistic_regression`` (dim-1 tables only) and ``fm`` (dot products of one dim)."""


@dataclass
class DeepFMConfig(OneDimTables, DeepModelConfig):
    """DeepFM's MLP and FM share the vectors, whose dot products need one dim."""


@ZOO_MODELS.register("logistic_regression", LinearModelConfig)
def logistic_regression(config: ZooModelConfig, inputs: ModelInputs) -> nn.Module:
    return LogisticRegression(inputs.first_order(config.embeddings), inputs.features, inputs.num_dense)


@ZOO_MODELS.register("fm", LinearModelConfig)
def fm(config: ZooModelConfig, inputs: ModelInputs) -> nn.Module:
    section = config.embeddings
    return FM(inputs.first_order(section), inputs.vectors(section), inputs.features, inputs.num_dense, section.dim)


@ZOO_MODELS.register("deepfm", DeepFMConfig)
def deepfm(config: DeepFMConfig, inputs: ModelInputs) -> nn.Module:
    section = config.embeddings
    first_order, vectors = inputs.first_order(section), inputs.vectors(section)
    deep = (config.hidden_dims, config.dropout)
    return DeepFM(first_order, vectors, inputs.features, inputs.num_dense, section.dim, *deep, inputs.num_tasks)
