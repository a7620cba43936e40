"""``lfu``: a full shard evicts the least often looked-up id among the slots sampled for a new one.

It relies on each slot's ``frequency`` (its lookups since the id took it); a checkpoint loaded into
shards of fewer slots than its ids keeps the most often looked-up ones.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from embedding.eviction.eviction_spec import EVICTION_POLICIES, EvictionConfig, EvictionSpec


@register_jitable
def times_looked_up(keys, last_seen, frequency, slot):  # type: ignore[no-untyped-def]
    """How many times the slot's id was looked up: the rarest goes first."""
    return np.int64(frequency[slot])


@EVICTION_POLICIES.register("lfu")
def lfu(config: EvictionConfig) -> EvictionSpec:
    return EvictionSpec(when_full="evict", score=times_looked_up)
