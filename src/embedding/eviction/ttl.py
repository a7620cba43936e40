"""``ttl``: a shard frees the ids not looked up in the last ``ttl_steps`` steps, and a full one admits none.

Expiry runs before a step's first lookup, so an id back after more than ``ttl_steps`` idle steps
starts again from a fresh row. It relies on each slot's ``last_seen``; a checkpoint loaded into
shards of fewer slots than its ids keeps the most recently looked-up ones, those due to expire last.
"""

from __future__ import annotations

from dataclasses import dataclass

from components import PositiveInt
from embedding.eviction.eviction_spec import EVICTION_POLICIES, EvictionConfig, EvictionSpec
from embedding.eviction.lru import last_looked_up


@dataclass(frozen=True)
class TtlConfig(EvictionConfig):
    name: str = "ttl"
    ttl_steps: PositiveInt = 1000
    """Training steps an id may go without a lookup before its row is freed."""


@EVICTION_POLICIES.register("ttl", TtlConfig)
def ttl(config: TtlConfig) -> EvictionSpec:
    return EvictionSpec(when_full="refuse", score=last_looked_up, expires_after=config.ttl_steps)
