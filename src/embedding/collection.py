"""The embedding collection: pooled lookups of many tables, sharded over a gang.

The tables are not ``nn.Parameter``s: a dense optimizer never sees them, DDP never syncs them,
and ``nn.Module.state_dict`` leaves them out. Backward records their gradients in the form the
fused kernels consume (see :class:`embedding.sharding.GradRecord`), and the
:class:`embedding.optimizer.SparseOptimizer` applies them.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from embedding.bags import SparseFeatureError, group_bags, num_bags, table_features
from embedding.dynamic_state import hash_shard_state, load_hash_shard
from embedding.features import SparseFeatures
from embedding.lookup import (
    Bags,
    SentIds,
    TableLookup,
    backward_all,
    forward_all,
    make_lookup,
    send_all_ids,
    sends_ids,
    staged_rows,
)
from embedding.memory import check_tiers, rank_bytes, tier_needs
from embedding.optimizers import SparseOptimizerConfig
from embedding.optimizers.rowwise_adagrad import RowwiseAdagradConfig
from embedding.planner import DEFAULT_REPLICATE_MAX_BYTES, TableSharding, plan_sharding
from embedding.row_changes import changed_rows_masks, delta_group_states
from embedding.sharding import ShardGroup, TableShard, build_groups
from embedding.state import dtype_changes, load_shard_states, shard_states
from embedding.table_config import EmbeddingTableConfig, check_tables
from embedding.tiered_state import load_tiered_group, tiered_group_states
from embedding.tiers.row_cache import StagedRecords
from embedding.tiers.store_opener import StoreOpener
from gang import FakeGang, Gang, ReduceOperation

log = logging.getLogger(__name__)


class ShardedEmbeddingCollection(nn.Module):
    """Embedding tables placed over the ranks of ``gang`` (one process by default).

    ``forward`` maps the sparse features of this rank's batch to one output per feature:
    ``[batch, dim]`` for pooled tables, the ``[num_ids, dim]`` rows for pooling ``"none"``.
    Every rank must call it with the same features, as lookups are collective. The result
    equals, to float tolerance, a single process looking up the same batch. Tables are
    initialised from ``seed`` so that every placement starts from the same values.

    ``shards`` maps each table to this rank's rows of it; ``groups`` are the buffers that hold
    them (see :class:`embedding.sharding.ShardGroup`), each looked up and stepped at once.
    ``optimizer`` is the fused optimizer of the tables that name none of their own: declared
    with the tables, so that a trainer finding the collection in a model knows how to step it.

    On one process, backward keeps the outputs' gradients that autograd hands it, without a
    copy, until the optimizer steps: a gradient given to ``torch.autograd.backward`` by hand
    must not be changed in place before that step.
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingTableConfig],
        gang: Gang | None = None,
        *,
        seed: int = 0,
        optimizer: SparseOptimizerConfig | None = None,
        replicate_max_bytes: int = DEFAULT_REPLICATE_MAX_BYTES,
        storage_dir: str | None = None,
    ) -> None:
        super().__init__()
        check_tables(tables)
        self.tables = tuple(tables)
        self.optimizer = optimizer if optimizer is not None else RowwiseAdagradConfig()
        self.gang = gang if gang is not None else FakeGang()
        self.plan: Mapping[str, TableSharding] = plan_sharding(self.tables, self.gang.size, replicate_max_bytes)
        self.memory_bytes = rank_bytes(self.tables, self.plan, self.gang.rank)
        """This rank's bytes of rows and hash maps (a tiered table's: its cache's) in the memory that computes."""
        self.tier_needs = tier_needs(self.tables, self.plan, self.gang.rank, self.optimizer)
        """Each table's bytes on this rank, rows and optimizer state, near (computing) and far (host or disk)."""
        check_tiers(self.tier_needs, self.gang.device, self.gang.rank)
        self.storage_dir = storage_dir
        """Where the stores of the tables on disk go (a folder per rank), read when a store first opens: a run
        sets its own, in its output directory."""
        stores = StoreOpener(lambda: self.storage_dir, self.gang.rank, self.optimizer)
        self.groups: list[ShardGroup] = build_groups(
            self.tables, self.plan, self.gang.size, self.gang.rank, seed, self.gang.device, stores
        )
        self.shards: Mapping[str, TableShard] = {
            shard.config.name: shard for group in self.groups for shard in group.shards
        }
        self.changed_rows = changed_rows_masks(self.groups)
        """Per group, a bool per buffer row: changed since :meth:`forget_changes` (the sparse optimizer's step
        sets them); ``None`` for a tiered group, whose store marks the rows written (``RowStore.changed``)."""
        # Autograd calls a function's backward only if one of its inputs requires grad; the
        # tables are not inputs, so this empty tensor stands in for them.
        self._grad_anchor = torch.empty(0, requires_grad=True)

    def forward(self, features: SparseFeatures) -> dict[str, torch.Tensor]:
        prepared = features.prepared_for(self) if self.training else None
        if isinstance(prepared, PreparedLookup) and not prepared.used:
            if _versions(features) != prepared.versions:
                raise SparseFeatureError(
                    "The sparse features of a training batch must not change in place once a train pipeline has "
                    "prepared them (their ids were grouped, and sent to the tables' owners, ahead), but did: "
                    "change a copy, or turn the train pipeline off."
                )
            prepared.used = True
            lookups, bags, sent = prepared.lookups, prepared.bags, prepared.sent
            for lookup, staged in zip(lookups, prepared.staged):
                lookup.staged = staged
        else:
            features = features.to(self.gang.device)
            (lookups, bags), sent = self._prepare(features, self.training), None
            if isinstance(prepared, ReadAhead) and not prepared.used:
                prepared.used = True
                for lookup, staged in zip(lookups, prepared.staged):
                    lookup.staged = staged
        pairs_by_group = [table_features(group) for group in self.groups]
        sizes = [[num_bags(table, features[feature]) for table, feature in pairs] for pairs in pairs_by_group]
        pooled = _PooledLookup.apply(self._grad_anchor, lookups, bags, sizes, sent)

        outputs: dict[str, torch.Tensor] = {}
        for (table, feature), rows in zip(itertools.chain.from_iterable(pairs_by_group), pooled):
            if table.pooling == "mean":
                lengths = torch.diff(features[feature].offsets).clamp(min=1).to(rows.dtype)
                rows = rows / lengths.unsqueeze(1)
            outputs[feature] = rows
        return outputs

    def _prepare(self, features: SparseFeatures, training: bool) -> tuple[list[TableLookup], list[Bags]]:
        """The lookups of one forward and their bags: the features checked, grouped and moved to rows; in
        training, sorted too where every row is local (no hash map): for the update, or, replicated, for the sums
        of each distinct id's gradients that every rank sends the others."""
        _check_features(self.tables, features)
        lookups = [make_lookup(group, self.gang, training) for group in self.groups]
        # A tiered group's update takes cache places, not rows: its rows are sorted only where replicas send them.
        sorts = [
            training
            and group.dynamic is None
            and not sends_ids(group, self.gang)
            and (group.tier is None or self.gang.size > 1)
            for group in self.groups
        ]
        return lookups, [group_bags(group, features, sort) for group, sort in zip(self.groups, sorts)]

    @property
    def sends_ids(self) -> bool:
        """Whether a forward sends ids to other ranks (a table sharded over several): what :meth:`prepare_ahead` needs a
        process group of its own for."""
        return any(sends_ids(group, self.gang) for group in self.groups)

    def prepare_ahead(self, features: SparseFeatures, gang: Gang) -> SparseFeatures:
        """Check and group the ``features`` of a later training forward and send their ids to their owners now;
        the features returned carry what was prepared, for that forward to use.

        A train pipeline calls it on a background thread while the current step computes, in the
        same order on every rank, with ``gang``: another process group of this collection's ranks,
        so that its collectives never interleave with the step's (any gang where ``sends_ids`` is
        false: no collective runs). The results are bit-identical to a forward that prepares them
        itself (a forward that finds the features' tensors changed in place since raises
        ``SparseFeatureError``). The features must be on the collection's device already.
        """
        lookups, bags = self._prepare(features, training=True)
        sent = send_all_ids(gang, lookups, bags)
        staged = self._read_ahead(bags, sent)
        return features.with_prepared(PreparedLookup(self, lookups, bags, sent, _versions(features), staged))

    @property
    def reads_ahead(self) -> bool:
        """Whether a train pipeline on a GPU has rows to read ahead (:meth:`read_ahead`): of a fixed table stored off
        the device that this rank looks up itself."""
        return any(self._reads_ahead(group) for group in self.groups)

    def _reads_ahead(self, group: ShardGroup) -> bool:
        return group.tier is not None and group.dynamic is None and not sends_ids(group, self.gang)

    def read_ahead(self, features: SparseFeatures) -> SparseFeatures:
        """``features`` (on the host) carrying the records their later training forward (on a GPU) will bring into
        the caches of tables stored off the device, read now: what a train pipeline on a GPU prepares ahead, where
        the rest of the forward's preparation must wait for the features on the device."""
        staged = [
            staged_rows(group, group_bags(group, features).ids) if self._reads_ahead(group) else None
            for group in self.groups
        ]
        return features.with_prepared(ReadAhead(self, staged))

    def _read_ahead(self, bags: Sequence[Bags], sent: SentIds | None) -> list[StagedRecords | None]:
        """For each tiered group, the records of the rows its lookup will read that its cache lacks now: the ids
        of the batch (or, sent to their owners, those this rank received)."""
        staged: list[StagedRecords | None] = []
        exchanged = 0
        for group, bags_of_group in zip(self.groups, bags):
            rows = bags_of_group.ids
            if sends_ids(group, self.gang):
                assert sent is not None, "Ids of a sharded table were sent."
                rows = sent.payloads[exchanged][:, 0] - group.shards[0].row_start
                exchanged += 1
            # A hash table's slots are known only once its index has looked the ids up, in the forward.
            staged.append(staged_rows(group, rows) if group.tier is not None and group.dynamic is None else None)
        return staged

    def hash_table_statistics(self) -> dict[str, dict[str, float]]:
        """Per hash table, over all ranks: rows used, load factor, and the ids admitted, rejected
        (no row: not admitted yet, or the table full under ``ttl``) and evicted (expired ones
        included) since the run began. Collective: every rank must call it."""
        dynamic = [shard.dynamic for shard in self.shards.values() if shard.dynamic is not None]
        if not dynamic:
            return {}
        names = ("rows_used", "admitted", "rejected", "evicted")
        totals = torch.tensor([[rows.statistics()[name] for name in names] for rows in dynamic], dtype=torch.float64)
        totals = totals.to(self.gang.device)
        self.gang.all_reduce(totals, ReduceOperation.SUM)
        statistics = {}
        for rows, values in zip(dynamic, totals.tolist()):
            table = dict(zip(names, values))
            table["load_factor"] = table["rows_used"] / rows.config.num_rows
            statistics[rows.config.name] = table
        return statistics

    def sharded_state_dict(self) -> dict[str, Any]:
        """This rank's rows of every table and their optimizer state, with global row ranges.

        Like ``nn.Module.state_dict``, the tensors of fixed tables share storage with the live
        tables: save or copy them before the next optimizer step. A hash table's piece is a copy
        (see :mod:`embedding.dynamic_state`), as training lookups change its slots, and so is a
        tiered table's, which holds the rows steps have written (see :mod:`embedding.tiered_state`).
        """
        state = shard_states(
            shard for group in self.groups if group.tier is None for shard in group.shards if shard.dynamic is None
        )
        for shard in self.shards.values():
            if shard.dynamic is not None:
                state["tables"][shard.config.name] = hash_shard_state(shard)
        for group in self.groups:
            if group.tier is not None and group.dynamic is None:
                state["tables"].update(tiered_group_states(group))
        return state

    def delta_state_dict(self, base_step: int) -> dict[str, Any]:
        """Like :meth:`sharded_state_dict`, but each table on the device holds only its rows changed since
        :meth:`forget_changes`, marked as lying over the full checkpoint of ``base_step``, which that call went
        with (``embedding.row_changes.merge_delta`` puts them back over it). The tensors are copies."""
        state: dict[str, Any] = {"tables": {}}
        for group, mask in zip(self.groups, self.changed_rows):
            state["tables"].update(delta_group_states(group, mask, base_step))
        return state

    def forget_changes(self) -> None:
        """Count rows as changed from now on only: a full checkpoint of the tables is being taken."""
        for group, mask in zip(self.groups, self.changed_rows):
            if mask is not None:
                mask.fill_(False)
            elif group.tier is not None:  # its store keeps count (the full checkpoint flushed the cache)
                group.tier.store.changed[:] = False

    def load_sharded_state_dict(self, pieces: Sequence[Mapping[str, Any]]) -> None:
        """Copy in the rows this rank owns from the sharded state dicts of every rank of a
        saving job, whatever its number of ranks or placements; rows saved in another dtype than their table's
        are converted, which the log states in one line."""
        converted = dtype_changes(self.tables, pieces)
        if converted:
            log.info(
                "The checkpoint's rows are loaded into tables of another dtype, converted: %s.", ", ".join(converted)
            )
        on_device = [group for group in self.groups if group.tier is None]
        load_shard_states([shard for group in on_device for shard in group.shards if shard.dynamic is None], pieces)
        for shard in self.shards.values():
            if shard.dynamic is not None:
                load_hash_shard(shard, pieces)
        for group in self.groups:
            if group.tier is not None and group.dynamic is None:
                load_tiered_group(group, pieces)
        for mask in self.changed_rows:  # no row is known to equal a full checkpoint that this run saved
            if mask is not None:
                mask.fill_(True)


