"""Embedding tables for the built-in models: sharded sparse tables, or plain ``nn.EmbeddingBag``s.

Both map a batch's ``SparseFeatures`` to one pooled ``[B, dim]`` tensor per feature, so a model
does not care which it has. The sparse tables are the default; the dense ones are the baseline
they are measured against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal

import torch
from torch import nn

from embedding import (
    EVICTION_POLICIES,
    SPARSE_OPTIMIZERS,
    CacheEviction,
    EmbeddingTableConfig,
    EvictionConfig,
    HashPolicy,
    Pooling,
    RowwiseAdagradConfig,
    ShardedEmbeddingCollection,
    SparseFeatures,
    SparseOptimizerConfig,
    StorageTier,
    TableDtype,
    TableStorage,
    init_rows,
)
from gang import Gang
from recipes import ConfigError, PositiveInt, Range


@dataclass
class HashTableSection:
    """How the tables of ``kind: hash`` admit and evict ids (see ``embedding.hash_index``)."""

    min_count: PositiveInt = 1
    """An id gets a row once looked up this many times in training; until then it reads zeros."""
    admit_probability: Annotated[float, Range(gt=0, le=1)] = 1.0
    """Each training step that looks up an id without a row admits it with this probability (seeded)."""
    eviction: Annotated[EvictionConfig, EVICTION_POLICIES] = field(default_factory=EVICTION_POLICIES.default("lru"))
    """When a table is full: ``lru`` evicts the least recently looked-up id, ``lfu`` the least often (both
    among sampled rows), ``{name: ttl, ttl_steps: N}`` frees ids not looked up in the last N steps and admits no
    more while full, ``none`` stops the run; or a policy an installed package registers (``embedding.eviction``)."""

    def to_policy(self) -> HashPolicy:
        return HashPolicy(self.min_count, self.admit_probability, self.eviction)


@dataclass
class CacheSection:
    """The cache of hot rows in front of a table stored on ``host`` or ``disk``."""

    rows: PositiveInt | None = None
    """Rows the cache holds (each with its optimizer state); null: as many as ``bytes`` hold, else a fifth of
    the table's rows (FBGEMM's default)."""
    bytes: PositiveInt | None = None
    """Bytes of rows and optimizer state the cache holds; null: see ``rows``."""
    eviction: CacheEviction = "lru"
    """Which cached row a missing one replaces: ``lru`` the least recently looked up, ``lfu`` the least often."""


@dataclass
class TableStorageSection:
    """Where one table's rows live and in what dtype, over the section's ``storage``, ``cache`` and ``dtype``."""

    storage: StorageTier | None = None
    """``device``, ``host`` or ``disk`` for this table; null: the section's ``storage``."""
    cache: CacheSection | None = None
    """This table's cache; null: the section's ``cache``."""
    dtype: TableDtype | None = None
    """``float32``, ``float16`` or ``bfloat16`` for this table's rows; null: the section's ``dtype``."""


