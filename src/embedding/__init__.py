"""Sparse embedding tables sharded over a gang, and their fused sparse optimizers."""

from embedding.bags import SparseFeatureError
from embedding.collection import PreparedLookup, ShardedEmbeddingCollection
from embedding.config import (
    PLACEMENTS,
    EmbeddingConfigError,
    EmbeddingTableConfig,
    Initializer,
    OutOfRangePolicy,
    Placement,
    Pooling,
    TableKind,
)
from embedding.eviction import EVICTION_POLICIES, EvictionConfig, EvictionSpec
from embedding.features import JaggedIds, SparseFeatures
from embedding.hash_index import HashPolicy, TableFullError
from embedding.optimizer import CombinedOptimizer, SparseOptimizer, SparseOptimizerStateError
from embedding.optimizers import SPARSE_OPTIMIZERS, SparseOptimizerConfig, SparseOptimizerError, SparseOptimizerSpec
from embedding.planner import TableSharding, plan_sharding
from embedding.state import ShardedStateError

__all__ = [
    "EVICTION_POLICIES",
    "PLACEMENTS",
    "SPARSE_OPTIMIZERS",
    "CombinedOptimizer",
    "EmbeddingConfigError",
    "EmbeddingTableConfig",
    "EvictionConfig",
    "EvictionSpec",
    "HashPolicy",
    "Initializer",
    "JaggedIds",
    "OutOfRangePolicy",
    "Placement",
    "Pooling",
    "PreparedLookup",
    "ShardedEmbeddingCollection",
    "ShardedStateError",
    "SparseFeatureError",
    "SparseFeatures",
    "SparseOptimizer",
    "SparseOptimizerConfig",
    "SparseOptimizerError",
    "SparseOptimizerSpec",
    "SparseOptimizerStateError",
    "TableFullError",
    "TableKind",
    "TableSharding",
    "plan_sharding",
]
