"""A reader over samples held in memory, shuffled per epoch and sharded by data-parallel rank."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch

from recipes.data.reader import DataReader

BatchT = TypeVar("BatchT")


class InMemoryReader(DataReader[BatchT]):
    """Reads ``num_samples`` samples by index; ``make_batch(indices)`` turns indices into a batch.

    Each epoch draws a permutation from ``seed + epoch`` (the same on every rank), gives rank
    ``r`` every ``dp_size``-th index from ``r``, and cuts it into steps of ``num_accumulate``
    micro-batches of ``batch_size``. The tail that does not fill a whole step is dropped on
    every rank alike, so all ranks run the same number of steps. The position is the epoch
    and the step within it, which is all an exact resume needs.
    """

    def __init__(
        self,
        make_batch: Callable[[torch.Tensor], BatchT],
        num_samples: int,
        batch_size: int,
        num_accumulate: int = 1,
        dp_rank: int = 0,
        dp_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, but is {batch_size} instead.")
        self._make_batch = make_batch
        self._num_samples = num_samples
        self._batch_size = batch_size
        self._num_accumulate = num_accumulate
        self._dp_rank = dp_rank
        self._dp_size = dp_size
        self._shuffle = shuffle
        self._seed = seed
        self._epoch = 0
        self._step = 0
        self._indices = self._epoch_indices()

    @property
    def steps_per_epoch(self) -> int:
        samples_per_rank = self._num_samples // self._dp_size
        return samples_per_rank // (self._batch_size * self._num_accumulate)

    def _epoch_indices(self) -> torch.Tensor:
        if self._shuffle:
            generator = torch.Generator().manual_seed(self._seed + self._epoch)
            order = torch.randperm(self._num_samples, generator=generator)
        else:
            order = torch.arange(self._num_samples)
        return order[self._dp_rank :: self._dp_size][: self._num_samples // self._dp_size]

    def __next__(self) -> list[BatchT]:
        if self._step >= self.steps_per_epoch:
            raise StopIteration
        step_size = self._batch_size * self._num_accumulate
        start = self._step * step_size
        self._step += 1
        return [
            self._make_batch(self._indices[offset : offset + self._batch_size])
            for offset in range(start, start + step_size, self._batch_size)
        ]

    def reset(self) -> None:
        self._epoch += 1
        self._step = 0
        self._indices = self._epoch_indices()

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._epoch, "step": self._step}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._epoch = state_dict["epoch"]
        self._step = state_dict["step"]
        self._indices = self._epoch_indices()
