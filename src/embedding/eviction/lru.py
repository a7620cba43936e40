"""``lru``: a full shard evicts the least recently looked-up id among the slots sampled for a new one.

It relies on each slot's ``last_seen`` (the training step it was last looked up in); a checkpoint
loaded into shards of fewer slots than its ids keeps the most recently looked-up ones.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from embedding.eviction.eviction_spec import EVICTION_POLICIES, EvictionConfig, EvictionSpec


@register_jitable
def last_looked_up(keys, last_seen, frequency, slot):  # type: ignore[no-untyped-def]
    """The step the slot was last looked up in: the longest idle goes first."""
    return np.int64(last_seen[slot])


@EVICTION_POLICIES.register("lru")
def lru(config: EvictionConfig) -> EvictionSpec:
    return EvictionSpec(when_full="evict", score=last_looked_up)
