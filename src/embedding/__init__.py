"""Sparse embedding tables sharded over a gang, and their fused sparse optimizers."""

from embedding.bags import SparseFeatureError
from embedding.collection import PreparedLookup, ReadAhead, ShardedEmbeddingCollection
from embedding.eviction import EVICTION_POLICIES, EvictionConfig, EvictionSpec
from embedding.features import JaggedIds, SparseFeatures
from embedding.hash_index import HashPolicy, TableFullError
from embedding.id_hashing import mix64
from embedding.memory import TierNeed
from embedding.optimizer import CombinedOptimizer, SparseOptimizer, SparseOptimizerStateError
from embedding.optimizers import SPARSE_OPTIMIZERS, SparseOptimizerConfig, SparseOptimizerError, SparseOptimizerSpec
from embedding.optimizers.rowwise_adagrad import RowwiseAdagradConfig
from embedding.planner import TableSharding, plan_sharding
from embedding.row_changes import DELTA_KEY, merge_delta
from embedding.sharding import init_rows
from embedding.state import ShardedStateError, initial_rows, saved_rows_in_range
from embedding.table_config import (
    PLACEMENTS,
    TABLE_DTYPES,
    EmbeddingConfigError,
    EmbeddingTableConfig,
    Initializer,
    OutOfRangePolicy,
    Placement,
    Pooling,
    TableDtype,
    TableKind,
)
from embedding.tiers import CacheEviction, StorageTier, TableStorage
from embedding.tiers.stores import DamagedStoreError

__all__ = [
    "DELTA_KEY",
    "EVICTION_POLICIES",
    "PLACEMENTS",
    "SPARSE_OPTIMIZERS",
    "TABLE_DTYPES",
    "CacheEviction",
    "CombinedOptimizer",
    "DamagedStoreError",
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
    "ReadAhead",
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
    "StorageTier",
    "TableDtype",
    "TableFullError",
    "TableKind",
    "TableSharding",
    "TableStorage",
    "TierNeed",
    "init_rows",
    "initial_rows",
    "merge_delta",
    "mix64",
    "plan_sharding",
    "saved_rows_in_range",
]
