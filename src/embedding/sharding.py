"""Where the rows of the tables live on this rank, and the gradients recorded for them.

A :class:`TableShard` holds the rows of one table that this rank stores, with their optimizer
state: the unit that checkpoints save. A :class:`ShardGroup` stores several shards in one
buffer (FBGEMM's table batching): one lookup and one fused kernel call serve all its tables,
so many small tables cost what one big table does. Backward records gradients on the group,
in the form the fused kernels consume.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from embedding.dynamic_rows import DynamicRows
from embedding.id_hashing import init_rows_by_key, init_salt
from embedding.kernels import SortedIds
from embedding.kernels.rounding import DeviceRowKeys, RowKeys
from embedding.optimizers import SparseOptimizerConfig
from embedding.planner import TableSharding
from embedding.table_config import EmbeddingConfigError, EmbeddingTableConfig
from embedding.tiers.row_cache import StagedRecords, TieredRows
from embedding.tiers.store_opener import FreshRecords, StoreOpener

_HUGE_PAGE_BYTES = 2 << 20

_MADV_HUGEPAGE = 14
"""``madvise`` advice from Linux's ``<sys/mman.h>``: back this range with transparent huge pages."""


@dataclass(frozen=True)
class GradRecord:
    """Gradients for the fused update: row ``ids[k]`` (local) receives
    ``grad_scale[k] * grad_rows[grad_index[k]]``, ``grad_rows`` being read as the concatenation
    of its pieces (one per feature where the gradients come from autograd), which the CPU
    kernel reads in place. ``sorted_ids``: ``ids`` sorted by the forward already, for the kernel."""

    ids: torch.Tensor
    grad_rows: tuple[torch.Tensor, ...]
    grad_index: torch.Tensor
    grad_scale: torch.Tensor | None
    sorted_ids: SortedIds | None = None


@dataclass
class TableShard:
    """Rows ``[row_start, row_end)`` of a table as stored on this rank: views into its group."""

    config: EmbeddingTableConfig
    sharding: TableSharding
    row_start: int
    row_end: int
    weight: torch.Tensor
    optimizer_state: dict[str, torch.Tensor] = field(default_factory=dict)
    dynamic: DynamicRows | None = None
    """A hash table's slots: which id each row holds (``None`` for a fixed table)."""
    state_fill: dict[str, float] = field(default_factory=dict)
    """Each optimizer state's initial value, by name: what a row no step has touched holds."""
    tier: TieredRows | None = None
    """Its group's cache and store, for a table stored off the device (``weight`` is then the cache's)."""

    @property
    def num_rows(self) -> int:
        return self.row_end - self.row_start


