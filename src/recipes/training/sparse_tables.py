"""The sparse tables of a model, found and wired by the framework: optimizer, checkpoint, report.

A sparse table is a module of the model (a ``ShardedEmbeddingCollection``), declared once with
its fused optimizer. Its rows are not parameters, so nothing in torch would step or save them:
the framework walks the model, steps every collection beside the dense optimizer and
checkpoints every collection as sharded state. A recipe that wires tables by hand
(``RecipeParts.make_optimizer`` or ``sharded_state``) must wire all of them: a table left out
would train or resume silently wrong, so it stops the run at start-up instead.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Mapping
from typing import Any

import fsspec
from torch import nn
from torch.optim import Optimizer

from embedding import (
    CombinedOptimizer,
    EmbeddingTableConfig,
    ShardedEmbeddingCollection,
    SparseFeatureError,
    SparseFeatures,
    SparseOptimizer,
    TierNeed,
)
from recipes.config.resolution import ConfigError
from recipes.training.protocols import ShardedStateful

log = logging.getLogger(__name__)


def find_sparse_tables(model: nn.Module) -> dict[str, ShardedEmbeddingCollection]:
    """Every embedding collection of ``model`` by module path (``""`` if the model is one).

    A module the model holds in a plain list, tuple, set or dict is no submodule of it: nothing
    would step, save or even move its parameters or rows, so the model would train as if it were
    frozen. That stops the run here, naming the attribute.
    """
    _refuse_unregistered_modules(model)
    return {name: module for name, module in model.named_modules() if isinstance(module, ShardedEmbeddingCollection)}


def _refuse_unregistered_modules(model: nn.Module) -> None:
    registered = {id(module) for module in model.modules()}
    for path, module in model.named_modules():
        for attribute, value in vars(module).items():
            if attribute.startswith("_") or not isinstance(value, (list, tuple, set, dict)):
                continue
            items = value.values() if isinstance(value, dict) else value
            held = [item for item in items if isinstance(item, nn.Module) and id(item) not in registered]
            trained = [item for item in held if isinstance(item, ShardedEmbeddingCollection) or _has_trainable(item)]
            if trained:
                where = f"model.{path}.{attribute}" if path else f"model.{attribute}"
                kind = "ModuleDict" if isinstance(value, dict) else "ModuleList"
                raise ConfigError(
                    f"`{where}` holds a {type(trained[0]).__name__} in a plain {type(value).__name__}, where nothing "
                    f"trains or saves it: hold it in an nn.{kind} (or as an attribute) so that it is a submodule."
                )


def _has_trainable(module: nn.Module) -> bool:
    return any(parameter.requires_grad for parameter in module.parameters())


def with_sparse_tables(
    dense: Optimizer,
    collections: Mapping[str, ShardedEmbeddingCollection],
) -> Optimizer:
    """``dense`` and one fused optimizer over every collection, stepped as one (``dense`` alone without tables)."""
    if not collections:
        return dense
    return CombinedOptimizer(dense, SparseOptimizer(list(collections.values())))


def build_optimizer_with_tables(
    model: nn.Module,
    collections: Mapping[str, ShardedEmbeddingCollection],
    build_dense: Callable[[nn.Module], Optimizer],
    make_optimizer: Callable[[nn.Module], Optimizer] | None,
) -> Optimizer:
    """The recipe's own optimizer if it makes one, checked to step every table; else dense + sparse."""
    if make_optimizer is None:
        return with_sparse_tables(build_dense(model), collections)
    optimizer = make_optimizer(model)
    stepped = {id(c) for c in optimizer.sparse.collections} if isinstance(optimizer, CombinedOptimizer) else set()
    for path, collection in collections.items():
        if id(collection) not in stepped:
            raise ConfigError(
                f"The sparse table '{collection.tables[0].name}' ({_where(path)}) must be stepped by the optimizer "
                "of `RecipeParts.make_optimizer`, but is not: leave `make_optimizer` out to have the framework "
                "step every table, or combine them all (`CombinedOptimizer(dense, SparseOptimizer([...]))`)."
            )
    return optimizer


def sharded_state_with_tables(
    collections: Mapping[str, ShardedEmbeddingCollection],
    sharded_state: Mapping[str, ShardedStateful],
) -> dict[str, ShardedStateful]:
    """The recipe's sharded state, checked to hold every table; without one, every collection by module path."""
    if not sharded_state:
        return {path or "tables": collection for path, collection in collections.items()}
    held = {id(stateful) for stateful in sharded_state.values()}
    for path, collection in collections.items():
        if id(collection) not in held:
            raise ConfigError(
                f"The sparse table '{collection.tables[0].name}' ({_where(path)}) must be in "
                "`RecipeParts.sharded_state`, or checkpoints would resume without its rows, but is not: leave "
                "`sharded_state` out to have the framework checkpoint every table, or add it."
            )
    return dict(sharded_state)


