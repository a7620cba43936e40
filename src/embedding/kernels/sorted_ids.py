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

    @staticmethod
    def key_dtype(num_rows: int) -> torch.dtype:
        """The keys' type for a table of ``num_rows`` rows: int32 where it holds every row (under 2**31)."""
        return torch.int32 if num_rows <= torch.iinfo(torch.int32).max else torch.int64

    @classmethod
    def of(cls, ids: torch.Tensor, num_rows: int, out: tuple[torch.Tensor, torch.Tensor] | None = None) -> SortedIds:
        """``ids``, rows of a table of ``num_rows`` rows, sorted (into ``out``'s keys and order, if given).
        torch's stable sort is a radix sort, several times faster than numba's, and three times faster
        again on int32 keys."""
        return cls(*torch.sort(ids.to(cls.key_dtype(num_rows)), stable=True, out=out))
