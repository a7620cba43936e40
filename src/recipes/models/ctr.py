"""A small click-through-rate model: pooled embeddings of categorical features, dense features, an MLP."""

from __future__ import annotations

import torch
from torch import nn

from recipes.data.batch import CTRBatch


def mlp(in_dim: int, hidden_dims: list[int], out_dim: int) -> nn.Sequential:
    """Linear + ReLU layers, then a linear output layer."""
    layers: list[nn.Module] = []
    for hidden in hidden_dims:
        layers += [nn.Linear(in_dim, hidden), nn.ReLU()]
        in_dim = hidden
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class CTRModel(nn.Module):
    """The pooled embedding of every categorical feature, concatenated with the dense features, into an MLP.

    ``embeddings`` maps a batch's sparse features to ``[B, embedding_dim]`` per feature: sparse
    sharded tables or dense embedding bags (see ``recipes.models.embeddings``).
    """

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