@dataclass
class PreparedLookup:
    """A training forward's input, prepared ahead by ``owner``: its lookups, bags and, for all-to-all lookups, the
    ids sent. ``used`` tells a train pipeline whether the forward took it (a model that builds new features from
    a batch's looks those up instead)."""

    owner: ShardedEmbeddingCollection
    lookups: list[TableLookup]
    bags: list[Bags]
    sent: SentIds | None
    versions: tuple[int, ...]  # of the features' tensors: a change in place would make the prepared input stale
    staged: list[StagedRecords | None]
    """Per group, a tiered group's records read ahead (see ``TieredRows.prefetch``)."""
    used: bool = False


@dataclass
class ReadAhead:
    """A training forward's records read ahead by ``owner`` (per group; ``None`` for a group with none), on the
    host, while the features were on their way to a GPU (see ``ShardedEmbeddingCollection.read_ahead``)."""

    owner: ShardedEmbeddingCollection
    staged: list[StagedRecords | None]
    used: bool = False


def _versions(features: SparseFeatures) -> tuple[int, ...]:
    """The in-place version counters of the features' tensors, which any in-place operation on them raises."""
    tensors = [tensor for jagged in features.values() for tensor in (jagged.ids, jagged.offsets, jagged.weights)]
    return tuple(tensor._version for tensor in tensors if tensor is not None)


