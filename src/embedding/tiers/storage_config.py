"""Where a table's rows live: the storage tier, and the cache of hot rows in front of it.

``device`` keeps every row and its optimizer state in the memory that computes (RAM on a CPU,
HBM on a GPU), as tables always did. ``host`` keeps them in host memory (pinned where a GPU
copies from it) with a cache of hot rows on the device; ``disk`` keeps them in a file on local
disk with a cache in RAM (or on the GPU), for tables bigger than memory. Either way the lookups
and the fused update work on the cached rows; a row leaves the cache only when it is not in use,
written back first if a step changed it (FBGEMM's ``MANAGED_CACHING``, TorchRec's SSD offload).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

StorageTier = Literal["device", "host", "disk"]

STORAGE_TIERS: tuple[StorageTier, ...] = get_args(StorageTier)

CacheEviction = Literal["lru", "lfu"]
"""Which cached row a missing one replaces: the least recently looked up, or the least often (while cached)."""

CACHE_EVICTIONS: tuple[CacheEviction, ...] = get_args(CacheEviction)

DEFAULT_CACHE_FRACTION = 0.2
"""FBGEMM's default: a cache of a fifth of the rows."""


@dataclass(frozen=True)
class TableStorage:
    """The tier of a table's rows and, off the device, the size of its cache and its eviction rule.

    The cache holds ``cache_rows`` rows, or as many as fit in ``cache_bytes`` (rows and their
    optimizer state), or a fifth of the table's rows when neither is set. It may be far smaller
    than the rows one step touches: a step's rows that find no free place stay in overflow rows
    until the step is done.
    """

    tier: StorageTier = "device"
    cache_rows: int | None = None
    cache_bytes: int | None = None
    eviction: CacheEviction = "lru"

    def __post_init__(self) -> None:
        if self.tier not in STORAGE_TIERS:
            raise ValueError(f"`storage` must be one of {', '.join(STORAGE_TIERS)}, but is '{self.tier}' instead.")
        if self.eviction not in CACHE_EVICTIONS:
            raise ValueError(
                f"`cache.eviction` must be one of {', '.join(CACHE_EVICTIONS)}, but is '{self.eviction}' instead."
            )
        for name in ("cache_rows", "cache_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"`cache.{name[6:]}` must be at least 1, but is {value} instead.")
        if self.cache_rows is not None and self.cache_bytes is not None:
            raise ValueError("`cache` must set rows or bytes, but sets both.")

    @property
    def tiered(self) -> bool:
        """Whether the rows live off the device, behind a cache."""
        return self.tier != "device"

    def cache_size(self, num_rows: int, bytes_per_row: int) -> int:
        """The rows the cache of a shard of ``num_rows`` rows holds (never more than the shard's rows)."""
        if self.cache_rows is not None:
            rows = self.cache_rows
        elif self.cache_bytes is not None:
            rows = self.cache_bytes // bytes_per_row
        else:
            rows = int(num_rows * DEFAULT_CACHE_FRACTION)
        return max(1, min(rows, num_rows))
