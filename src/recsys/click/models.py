"""Click-through-rate models over pooled embeddings: an MLP over concatenated features, and DLRM.

Both take ``embeddings``, a module mapping a batch's sparse features to ``[B, dim]`` per feature:
sparse sharded tables or dense embedding bags (see ``recsys.models.embeddings``). More models, by
name, are in ``recsys.zoo``."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor.parallel import ParallelStyle

from recipes import megatron_mlp_plan
from recsys.click.batch import CTRBatch
from recsys.models.mlp import mlp


def mlp_with_dropout(in_dim: int, hidden_dims: list[int], out_dim: int, dropout: float = 0.0) -> nn.Sequential:
    """``mlp`` with dropout after every hidden ReLU, the usual guard of CTR MLPs against memorising rare ids.

    With ``dropout=0`` it is ``mlp`` itself, layer for layer, so that checkpoints' parameter names stay.
    """
    if dropout == 0.0:
        return mlp(in_dim, hidden_dims, out_dim)
    layers: list[nn.Module] = []
    for hidden in hidden_dims:
        layers += [nn.Linear(in_dim, hidden), nn.ReLU(), nn.Dropout(dropout)]
        in_dim = hidden
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class CTRModel(nn.Module):
    """The pooled embedding of every categorical feature, concatenated with the dense features, into an MLP.

    The deep tower of Wide & Deep (Cheng et al., DLRS 2016) and of YouTube's recommender (Covington et al.,
    RecSys 2016): interactions are left for the MLP to learn from the concatenation.
    """

    def __init__(
        self,
        embeddings: nn.Module,
        feature_names: list[str],
        embedding_dim: int,
        num_dense: int,
        hidden_dims: list[int],
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.feature_names = feature_names
        self.mlp = mlp_with_dropout(num_dense + embedding_dim * len(feature_names), hidden_dims, 1, dropout)

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        return megatron_mlp_plan(self.mlp, "mlp")

    def forward(self, batch: CTRBatch) -> torch.Tensor:
        """The click logit of every sample, ``[B]``."""
        pooled = self.embeddings(batch.sparse)
        features = torch.cat([batch.dense, *(pooled[name] for name in self.feature_names)], dim=1)
        logits: torch.Tensor = self.mlp(features).squeeze(1)
        return logits


class DLRM(nn.Module):
    """Pairwise dot products of the fields' vectors and the dense features' bottom-MLP vector, into a top MLP
    (Naumov et al., Deep Learning Recommendation Model, 2019).

    The embedding dimension is shared by every table and the bottom MLP's output, which the dots need.

    ``dropout`` applies to the top MLP only: the bottom one sees a handful of dense features.
    """

    def __init__(
        self,
        embeddings: nn.Module,
        feature_names: list[str],
        num_dense: int,
        embedding_dim: int,
        bottom_dims: list[int],
        top_dims: list[int],
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.feature_names = feature_names
        self.bottom_mlp = nn.Sequential(mlp(num_dense, bottom_dims, embedding_dim), nn.ReLU())
        num_vectors = len(feature_names) + 1
        num_interactions = num_vectors * (num_vectors - 1) // 2
        self.top_mlp = mlp_with_dropout(embedding_dim + num_interactions, top_dims, 1, dropout)
        self._pair_rows, self._pair_cols = torch.triu_indices(num_vectors, num_vectors, offset=1)

    def tensor_parallel_plan(self) -> dict[str, ParallelStyle]:
        return megatron_mlp_plan(self.top_mlp, "top_mlp")  # The bottom MLP sees a handful of dense features.

    def forward(self, batch: CTRBatch) -> torch.Tensor:
        """The click logit of every sample, ``[B]``."""
        dense = self.bottom_mlp(batch.dense)
        pooled = self.embeddings(batch.sparse)
        vectors = torch.stack([dense, *(pooled[name] for name in self.feature_names)], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))
        interactions = dots[:, self._pair_rows.to(dots.device), self._pair_cols.to(dots.device)]
        logits: torch.Tensor = self.top_mlp(torch.cat([dense, interactions], dim=1)).squeeze(1)
        return logits
