"""A step's ids sorted ahead of the update, which the CPU kernel takes in place of a sort of its own."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SortedIds:
    """A step's ``ids`` sorted stably ahead of the update: ``keys`` equals ``ids[order]`` and never
    decreases, and ``order`` keeps the occurrences of each id in their order (``torch.sort(stable=True)``'s).

    A forward that groups a batch's ids for the update makes it (:func:`embedding.bags.group_bags`), so that
    one sort a batch serves both, off the step's path where a train pipeline groups the next batch ahead.
    """

    keys: torch.Tensor
    order: torch.Tensor

    @classmethod
    def of(cls, ids: torch.Tensor, num_rows: int) -> SortedIds:
        """``ids``, rows of a table of ``num_rows`` rows, sorted. torch's stable sort is a radix sort, several times
        faster than numba's, and three times faster again on int32 keys, which hold any row under 2**31."""
        keys = ids.to(torch.int32) if num_rows <= torch.iinfo(torch.int32).max else ids
        return cls(*torch.sort(keys, stable=True))