@dataclass
class ShardGroup:
    """Shards stored one after the other in ``weight``, looked up and stepped together.

    Its tables share a dim and an optimizer. On a gang of several ranks, only replicated tables
    share a group, as each table-wise or row-wise table needs an all-to-all of its own. A hash
    table is a group of its own, whose ``dynamic`` rows map ids to slots; its buffer ends with
    the default row that ids without a slot read.
    """

    shards: list[TableShard]
    buffer_offsets: list[int]
    weight: torch.Tensor
    optimizer_state: dict[str, torch.Tensor] = field(default_factory=dict)
    grads: list[GradRecord] = field(default_factory=list)
    dynamic: DynamicRows | None = None
    tier: TieredRows | None = None
    """Off the device (host or disk storage): the cache whose places ``weight`` and the state are, over the
    store of every row. Lookups translate rows to places (:meth:`places_of`)."""
    seed: int = 0
    """The run's seed, which keys the stochastic rounding of half-precision rows with the tables' names."""
    _grad_rows_buffer: torch.Tensor | None = field(default=None, repr=False)

    @property
    def num_buffer_rows(self) -> int:
        """The rows of the group's buffer: of its store for a tiered group, whose ``weight`` is a cache of them."""
        return sum(shard.num_rows for shard in self.shards) if self.tier is not None else self.weight.size(0)

    @property
    def placement(self) -> str:
        return self.shards[0].sharding.placement

    @property
    def optimizer(self) -> SparseOptimizerConfig | None:
        """The optimizer override of the group's tables (``None``: the collection default)."""
        return self.shards[0].config.optimizer

    def row_keys(self) -> RowKeys:
        """What the random bits of the rounding of each buffer row are keyed by: its table and global row, or a
        hash table's id (see :class:`embedding.kernels.rounding.RowKeys`), as its index holds them: on a GPU, the
        device's ids, which the kernels read there (:class:`embedding.kernels.rounding.DeviceRowKeys`)."""
        ends = [offset + shard.num_rows for shard, offset in zip(self.shards, self.buffer_offsets)]
        salts = np.array([init_salt(self.seed, shard.config.name) for shard in self.shards], dtype=np.uint64)
        bases = [s.row_start - offset for s, offset in zip(self.shards, self.buffer_offsets)]
        keys = (salts, np.array(ends, dtype=np.int64), np.array(bases, dtype=np.int64))
        held = self.dynamic.index.held_keys if self.dynamic is not None else None
        if isinstance(held, torch.Tensor):
            return DeviceRowKeys(*keys, device_slot_ids=held)
        return RowKeys(*keys, held)

    def places_of(self, rows: torch.Tensor, training: bool, staged: StagedRecords | None = None) -> torch.Tensor:
        """Where ``rows`` (of the buffer) are in a tiered group's cache, brought in and pinned (see
        :meth:`embedding.tiers.row_cache.TieredRows.install`); the buffers follow a cache that grew."""
        assert self.tier is not None, "Only a tiered group has places."
        places = self.tier.install(rows, training, staged)
        self.weight, self.optimizer_state = self.tier.weight, self.tier.optimizer_state
        return places

    def set_optimizer_state(self, state: dict[str, torch.Tensor], fill: Mapping[str, float]) -> None:
        """Take ``state`` for the whole buffer, and give every shard its rows of it; ``fill`` is
        each state's initial value, which a hash table's reused row starts from again.

        Each tensor is moved to memory backed by huge pages, like the weights (see
        :func:`empty_on_huge_pages`), as the update reads and writes its rows with theirs.
        """
        if self.tier is not None:
            self.tier.set_optimizer_state(state, fill)
            state = self.tier.optimizer_state
        else:
            state = {key: _copy_on_huge_pages(tensor) for key, tensor in state.items()}
        self.optimizer_state = state
        if self.dynamic is not None:
            self.dynamic.state_fill = dict(fill)
        for shard in self.shards:
            shard.state_fill = dict(fill)
        if self.tier is not None:  # the shards' rows are in the store: only the group knows where
            return
        for shard, offset in zip(self.shards, self.buffer_offsets):
            shard.optimizer_state = {key: tensor[offset : offset + shard.num_rows] for key, tensor in state.items()}

    def concat_grad_rows(self, pieces: Sequence[torch.Tensor]) -> torch.Tensor:
        """``pieces`` (gradient rows of the group's features) concatenated, for a lookup that
        sends them to other ranks.

        While no record is pending, that is from one ``zero_grad`` to the next backward, the
        rows go to a buffer kept from step to step: a fresh tensor of that size would be new
        memory, which the system maps one page at a time on first write, and that took longer
        than the copy itself. With gradients pending (accumulation), a record gets its own.
        """
        num_rows = sum(piece.size(0) for piece in pieces)
        buffer = self._grad_rows_buffer
        if self.grads or buffer is None or buffer.size(0) < num_rows:
            buffer = pieces[0].new_empty((num_rows, self.weight.size(1)))
            if not self.grads:
                self._grad_rows_buffer = buffer
        return torch.cat(list(pieces), out=buffer[:num_rows])

    def record(self, grads: GradRecord) -> None:
        """Keep ``grads`` for the next step; those of a hash table's default row are dropped."""
        keep = self.dynamic.keep_updates(grads.ids) if self.dynamic is not None else None
        if keep is not None:
            scale = grads.grad_scale[keep] if grads.grad_scale is not None else None
            grads = GradRecord(grads.ids[keep], grads.grad_rows, grads.grad_index[keep], scale)
        self.grads.append(grads)

    def accumulated_grads(self) -> GradRecord | None:
        """All gradients recorded since ``zero_grad``, as one record (``None`` if there are none).

        Concatenating the records of several micro-batches gives exactly the record of one
        batch holding them all, so gradient accumulation needs nothing more.
        """
        if not self.grads:
            return None
        if len(self.grads) > 1:
            self.grads = [_concat(self.grads)]
        return self.grads[0]


