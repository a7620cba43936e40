"""Sparse embedding tables sharded over a gang, and their fused sparse optimizers."""

from embedding.collection import ShardedEmbeddingCollection, SparseFeatureError
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
from embedding.features import JaggedIds, SparseFeatures
from embedding.hash_index import EVICTION_POLICIES, EvictionPolicy, HashPolicy, TableFullError
from embedding.optim_config import SparseOptimizerConfig, SparseOptimizerError
from embedding.optimizer import CombinedOptimizer, SparseOptimizer, SparseOptimizerStateError
from embedding.planner import TableSharding, plan_sharding
from embedding.state import ShardedStateError

__all__ = [
    "EVICTION_POLICIES",
    "PLACEMENTS",
    "CombinedOptimizer",
    "EmbeddingConfigError",
    "EmbeddingTableConfig",
    "EvictionPolicy",
    "HashPolicy",
    "Initializer",
    "JaggedIds",
    "OutOfRangePolicy",
    "Placement",
    "Pooling",
    "ShardedEmbeddingCollection",
    "ShardedStateError",
    "SparseFeatureError",
    "SparseFeatures",
    "SparseOptimizer",
    "SparseOptimizerConfig",
    "SparseOptimizerError",
    "SparseOptimizerStateError",
    "TableFullError",
    "TableKind",
    "TableSharding",
    "plan_sharding",
]
