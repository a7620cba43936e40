"""The configuration of embedding tables: their shape, the features that look them up, how
lookups are pooled, initialised, optimised and placed over the ranks of a gang."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch

from embedding.hash_index import HashPolicy
from embedding.optimizers import SparseOptimizerConfig
from embedding.tiers.storage_config import TableStorage

Pooling = Literal["sum", "mean", "none"]
"""How the ids of one sample are combined: summed, averaged, or kept as one row each."""

Initializer = Literal["uniform", "normal"]

OutOfRangePolicy = Literal["error", "hash"]
"""What an id outside ``[0, num_rows)`` does: raise, or wrap modulo ``num_rows``."""

Placement = Literal["table_wise", "row_wise", "replicated"]
"""Where the rows of a table live: all on one rank, in contiguous ranges over every rank, or
every row on every rank (data-parallel)."""

PLACEMENTS: tuple[Placement, ...] = get_args(Placement)

TableDtype = Literal["float32", "float16", "bfloat16"]
"""How a table stores its rows: a step computes in float32 and rounds a half-precision row stochastically when
it writes it back (:mod:`embedding.kernels.rounding`); lookups pool in float32."""

TABLE_DTYPES: dict[TableDtype, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

TableKind = Literal["fixed", "hash"]
"""``fixed``: ids are rows, in ``[0, num_rows)``; ``hash``: any int64 id gets a row of its own, out of
``num_rows`` (the capacity), when admitted (see :mod:`embedding.hash_index`)."""


class EmbeddingConfigError(ValueError):
    """Raised when an embedding table or collection is configured with invalid values."""


@dataclass(frozen=True)
class EmbeddingTableConfig:
    """One embedding table of ``num_rows`` x ``dim`` rows, stored in ``dtype``.

    ``features`` names the sparse features that look the table up; several features may share
    one table (the DLRM layout), each still getting its own output. ``init_scale`` is the bound
    of the uniform initializer or the standard deviation of the normal one; by default it is
    ``sqrt(1 / num_rows)``, torchrec's default bound. ``optimizer`` overrides the sparse
    optimizer of the collection for this table, ``placement`` the planner's choice. ``storage``
    keeps the rows on the device (the default), or on the host or disk behind a cache of hot rows
    (:mod:`embedding.tiers`). ``dtype`` halves the bytes of a row in ``float16`` or ``bfloat16`` (on the device
    only, for now); the optimizer state stays float32.
    """

    name: str
    num_rows: int
    dim: int
    features: tuple[str, ...]
    pooling: Pooling = "sum"
    initializer: Initializer = "uniform"
    init_scale: float | None = None
    optimizer: SparseOptimizerConfig | None = None
    out_of_range: OutOfRangePolicy = "error"
    placement: Placement | None = field(default=None)
    kind: TableKind = "fixed"
    hash_policy: HashPolicy = field(default_factory=HashPolicy)
    storage: TableStorage = field(default_factory=TableStorage)
    dtype: TableDtype = "float32"

    def __post_init__(self) -> None:
        # Configs read from YAML carry lists; a tuple keeps the config hashable and frozen.
        object.__setattr__(self, "features", tuple(self.features))
        if not self.name:
            raise EmbeddingConfigError("`name` of an embedding table must be a non-empty string, but is '' instead.")
        if self.num_rows < 1:
            rows = "capacity" if self.kind == "hash" else "num_rows"
            raise EmbeddingConfigError(
                f"`{rows}` of table '{self.name}' must be at least 1, but is {self.num_rows} instead."
            )
        if self.dim < 1:
            raise EmbeddingConfigError(f"`dim` of table '{self.name}' must be at least 1, but is {self.dim} instead.")
        if not self.features:
            raise EmbeddingConfigError(
                f"`features` of table '{self.name}' must name at least one feature, but is empty instead."
            )
        _check_choice(self.name, "pooling", self.pooling, get_args(Pooling))
        _check_choice(self.name, "initializer", self.initializer, get_args(Initializer))
        _check_choice(self.name, "out_of_range", self.out_of_range, get_args(OutOfRangePolicy))
        if self.placement is not None:
            _check_choice(self.name, "placement", self.placement, PLACEMENTS)
        _check_choice(self.name, "kind", self.kind, get_args(TableKind))
        _check_choice(self.name, "dtype", self.dtype, get_args(TableDtype))
        if self.dtype != "float32" and self.storage.tiered:
            raise EmbeddingConfigError(
                f"`dtype` of table '{self.name}' must be float32 for a table stored on {self.storage.tier} (only "
                f"tables on the device store half-precision rows yet), but is {self.dtype} instead."
            )
        if self.kind == "hash":
            self._check_hash_table()
        if self.init_scale is not None and self.init_scale < 0.0:
            raise EmbeddingConfigError(
                f"`init_scale` of table '{self.name}' must be at least 0, but is {self.init_scale} instead."
            )

    def _check_hash_table(self) -> None:
        policy = self.hash_policy
        if policy.min_count < 1:
            raise EmbeddingConfigError(
                f"`min_count` of hash table '{self.name}' must be at least 1, but is {policy.min_count} instead."
            )
        if not 0.0 < policy.admit_probability <= 1.0:
            raise EmbeddingConfigError(
                f"`admit_probability` of hash table '{self.name}' must be in (0, 1], but is "
                f"{policy.admit_probability} instead."
            )
        if self.out_of_range != "error":
            raise EmbeddingConfigError(
                f"`out_of_range` of hash table '{self.name}' must be error (a hash table takes any id), but is "
                f"{self.out_of_range} instead."
            )
        if self.placement not in (None, "row_wise"):
            raise EmbeddingConfigError(
                f"`placement` of hash table '{self.name}' must be row_wise (rows sharded by a hash of the id), but is "
                f"{self.placement} instead."
            )

    @property
    def initial_scale(self) -> float:
        """The uniform initializer's bound or the normal one's standard deviation."""
        return self.init_scale if self.init_scale is not None else (1.0 / self.num_rows) ** 0.5

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype of the rows."""
        return TABLE_DTYPES[self.dtype]

    @property
    def row_bytes(self) -> int:
        """The bytes of one row (its optimizer state aside)."""
        return self.dim * self.torch_dtype.itemsize

    @property
    def num_bytes(self) -> int:
        return self.num_rows * self.row_bytes


def check_tables(tables: Sequence[EmbeddingTableConfig]) -> None:
    """Raise if two tables share a name or a feature looks up two tables."""
    if not tables:
        raise EmbeddingConfigError("`tables` must hold at least one table, but is empty instead.")
    table_of_feature: dict[str, str] = {}
    names: set[str] = set()
    for table in tables:
        if table.name in names:
            raise EmbeddingConfigError(f"Table names must be unique, but '{table.name}' is used twice.")
        names.add(table.name)
        for feature in table.features:
            if feature in table_of_feature:
                raise EmbeddingConfigError(
                    f"A feature must look up one table, but '{feature}' looks up "
                    f"'{table_of_feature[feature]}' and '{table.name}'."
                )
            table_of_feature[feature] = table.name


def _check_choice(table: str, name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise EmbeddingConfigError(
            f"`{name}` of table '{table}' must be one of {', '.join(choices)}, but is '{value}' instead."
        )