@dataclass
class EmbeddingSection:
    dim: PositiveInt = 16
    """The embedding dimension of every table."""
    backend: Literal["sparse", "dense"] = "sparse"
    """``sparse``: tables sharded over the DP gang, updated by fused kernels; ``dense``: ``nn.EmbeddingBag`` trained
    by the dense optimizer, starting from the same values as the sparse tables."""
    placement: Literal["auto", "table_wise", "row_wise", "replicated"] = "auto"
    """Where the sparse tables' rows live. ``auto``: the planner's choice (on several ranks, tables up to 8 MiB
    replicated, a table over a rank's share of all bytes row-wise, the rest whole, balancing bytes and lookups)."""
    storage: StorageTier = "device"
    """Where the sparse tables' rows and optimizer state live: ``device`` (the memory that computes: RAM on a CPU,
    HBM on a GPU), ``host`` (host memory, a cache of hot rows on the GPU) or ``disk`` (a file per table and rank on
    local disk, a cache of hot rows in memory: for tables bigger than memory). Rows start from the same values and
    train to the same values on every tier."""
    cache: CacheSection = field(default_factory=CacheSection)
    """The cache of hot rows of the tables on ``host`` or ``disk``."""
    dtype: TableDtype = "float32"
    """The dtype of the sparse tables' rows: ``float16`` or ``bfloat16`` halve their bytes. A step computes in
    float32 and rounds a row stochastically as it writes it back (random bits from the seed, step, row and element:
    a resumed run, or one on another number of ranks, rounds alike); lookups pool in float32 and the optimizer
    state stays float32. Tables on ``host`` or ``disk`` are float32 only, for now. A checkpoint keeps its tables'
    dtype; resuming it with another converts the rows, and the run says so."""
    tables: dict[str, TableStorageSection] = field(default_factory=dict)
    """Per table by name: its own ``storage``, ``cache`` and ``dtype`` (``{item_id: {storage: disk}}``)."""
    storage_dir: str | None = None
    """The local directory of the tables' disk stores (a folder per rank); null: ``table_stores`` in the run's
    output directory. ``eval`` and ``predict`` keep theirs in a temporary directory."""
    sparse_optimizer: Annotated[SparseOptimizerConfig, SPARSE_OPTIMIZERS] = field(
        default_factory=lambda: RowwiseAdagradConfig(lr=0.05)
    )
    """The fused optimizer of the sparse tables (the dense layers use the ``optimizer`` section), by name with
    its own options (``{name: adam, beta1: 0.8}``): a module of ``embedding.optimizers``, or one an installed
    package registers. ``lr: 0`` freezes the tables."""
    kind: Literal["fixed", "hash"] = "fixed"
    """``fixed``: the data reader maps each value to one of a table's rows (hashing modulo its rows, so values
    may share one); ``hash``: a value keeps its full 64-bit id and gets a row of its own when admitted, the
    table's rows being its capacity (sparse backend only)."""
    hash: HashTableSection = field(default_factory=HashTableSection)


@dataclass(frozen=True)
class TableSpec:
    """A table a model needs: its rows, the features that look it up, and how they pool."""

    name: str
    num_rows: int
    features: tuple[str, ...]
    pooling: Pooling = "sum"
    """``none``: the feature's ids are not pooled (a sequence): a lookup gives each id's vector, ``[ids, dim]``."""
    dim: int | None = None
    """The table's own dim (a model may size its tables apart, ``recsys.zoo``), or None for the section's."""


class DenseEmbeddingBags(nn.Module):
    """One ``nn.EmbeddingBag`` per table (an ``nn.Embedding`` for a table that does not pool), trained by the dense
    optimizer like any parameter.

    Each starts from the very values the sparse table of the same name and ``seed`` would
    (not ``nn.EmbeddingBag``'s N(0, 1)), so the two backends compare on their updates alone.
    """

    def __init__(
        self, tables: Sequence[TableSpec], dim: int, seed: int = 0, *, init_scale: float | None = None
    ) -> None:
        super().__init__()
        self.bags = nn.ModuleDict()
        for t in tables:
            table_dim = dim if t.dim is None else t.dim
            config = EmbeddingTableConfig(
                t.name, t.num_rows, table_dim, t.features, pooling=t.pooling, init_scale=init_scale
            )
            initial = init_rows(config, 0, t.num_rows, seed, torch.device("cpu"))
            self.bags[t.name] = (
                nn.Embedding.from_pretrained(initial, freeze=False)
                if t.pooling == "none"
                else nn.EmbeddingBag.from_pretrained(initial, freeze=False, mode=t.pooling)
            )
        self.table_of = {feature: t.name for t in tables for feature in t.features}

    def forward(self, features: SparseFeatures) -> dict[str, torch.Tensor]:
        looked_up = {}
        for name in features:
            if name not in self.table_of:
                continue
            table, feature = self.bags[self.table_of[name]], features[name]
            if isinstance(table, nn.EmbeddingBag):
                looked_up[name] = table(feature.ids, feature.offsets[:-1], per_sample_weights=feature.weights)
            else:  # Not pooled: each id's vector, as the sparse tables give them.
                looked_up[name] = table(feature.ids)
        return looked_up


