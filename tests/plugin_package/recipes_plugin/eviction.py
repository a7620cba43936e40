"""The ``mru`` eviction policy: a full hash table evicts the most recently looked-up id among the sampled slots.

A cache of ids that a scan looks up once each keeps its older, steadier ids this way; a checkpoint loaded into
fewer slots than its ids keeps the least recently looked-up ones.
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from embedding.eviction import EVICTION_POLICIES, EvictionConfig, EvictionSpec


@register_jitable
def most_recent_first(keys, last_seen, frequency, slot):  # type: ignore[no-untyped-def]
    return -np.int64(last_seen[slot])


@EVICTION_POLICIES.register("mru")
def mru(config: EvictionConfig) -> EvictionSpec:
    return EvictionSpec(when_full="evict", score=most_recent_first)
