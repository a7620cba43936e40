"""Storage tiers of tables: rows on the host or on disk, behind a cache of hot rows on the device.

``storage_config`` says where a table's rows live; ``stores`` holds them off the device;
``row_cache`` keeps the hot ones where the lookups and the fused update read them.
"""

from embedding.tiers.storage_config import CACHE_EVICTIONS, STORAGE_TIERS, CacheEviction, StorageTier, TableStorage

__all__ = ["CACHE_EVICTIONS", "STORAGE_TIERS", "CacheEviction", "StorageTier", "TableStorage"]
