"""A step's ids sorted ahead of the update, which the CPU kernel takes in place of a sort of its own."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from embedding.kernels.radix_sort import digit_bits, radix_sort


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

        On a CPU, by the bits below ``num_rows`` alone (:mod:`embedding.kernels.radix_sort`: two passes for a
        million rows, on one thread); ids outside the table (the grouping refuses them before its sort, the
        CPU kernel after its own) and a table of ``2 ** 31`` rows or more fall back to torch's sort of the
        whole keys. On a GPU, torch's radix sort, three times faster on int32 keys than on int64."""
        key_dtype = cls.key_dtype(num_rows)
        if ids.device.type == "cpu" and key_dtype == torch.int32:
            keys, order = out or (torch.empty(ids.shape, dtype=key_dtype), torch.empty(ids.shape, dtype=torch.int64))
            bits = np.array(digit_bits(num_rows), dtype=np.int64)
            if ids.numel() == 0 or radix_sort(ids.numpy(), bits, keys.numpy(), order.numpy()):
                return cls(keys, order)
        return cls(*torch.sort(ids.to(key_dtype), stable=True, out=out))
