"""The deep end of the zoo: DCN-v2, Wide & Deep, the plain MLP and DLRM."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from components import PositiveInt
from recipes import megatron_mlp_plan
from recsys.click.models import (
    DLRM,
    VECTORS,
    CTRModel,
    Pooled,
    PooledModel,
    mlp_with_dropout,
    plus_shared,
    task_logits,
)
from recsys.zoo.linear import LogisticRegression
from recsys.zoo.zoo_model import ZOO_MODELS, DeepModelConfig, ModelInputs, OneDimTables

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


class CrossLayer(nn.Module):
    """``x0 * (W x + b) + x``: one more order of explicit feature crossing per layer, with the residual
    keeping the lower orders (Wang et al., DCN V2, WWW 2021). ``rank`` factors ``W`` as ``U V^T``."""

    def __init__(self, dim: int, rank: int | None = None) -> None:
        super().__init__()
        self.down = None if rank is None else nn.Linear(dim, rank, bias=False)
        self.up = nn.Linear(dim if rank is None else rank, dim)
        # The paper's initialisation: crosses scaled to their fan, b = 0.
        for layer in (self.down, self.up):
            if layer is not None:
                nn.init.xavier_normal_(layer.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        projected = self.up(x if self.down is None else self.down(x))
        crossed: torch.Tensor = x0 * projected + x
        return crossed


class DCNv2(PooledModel):
    """Cross layers over ``x0 = [dense, field vectors]``, then a deep MLP and a linear head, stacked
    (Wang et al., DCN V2: Improved Deep & Cross Network, WWW 2021).

    The cross network learns bounded-degree interactions explicitly, which an MLP approximates only
    with many parameters; the stacked form feeds them to the MLP for the higher orders.
    """

    def __init__(
        self,
        embeddings: nn.Module,
        features: list[str],
        num_dense: int,
        dims: Sequence[int],
        cross_layers: int,
        cross_rank: int | None,
        hidden_dims: list[int],
        dropout: float,
        num_tasks: int = 1,
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.features = features
        self.num_dense = num_dense
        in_dim = num_dense + sum(dims)
        self.cross = nn.ModuleList([CrossLayer(in_dim, cross_rank) for _ in range(cross_layers)])
        self.mlp = mlp_with_dropout(in_dim, hidden_dims, num_tasks, dropout)

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        return megatron_mlp_plan(self.mlp, "mlp")

    def lookups(self) -> dict[str, tuple[nn.Module, list[str]]]:
        return {VECTORS: (self.embeddings, self.features)}

    def dense_logits(self, dense: torch.Tensor, pooled: Pooled) -> torch.Tensor:
        x0 = torch.cat([dense, *(pooled[VECTORS][name] for name in self.features)], dim=1)
        x = x0
        for layer in self.cross:
            x = layer(x0, x)
        return task_logits(self.mlp(x))


class WideDeep(PooledModel):
    """Wide & Deep (Cheng et al., DLRS 2016): logistic regression's weights (the wide part, which memorises ids
    and dense features' linear effects) and ``mlp``'s tower over the fields' vectors (the deep part, which
    generalises), trained jointly, their logits summed (with several tasks, the wide logit is every task's)."""

    def __init__(self, wide: LogisticRegression, deep: CTRModel) -> None:
        super().__init__()
        self.wide = wide
        self.deep = deep
        self.num_dense = deep.num_dense

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        return {f"deep.{name}": style for name, style in self.deep.tensor_parallel_plan().items()}

    def lookups(self) -> dict[str, tuple[nn.Module, list[str]]]:
        return {**self.wide.lookups(), **self.deep.lookups()}

    def dense_logits(self, dense: torch.Tensor, pooled: Pooled) -> torch.Tensor:
        return plus_shared(self.wide.dense_logits(dense, pooled), self.deep.dense_logits(dense, pooled))


@dataclass
class DCNv2Config(DeepModelConfig):
    cross_layers: PositiveInt = 3
    """DCN-v2's cross layers, each one more order of feature interaction; the paper's best are 2 to 4."""
    cross_rank: PositiveInt | None = None
    """DCN-v2's cross weight rank: ``None`` full (``D x D`` for ``D`` inputs), or ``r`` for ``U V^T`` with
    ``2 D r`` weights, which the paper finds as good at ``r`` about ``D / 4`` for wide inputs."""


@ZOO_MODELS.register("dcn_v2", DCNv2Config)
def dcn_v2(config: DCNv2Config, inputs: ModelInputs) -> nn.Module:
    section = config.embeddings
    cross = (config.cross_layers, config.cross_rank)
    deep = (config.hidden_dims, config.dropout)
    dims = inputs.feature_dims(section)
    return DCNv2(inputs.vectors(section), inputs.features, inputs.num_dense, dims, *cross, *deep, inputs.num_tasks)


def _deep_tower(config: DeepModelConfig, inputs: ModelInputs) -> CTRModel:
    section = config.embeddings
    dims = inputs.feature_dims(section)
    return CTRModel(
        inputs.vectors(section),
        inputs.features,
        dims,
        inputs.num_dense,
        config.hidden_dims,
        config.dropout,
        inputs.num_tasks,
    )


@ZOO_MODELS.register("mlp", DeepModelConfig)
def mlp(config: DeepModelConfig, inputs: ModelInputs) -> nn.Module:
    return _deep_tower(config, inputs)


@ZOO_MODELS.register("wide_deep", DeepModelConfig)
def wide_deep(config: DeepModelConfig, inputs: ModelInputs) -> nn.Module:
    deep = _deep_tower(config, inputs)  # Built first: its layers take the first draws of the seeded generator.
    wide = LogisticRegression(inputs.first_order(config.embeddings), inputs.features, inputs.num_dense)
    return WideDeep(wide, deep)


@dataclass
class DLRMConfig(OneDimTables, DeepModelConfig):
    bottom_dims: list[PositiveInt] = field(default_factory=lambda: [64])
    """DLRM's bottom MLP over the dense features (its output has the embedding dim): a few dense
    features need one layer. ``hidden_dims`` is its top MLP."""


@ZOO_MODELS.register("dlrm", DLRMConfig)
def dlrm(config: DLRMConfig, inputs: ModelInputs) -> nn.Module:
    section = config.embeddings
    with warnings.catch_warnings():
        # Without dense features the bottom MLP's first layer has no weights (and torch warns that
        # it initialises none): its output is then a learned vector that still meets every field.
        warnings.filterwarnings("ignore", "Initializing zero-element tensors", UserWarning)
        return DLRM(
            inputs.vectors(section),
            inputs.features,
            inputs.num_dense,
            section.dim,
            config.bottom_dims,
            config.hidden_dims,
            config.dropout,
            inputs.num_tasks,
        )
