"""The batch of the built-in click-through-rate recipes."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from embedding.features import SparseFeatures


@dataclass(frozen=True)
class CTRBatch:
    """Dense features ``[B, num_dense]``, sparse features by name, binary labels ``[B]``."""

    dense: torch.Tensor
    sparse: SparseFeatures
    labels: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device) -> CTRBatch:
        return CTRBatch(self.dense.to(device), self.sparse.to(device), self.labels.to(device))
