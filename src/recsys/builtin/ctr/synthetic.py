"""Deterministic synthetic click-through data with a learnable signal, for demos and tests."""

from __future__ import annotations

import torch

from embedding import JaggedIds, SparseFeatures
from recsys.click.batch import CTRBatch


class SyntheticCTRData:
    """``num_samples`` samples of ``num_dense`` dense and ``num_sparse`` categorical features.

    The label is drawn from a logistic model over hidden per-category weights and dense
    weights, so a model can learn it and its AUC says how well. Everything derives from
    ``seed``, so every rank and every run sees the same data; train and validation splits
    are ranges of one data set, so they share its label model.
    """

    def __init__(self, num_samples: int, num_dense: int, num_sparse: int, vocab_size: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.num_sparse = num_sparse
        self.dense = torch.randn(num_samples, num_dense, generator=generator)
        # Zipf-like category frequencies, as in real click logs.
        popularity = 1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float64) ** 1.1
        ids = torch.multinomial(popularity, num_samples * num_sparse, replacement=True, generator=generator)
        self.ids = ids.view(num_samples, num_sparse)
        category_weight = torch.randn(num_sparse, vocab_size, generator=generator)
        dense_weight = torch.randn(num_dense, generator=generator)
        logit = self.dense @ dense_weight + category_weight.gather(1, self.ids.t()).t().sum(1)
        self.labels = torch.bernoulli(torch.sigmoid(logit), generator=generator)

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def split(self, start: int, stop: int) -> SyntheticCTRSplit:
        """Samples ``[start, stop)``."""
        return SyntheticCTRSplit(self, start, stop)


class SyntheticCTRSplit:
    """A contiguous range of a ``SyntheticCTRData``, read by index."""

    def __init__(self, data: SyntheticCTRData, start: int, stop: int) -> None:
        if not 0 <= start < stop <= len(data):
            raise ValueError(
                f"`[start, stop)` must be a non-empty range of [0, {len(data)}), but is [{start}, {stop})."
            )
        self._data = data
        self._start = start
        self._stop = stop

    def __len__(self) -> int:
        return self._stop - self._start

    def batch(self, indices: torch.Tensor) -> CTRBatch:
        data, rows = self._data, indices + self._start
        ids = data.ids[rows]
        sparse = {f"cat_{i}": JaggedIds.from_dense(ids[:, i : i + 1]) for i in range(data.num_sparse)}
        return CTRBatch(data.dense[rows], SparseFeatures(sparse), data.labels[rows])
