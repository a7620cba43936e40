"""Sparse embedding tables sharded over a gang, and their fused sparse optimizers."""

from embedding.bags import SparseFeatureError
from embedding.collection import PreparedLookup, ShardedEmbeddingCollection
from embedding.eviction import EVICTION_POLICIES, EvictionConfig, EvictionSpec
from embedding.features import JaggedIds, SparseFeatures
from embedding.hash_index import HashPolicy, TableFullError
from embedding.id_hashing import mix64
from embedding.optimizer import CombinedOptimizer, SparseOptimizer, SparseOptimizerStateError
from embedding.optimizers import SPARSE_OPTIMIZERS, SparseOptimizerConfig, SparseOptimizerError, SparseOptimizerSpec
from embedding.optimizers.rowwise_adagrad import RowwiseAdagradConfig
from embedding.planner import TableSharding, plan_sharding
from embedding.row_changes import DELTA_KEY, merge_delta
from embedding.sharding import init_rows
from embedding.state import ShardedStateError
from embedding.table_config import (
    PLACEMENTS,
    EmbeddingConfigError,
    EmbeddingTableConfig,
    Initializer,
    OutOfRangePolicy,
    Placement,
    Pooling,
    TableKind,
)

__all__ = [
    "DELTA_KEY",
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
    "RowwiseAdagradConfig",
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
    "init_rows",
    "merge_delta",
    "mix64",
    "plan_sharding",
]
