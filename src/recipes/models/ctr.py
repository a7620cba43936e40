"""A small click-through-rate model: embeddings of categorical features, dense features, an MLP."""

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
    """Sum-pooled embedding bags per categorical feature, concatenated with the dense features, into an MLP."""

    def __init__(
        self,
        feature_names: list[str],
        vocab_size: int,
        embedding_dim: int,
        num_dense: int,
        hidden_dims: list[int],
    ) -> None:
        super().__init__()
        self.feature_names = feature_names
        self.embeddings = nn.ModuleDict(
            {name: nn.EmbeddingBag(vocab_size, embedding_dim, mode="sum") for name in feature_names}
        )
        self.mlp = mlp(num_dense + embedding_dim * len(feature_names), hidden_dims, 1)

    def forward(self, batch: CTRBatch) -> torch.Tensor:
        """The click logit of every sample, ``[B]``."""
        pooled = [
            self.embeddings[name](batch.sparse[name].ids, batch.sparse[name].offsets[:-1])
            for name in self.feature_names
        ]
        logits: torch.Tensor = self.mlp(torch.cat([batch.dense, *pooled], dim=1)).squeeze(1)
        return logits