class _PooledLookup(torch.autograd.Function):
    """Looks every table up in one autograd node, so that the backward of every rank runs the
    tables' collectives in the same order.

    It returns one output per feature (the group's pooled rows, split by ``sizes``) rather than
    leaving the split to autograd, whose backward would concatenate the features' gradients
    into a fresh tensor every step: the lookups take the features' gradients as they come.
    """

    @staticmethod
    def forward(
        ctx: Any,
        grad_anchor: torch.Tensor,
        lookups: list[TableLookup],
        bags: list[Bags],
        sizes: list[list[int]],
        sent: SentIds | None,
    ) -> tuple[torch.Tensor, ...]:
        ctx.lookups, ctx.sizes = lookups, sizes
        outputs: list[torch.Tensor] = []
        for pooled, group_sizes in zip(forward_all(lookups, bags, sent), sizes):
            outputs.extend(torch.split(pooled, group_sizes))
        return tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[None, ...]:
        ends = list(itertools.accumulate(len(group_sizes) for group_sizes in ctx.sizes))
        backward_all(ctx.lookups, [grads[end - len(sizes) : end] for end, sizes in zip(ends, ctx.sizes)])
        return None, None, None, None, None


def _check_features(tables: Sequence[EmbeddingTableConfig], features: SparseFeatures) -> None:
    for table in tables:
        for feature in table.features:
            if feature not in features:
                raise SparseFeatureError(
                    f"`features` must hold feature '{feature}' of table '{table.name}', but holds only "
                    f"{sorted(features)} instead."
                )