def build_embeddings(
    section: EmbeddingSection,
    tables: Sequence[TableSpec],
    gang: Gang,
    seed: int,
    *,
    dim: int | None = None,
    prefix: str = "",
    init_scale: float | None = None,
) -> nn.Module:
    """The model's tables as the section asks; sparse tables are sharded over ``gang``.

    A table is of its own ``TableSpec.dim`` where it has one, else of the section's. A model that
    needs a second set of the same tables (the dim-1 first-order weights of a factorization machine
    beside its vectors) overrides ``dim`` for all of them and names them apart with ``prefix``:
    table names key the start-up report and the initial values, so two sets must not share them.
    ``init_scale`` overrides the tables' default initial range; 0 starts them at zero.
    """
    _check_table_names(section, tables)
    tables = [
        TableSpec(prefix + t.name, t.num_rows, t.features, t.pooling, t.dim if dim is None else dim) for t in tables
    ]
    dim = section.dim
    if section.backend == "dense":
        if section.kind == "hash":
            raise ConfigError("`embeddings.kind` hash needs `embeddings.backend` sparse, but the backend is dense.")
        tiered = [t.name for t in tables if table_storage(section, t.name.removeprefix(prefix)).tiered]
        if tiered:
            raise ConfigError(
                f"`embeddings.backend` must be sparse for a table stored off the device, but is dense (table "
                f"'{tiered[0]}' is stored on {table_storage(section, tiered[0].removeprefix(prefix)).tier})."
            )
        halved = [t.name for t in tables if table_dtype(section, t.name.removeprefix(prefix)) != "float32"]
        if halved:
            raise ConfigError(
                f"`embeddings.backend` must be sparse for a table of half-precision rows, but is dense (table "
                f"'{halved[0]}' is of {table_dtype(section, halved[0].removeprefix(prefix))})."
            )
        return DenseEmbeddingBags(tables, dim, seed, init_scale=init_scale).to(gang.device)
    placement = None if section.placement == "auto" else section.placement
    configs = [
        EmbeddingTableConfig(
            t.name,
            t.num_rows,
            dim if t.dim is None else t.dim,
            t.features,
            pooling=t.pooling,
            init_scale=init_scale,
            placement=placement,
            kind=section.kind,
            hash_policy=section.hash.to_policy(),
            storage=table_storage(section, t.name.removeprefix(prefix)),
            dtype=table_dtype(section, t.name.removeprefix(prefix)),
        )
        for t in tables
    ]
    return ShardedEmbeddingCollection(
        configs, gang, seed=seed, optimizer=section.sparse_optimizer, storage_dir=section.storage_dir
    )


def table_storage(section: EmbeddingSection, table: str) -> TableStorage:
    """Where ``table``'s rows live: its own entry of ``section.tables`` over the section's."""
    own = section.tables.get(table, TableStorageSection())
    cache = own.cache if own.cache is not None else section.cache
    tier = own.storage if own.storage is not None else section.storage
    return TableStorage(tier, cache_rows=cache.rows, cache_bytes=cache.bytes, eviction=cache.eviction)


def table_dtype(section: EmbeddingSection, table: str) -> TableDtype:
    """The dtype of ``table``'s rows: its own entry of ``section.tables`` over the section's."""
    own = section.tables.get(table, TableStorageSection()).dtype
    return own if own is not None else section.dtype


def _check_table_names(section: EmbeddingSection, tables: Sequence[TableSpec]) -> None:
    names = [t.name for t in tables]
    for name, own in section.tables.items():
        if name not in names:
            raise ConfigError(
                f"`embeddings.tables` must name tables of the model ({', '.join(names)}), but names '{name}' instead."
            )
        if own.cache is not None and own.cache.rows is not None and own.cache.bytes is not None:
            raise ConfigError(f"`embeddings.tables.{name}.cache` must set rows or bytes, but sets both.")
    if section.cache.rows is not None and section.cache.bytes is not None:
        raise ConfigError("`embeddings.cache` must set rows or bytes, but sets both.")


def table_of(embeddings: nn.Module, feature: str) -> tuple[str, str, int]:
    """The table that looks up ``feature`` in ``embeddings``, the feature, and the table's dim."""
    if isinstance(embeddings, ShardedEmbeddingCollection):
        table = next(table for table in embeddings.tables if feature in table.features)
        return table.name, feature, table.dim
    if isinstance(embeddings, DenseEmbeddingBags):
        name = embeddings.table_of[feature]
        bag = embeddings.bags[name]
        assert isinstance(bag, (nn.Embedding, nn.EmbeddingBag))
        return name, feature, bag.embedding_dim
    raise TypeError(f"Embeddings must be sparse tables or embedding bags, but are {type(embeddings).__name__}.")
