"""Eviction policies of hash tables, chosen by name: what a full shard does with an id it admits,
and which ids a shard keeps when a checkpoint brings it more than it has slots.

Each policy is one module of this folder: its config dataclass, its score (a ``register_jitable``
function of the per-slot arrays) and the function of its config to its :class:`EvictionSpec`,
registered by decorator (see :mod:`embedding.eviction.eviction_spec`). Every module here is imported with
the package, so a new built-in policy is a new module and nothing else; another package offers
its own through the entry-point group ``recipes.eviction_policies``.
"""

from components import import_submodules
from embedding.eviction.eviction_spec import (
    EVICTION_POLICIES,
    EvictionConfig,
    EvictionConfigError,
    EvictionSpec,
    Score,
    WhenFull,
    eviction_spec,
)
from embedding.eviction.ttl import TtlConfig

import_submodules(__name__, __path__)

__all__ = [
    "EVICTION_POLICIES",
    "EvictionConfig",
    "EvictionConfigError",
    "EvictionSpec",
    "Score",
    "TtlConfig",
    "WhenFull",
    "eviction_spec",
]
