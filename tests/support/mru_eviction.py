"""An eviction policy from outside the embedding package, as another package would offer it: ``mru`` evicts the
most recently looked-up id among the sampled slots, and a shard reloaded with too many ids keeps the least
recently looked-up ones. Nothing here registers it: the tests do, by decorator or through an entry point
(``"support.mru_eviction:MRU"``)."""

import numpy as np
from numba.extending import register_jitable

from components import Component
from embedding.eviction import EvictionConfig, EvictionSpec


@register_jitable
def most_recent_first(keys, last_seen, frequency, slot):  # type: ignore[no-untyped-def]
    return -np.int64(last_seen[slot])


def mru(config: EvictionConfig) -> EvictionSpec:
    return EvictionSpec(when_full="evict", score=most_recent_first)


MRU = Component("mru", EvictionConfig, mru)
