"""``none``: a full shard is an error (:class:`embedding.hash_index.TableFullError`), as is a checkpoint
that brings a shard more ids than it has slots: the table never gives up an id it holds."""

from __future__ import annotations

from embedding.eviction.eviction_spec import EVICTION_POLICIES, EvictionConfig, EvictionSpec


@EVICTION_POLICIES.register("none")
def none(config: EvictionConfig) -> EvictionSpec:
    return EvictionSpec(when_full="error")