def build_groups(
    tables: Sequence[EmbeddingTableConfig],
    plan: Mapping[str, TableSharding],
    gang_size: int,
    rank: int,
    seed: int,
    device: torch.device,
    stores: StoreOpener | None = None,
) -> list[ShardGroup]:
    """Allocate and initialise this rank's shards of ``tables``, grouped into buffers; a group of tables off
    the device gets a cache over a store that ``stores`` opens (see :mod:`embedding.tiers`)."""
    members: dict[Hashable, list[EmbeddingTableConfig]] = {}
    groups = []
    for table in tables:
        sharding = plan[table.name]
        if table.kind == "hash":
            groups.append(_hash_group(table, sharding, rank, gang_size, seed, device, stores))
            continue
        if gang_size == 1 or sharding.placement == "replicated":
            key: Hashable = (table.dim, table.optimizer, table.storage, table.dtype)
        else:
            key = table.name
        members.setdefault(key, []).append(table)

    for group_tables in members.values():
        ranges = [plan[table.name].local_rows(rank) for table in group_tables]
        sizes = [end - start for start, end in ranges]
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        if group_tables[0].storage.tiered:
            if stores is None:
                raise EmbeddingConfigError(
                    f"Table '{group_tables[0].name}' is stored on {group_tables[0].storage.tier}, which needs a "
                    "store: build it in a ShardedEmbeddingCollection."
                )
            groups.append(_tiered_group(group_tables, plan, ranges, offsets, seed, device, stores))
            continue
        weight = empty_on_huge_pages((sum(sizes), group_tables[0].dim), device, group_tables[0].torch_dtype)
        shards = []
        for table, (start, end), offset in zip(group_tables, ranges, offsets):
            shard_weight = weight[offset : offset + end - start]
            shard_weight.copy_(init_rows(table, start, end, seed, device))
            shards.append(TableShard(table, plan[table.name], start, end, shard_weight))
        groups.append(ShardGroup(shards, offsets, weight, seed=seed))
    return groups


def _tiered_group(
    tables: Sequence[EmbeddingTableConfig],
    plan: Mapping[str, TableSharding],
    ranges: Sequence[tuple[int, int]],
    offsets: Sequence[int],
    seed: int,
    device: torch.device,
    stores: StoreOpener,
    slots: bool = False,
) -> ShardGroup:
    """Tables whose rows live in a store, with a cache of them on ``device``; no row is allocated or initialised
    here: a row is initialised from its id when first read. ``slots``: a hash table's, whose slots start afresh
    when an id takes them (their fresh record is zeros), and whose cache has a zero place for its default row."""
    num_rows = sum(end - start for start, end in ranges)
    fresh = FreshRecords(tables, ranges, offsets, seed, by_id=not slots)
    storage, dim = tables[0].storage, tables[0].dim
    cache_rows = storage.cache_size(num_rows, stores.floats_per_row(tables[0]) * 4)
    tier = TieredRows(
        lambda width: stores.open(tables, num_rows, width, fresh),
        fresh,
        storage,
        cache_rows,
        dim,
        device,
        zero_place=slots,
    )
    shards = [
        TableShard(table, plan[table.name], start, end, tier.weight, tier=tier)
        for table, (start, end) in zip(tables, ranges)
    ]
    return ShardGroup(shards, list(offsets), tier.weight, tier=tier)