def refuse_features_without_tables(collections: Mapping[str, ShardedEmbeddingCollection]) -> None:
    """Make a batch feature that no table of the model looks up an error at its first lookup.

    A collection looks up the features its tables name and ignores the rest, so a feature the
    data has but no table names (a typo, a column added to the schema) would train as if it
    were absent. The union over all collections counts: a model may hand every feature to each.
    """
    features_with_tables = {feature for c in collections.values() for table in c.tables for feature in table.features}

    def check(module: nn.Module, inputs: tuple[Any, ...]) -> None:
        if inputs and isinstance(inputs[0], SparseFeatures):
            orphans = sorted(set(inputs[0]) - features_with_tables)
            if orphans:
                raise SparseFeatureError(
                    f"Every sparse feature of a batch must be looked up by a table of the model, but '{orphans[0]}' "
                    f"is looked up by none (the tables look up {', '.join(sorted(features_with_tables))})."
                )

    for collection in collections.values():
        collection.register_forward_pre_hook(check)


TABLE_STORES = "table_stores"
"""The folder of a run's output directory that holds its tables' disk stores, where no directory is configured."""


def place_table_stores(
    collections: Mapping[str, ShardedEmbeddingCollection], directory: str, *, replace: bool = False
) -> None:
    """Give the disk stores of every collection without a directory of its own (with ``replace``, of every one)
    ``directory``, which must be local: a store is a file mapped into memory. Checked here, at start-up, not when
    the first store opens mid-run."""
    for collection in collections.values():
        if not any(t.storage.tier == "disk" for t in collection.tables):
            continue
        own = collection.storage_dir if collection.storage_dir is not None and not replace else directory
        protocol, path = fsspec.core.split_protocol(own)
        if protocol not in (None, "file", "local"):
            table = next(t.name for t in collection.tables if t.storage.tier == "disk")
            raise ConfigError(
                f"The disk store of table '{table}' must be in a local directory, but would be in {own}: "
                "set `model.embeddings.storage_dir` to a folder on local disk."
            )
        collection.storage_dir = path
        _check_disk_space(collection, path)


def _check_disk_space(collection: ShardedEmbeddingCollection, directory: str) -> None:
    """Stop if the disk of ``directory`` lacks room for this rank's disk stores at their full size (a store grows
    as rows are written: a full disk found mid-run would end the run)."""
    needed = sum(need.far for need in collection.tier_needs if need.table.storage.tier == "disk")
    existing = directory
    while not os.path.isdir(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    free = shutil.disk_usage(existing).free
    if needed > free:
        raise ConfigError(
            f"The disk stores of the sparse tables need {needed / 2**30:.1f} GiB in {directory} on rank "
            f"{collection.gang.rank}, but only {free / 2**30:.1f} GiB are free: free some, set "
            "`model.embeddings.storage_dir` to a bigger disk, or use more ranks."
        )


def hash_table_metrics(collections: Mapping[str, ShardedEmbeddingCollection]) -> dict[str, float]:
    """``hash_tables/<table>/<statistic>`` for every hash table: rows used, load factor, admitted, rejected and
    evicted ids (see ``ShardedEmbeddingCollection.hash_table_statistics``). Collective."""
    return {
        f"hash_tables/{table}/{name}": value
        for collection in collections.values()
        for table, statistics in collection.hash_table_statistics().items()
        for name, value in statistics.items()
    }


def report_sparse_tables(collections: Mapping[str, ShardedEmbeddingCollection]) -> list[str]:
    """One line per table: rows, dim, placement, optimizer, where its rows live and the bytes this rank holds
    (rows and state, or a cache of them, in the memory that computes; the whole shard on host or disk)."""
    lines, total = [], 0
    for path, collection in collections.items():
        for table, need in zip(collection.tables, collection.tier_needs):
            config = table.optimizer or collection.optimizer
            total += need.near
            lines.append(
                f"sparse table '{table.name}' ({_where(path)}): {_layout(table, collection)}, "
                f"{config.name} lr={config.lr:g}, {_storage(table, need, collection.gang.rank)}, "
                f"features {', '.join(table.features)}"
            )
    if collections:
        rank = next(iter(collections.values())).gang.rank
        lines.append(f"sparse tables hold {_human_bytes(total)} on rank {rank} (rows, optimizer state, hash maps)")
    for line in lines:
        log.info(line)
    return lines


def _layout(table: EmbeddingTableConfig, collection: ShardedEmbeddingCollection) -> str:
    ranks = f"{collection.gang.size} rank(s)"
    dim = f"{table.dim}" if table.dtype == "float32" else f"{table.dim} {table.dtype}"  # float32 goes without saying
    if table.kind == "fixed":
        return f"{table.num_rows:,} rows x {dim}, {collection.plan[table.name].placement} over {ranks}"
    policy = table.hash_policy
    return (
        f"hash table of {table.num_rows:,} rows x {dim} (min_count {policy.min_count}, admit_probability "
        f"{policy.admit_probability:g}, eviction {policy.eviction}), sharded by id over {ranks}"
    )


def _storage(table: EmbeddingTableConfig, need: TierNeed, rank: int) -> str:
    """Where the rows live and what they take: ``24.0 MiB on rank 0``, or the tier's bytes and the cache's."""
    if not table.storage.tiered:
        return f"{_human_bytes(need.near)} on rank {rank}"
    storage = table.storage
    return (
        f"stored on {storage.tier} ({_human_bytes(need.far)} on rank {rank}) with a cache of "
        f"{_human_bytes(need.near)} ({storage.eviction})"
    )


def _where(path: str) -> str:
    return f"model.{path}" if path else "the model"


def _human_bytes(num_bytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes} B"
