"""What a retrieval model is: a query tower and an item tower whose vectors meet in a dot product.

A ranking model scores one (user, item) pair at a time; a retrieval model scores a user against every item at
once, which a serving system does with a nearest-neighbour index over the item vectors. So the towers stay apart:
the item tower sees item ids alone (the corpus is scored without any user's features), the query tower a row's
other features. ``forward`` gives both for a batch from one lookup of its features (the sparse tables are looked
up once a training step), and ``items`` the vectors of any ids, for the corpus.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from embedding import JaggedIds, SparseFeatures
from recsys.click.batch import CTRBatch


class RetrievalModel(nn.Module):
    """A two-tower model over the item ids of the feature ``item_feature``: ``forward(batch)`` gives each row's
    query vector and its own item's vector, ``[B, dim]`` each; their dot product over ``temperature`` is the
    row's logit. ``temperature`` sharpens the softmax over vectors of norm 1, whose dot products are cosines."""

    mode_changes = 0
    """How often ``train``/``eval`` switched the model: a validation starts with one, so item vectors computed for
    a validation are stale once it changes."""

    def __init__(self, embeddings: nn.Module, features: Sequence[str], item_feature: str, temperature: float) -> None:
        """``embeddings``: the tables that look up ``features``, the item's among them."""
        super().__init__()
        self.embeddings = embeddings
        self.features = list(features)
        self.item_feature = item_feature
        self.temperature = temperature

    def train(self, mode: bool = True) -> RetrievalModel:
        self.mode_changes += 1
        return super().train(mode)

    def forward(self, batch: CTRBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's query vector and its item's vector."""
        raise NotImplementedError

    def items(self, ids: torch.Tensor) -> torch.Tensor:
        """The vectors of the items ``ids`` (``[N]``), from their ids alone: ``[N, dim]``."""
        raise NotImplementedError

    def item_rows(self, ids: torch.Tensor) -> torch.Tensor:
        """The item table's rows of ``ids``, looked up as values of the item feature (the others' get no id)."""
        return lookup_ids(self.embeddings, self.features, self.item_feature, ids)


def lookup_ids(embeddings: nn.Module, features: Sequence[str], feature: str, ids: torch.Tensor) -> torch.Tensor:
    """The vectors of ``ids`` as values of ``feature``, one id a row, from the tables ``embeddings`` (which look up
    ``features``; the others get no id)."""
    one_each = torch.arange(ids.numel() + 1, device=ids.device)
    none = torch.zeros(ids.numel() + 1, dtype=torch.int64, device=ids.device)
    empty = torch.zeros(0, dtype=torch.int64, device=ids.device)
    jagged = {name: JaggedIds(ids, one_each) if name == feature else JaggedIds(empty, none) for name in features}
    vectors: torch.Tensor = embeddings(SparseFeatures(jagged))[feature]
    return vectors
