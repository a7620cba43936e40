"""Click-through-rate models over pooled embeddings: an MLP over concatenated features, and DLRM.

Both take ``embeddings``, a module mapping a batch's sparse features to ``[B, dim]`` per feature:
sparse sharded tables or dense embedding bags (see ``recipes.models.embeddings``)."""

from __future__ import annotations

import torch
from torch import nn

from recipes.click.batch import CTRBatch
from recipes.models.mlp import mlp


class CTRModel(nn.Module):
    """The pooled embedding of every categorical feature, concatenated with the dense features, into an MLP."""

    def __init__(
        self,
        embeddings: nn.Module,
        feature_names: list[str],
        embedding_dim: int,
        num_dense: int,
        hidden_dims: list[int],
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.feature_names = feature_names
        self.mlp = mlp(num_dense + embedding_dim * len(feature_names), hidden_dims, 1)

    def forward(self, batch: CTRBatch) -> torch.Tensor:
        """The click logit of every sample, ``[B]``."""
        pooled = self.embeddings(batch.sparse)
        features = torch.cat([batch.dense, *(pooled[name] for name in self.feature_names)], dim=1)
        logits: torch.Tensor = self.mlp(features).squeeze(1)
        return logits


class DLRM(nn.Module):
    """The embedding dimension is shared by every table and the bottom MLP's output."""

    def __init__(
        self,
        embeddings: nn.Module,
        feature_names: list[str],
        num_dense: int,
        embedding_dim: int,
        bottom_dims: list[int],
        top_dims: list[int],
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.feature_names = feature_names
        self.bottom_mlp = nn.Sequential(mlp(num_dense, bottom_dims, embedding_dim), nn.ReLU())
        num_vectors = len(feature_names) + 1
        num_interactions = num_vectors * (num_vectors - 1) // 2
        self.top_mlp = mlp(embedding_dim + num_interactions, top_dims, 1)
        self._pair_rows, self._pair_cols = torch.triu_indices(num_vectors, num_vectors, offset=1)

    def forward(self, batch: CTRBatch) -> torch.Tensor:
        """The click logit of every sample, ``[B]``."""
        dense = self.bottom_mlp(batch.dense)
        pooled = self.embeddings(batch.sparse)
        vectors = torch.stack([dense, *(pooled[name] for name in self.feature_names)], dim=1)
        dots = torch.bmm(vectors, vectors.transpose(1, 2))
        interactions = dots[:, self._pair_rows.to(dots.device), self._pair_cols.to(dots.device)]
        logits: torch.Tensor = self.top_mlp(torch.cat([dense, interactions], dim=1)).squeeze(1)
        return logits
