"""The batch of click-through-rate prediction: dense features, sparse features, labels (binary, or one column per
task: ``recsys.click.tasks``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from embedding import JaggedIds, SparseFeatures


@dataclass(frozen=True)
class CTRBatch:
    """Dense features ``[B, num_dense]``, sparse features by name, labels ``[B]`` (binary, or one task's), or
    ``[B, T]`` for T tasks (column ``t`` task ``t``'s label: a click, or a regression target)."""

    dense: torch.Tensor
    sparse: SparseFeatures
    labels: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device: torch.device) -> CTRBatch:
        return CTRBatch(self.dense.to(device), self.sparse.to(device), self.labels.to(device))


def make_ctr_batch(
    dense: npt.NDArray[np.float32],
    sparse: dict[str, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]],
    labels: npt.NDArray[np.float32],
) -> CTRBatch:
    """A CTRBatch from numpy arrays; ``sparse`` maps a feature name to its ``(ids, offsets)``."""
    features = {
        name: JaggedIds(torch.from_numpy(np.ascontiguousarray(ids)), torch.from_numpy(np.ascontiguousarray(offsets)))
        for name, (ids, offsets) in sparse.items()
    }
    return CTRBatch(
        dense=torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32)),
        sparse=SparseFeatures(features),
        labels=torch.from_numpy(np.ascontiguousarray(labels, dtype=np.float32)),
    )
