"""A reader over samples held in memory, shuffled per epoch and sharded by data-parallel rank."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import torch

from recipes import DataReader
from recsys.data.step_layout import StepLayout

logger = logging.getLogger(__name__)

BatchT = TypeVar("BatchT")


class InMemoryReader(DataReader[BatchT]):
    """Reads ``num_samples`` samples by index; ``make_batch(indices)`` turns indices into a batch.

    Each epoch draws a permutation from ``seed + epoch`` (the same on every rank) and deals it
    out as ``recsys.data.step_layout`` says: in global steps of ``dp_size * num_accumulate *
    batch_size`` indices, index ``i`` of a step to rank ``i % dp_size``, so that over an epoch
    the ``p``-th index of the permutation is rank ``p % dp_size``'s ``p // dp_size``-th (the
    contract that lets outputs be re-interleaved into input order).

    ``drop_last=True`` (for training) drops the tail that fills no whole step on every rank
    alike, and logs how much it dropped when the epoch ends. ``drop_last=False`` (for
    validation and prediction, which must see every sample) serves the tail as a last, smaller
    step; ``make_batch`` may then get zero indices on a rank the tail does not reach.

    The position is the epoch and the step within it, which is all an exact resume needs.
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
        drop_last: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"`batch_size` must be >= 1, but is {batch_size} instead.")
        self._make_batch = make_batch
        self._num_samples = num_samples
        self._layout = StepLayout(batch_size, num_accumulate, dp_rank, dp_size, drop_last)
        self._shuffle = shuffle
        self._seed = seed
        self._epoch = 0
        self._step = 0
        self._start_epoch()

    @property
    def steps_per_epoch(self) -> int:
        return self._layout.num_steps(self._num_samples)

    def _start_epoch(self) -> None:
        if self._shuffle:
            generator = torch.Generator().manual_seed(self._seed + self._epoch)
            order = torch.randperm(self._num_samples, generator=generator)
        else:
            order = torch.arange(self._num_samples)
        self._order: npt.NDArray[np.int64] = order.numpy()
        self._drop_logged = False

    def __next__(self) -> list[BatchT]:
        if self._step >= self.steps_per_epoch:
            if not self._drop_logged:
                self._drop_logged = True
                self._layout.log_dropped_rows(logger, self._epoch, self._layout.num_dropped_rows(self._num_samples))
            raise StopIteration
        step_rows = self._layout.rows_per_global_step
        global_rows = self._order[self._step * step_rows : (self._step + 1) * step_rows]
        self._step += 1
        return [
            self._make_batch(torch.from_numpy(np.ascontiguousarray(rows)))
            for rows in self._layout.rank_rows(global_rows)
        ]

    def reset(self) -> None:
        self._epoch += 1
        self._step = 0
        self._start_epoch()

    def describe(self) -> str:
        return f"{self._num_samples} samples in memory; {self._layout.describe_step()}"

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self._epoch, "step": self._step}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._epoch = state_dict["epoch"]
        self._step = state_dict["step"]
        self._start_epoch()