def _hash_group(
    table: EmbeddingTableConfig,
    sharding: TableSharding,
    rank: int,
    gang_size: int,
    seed: int,
    device: torch.device,
    stores: StoreOpener | None,
) -> ShardGroup:
    """A hash table's shard: its slots, all free, then the default row (zeros); off the device, a cache of slots
    whose zero place is the default row."""
    start, end = sharding.local_rows(rank)
    if table.storage.tiered:
        if stores is None:
            raise EmbeddingConfigError(f"Table '{table.name}' is stored on {table.storage.tier}, which needs a store.")
        group = _tiered_group([table], {table.name: sharding}, [(start, end)], [0], seed, device, stores, slots=True)
        assert group.tier is not None and group.tier.zero_place is not None
        group.dynamic = group.shards[0].dynamic = DynamicRows(table, end - start, seed, rank, gang_size, device)
        group.dynamic.default_row = group.tier.zero_place
        return group
    weight = empty_on_huge_pages((end - start + 1, table.dim), device, table.torch_dtype)
    weight.zero_()
    dynamic = DynamicRows(table, end - start, seed, rank, gang_size, device)
    shard = TableShard(table, sharding, start, end, weight[: end - start], dynamic=dynamic)
    return ShardGroup([shard], [0], weight, dynamic=dynamic, seed=seed)


def empty_on_huge_pages(
    shape: tuple[int, int], device: torch.device, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """An uninitialised tensor, backed by 2 MiB pages where Linux allows it.

    The fused update touches rows scattered over the whole table: with 4 KiB pages nearly every
    row misses the TLB, which cost a fifth of the update of a 1,000,000 x 64 table. Linux
    backs a range with huge pages on first touch when asked (transparent huge pages enabled as
    ``madvise`` or ``always``); elsewhere, or on failure, the memory keeps its small pages.
    """
    tensor = torch.empty(shape, dtype=dtype, device=device)
    if device.type == "cpu" and sys.platform == "linux":
        start = -(-tensor.data_ptr() // _HUGE_PAGE_BYTES) * _HUGE_PAGE_BYTES
        end = (tensor.data_ptr() + tensor.nbytes) // _HUGE_PAGE_BYTES * _HUGE_PAGE_BYTES
        if end > start:  # only whole huge pages inside the tensor can be backed
            ctypes.CDLL(None).madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_HUGEPAGE)
    return tensor


def _copy_on_huge_pages(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.dim() != 2 or tensor.dtype != torch.float32:  # a row-wise state is small: TLB misses are few
        return tensor
    copy = empty_on_huge_pages((tensor.size(0), tensor.size(1)), tensor.device)
    return copy.copy_(tensor)


def init_rows(
    config: EmbeddingTableConfig, row_start: int, row_end: int, seed: int, device: torch.device
) -> torch.Tensor:
    """The initial values of rows ``[row_start, row_end)`` of the table of ``config``.

    Each row's values are a function of the seed, the table's name and the row's id alone (the
    hash tables' rule, :func:`embedding.id_hashing.init_rows_by_key`): a row starts from the same
    values whichever rank, range or storage tier holds it, and a tier that keeps its rows on disk
    initialises a row when first touched, so that creating a table costs no time.

    The values are float32: a table of another dtype rounds them to nearest as it stores them.
    """
    weight = torch.empty((row_end - row_start, config.dim), dtype=torch.float32)
    rows = torch.arange(row_end - row_start, dtype=torch.int64).numpy()
    normal = config.initializer == "normal"
    init_rows_by_key(
        weight.numpy(), rows, rows + row_start, init_salt(seed, config.name), config.initial_scale, normal, True
    )
    return weight.to(device)


def _concat(records: list[GradRecord]) -> GradRecord:
    index_offsets = [0]
    for record in records[:-1]:
        index_offsets.append(index_offsets[-1] + sum(piece.size(0) for piece in record.grad_rows))
    scales = None
    if any(record.grad_scale is not None for record in records):
        scales = torch.cat(
            [r.grad_scale if r.grad_scale is not None else torch.ones_like(r.ids, dtype=torch.float32) for r in records]
        )
    return GradRecord(
        ids=torch.cat([r.ids for r in records]),
        grad_rows=tuple(piece for r in records for piece in r.grad_rows),
        grad_index=torch.cat([r.grad_index + offset for r, offset in zip(records, index_offsets)]),
        grad_scale=scales,
    )
