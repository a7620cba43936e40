"""Where the rows of the tables live on this rank, and the gradients recorded for them.

A :class:`TableShard` holds the rows of one table that this rank stores, with their optimizer
state: the unit that checkpoints save. A :class:`ShardGroup` stores several shards in one
buffer (FBGEMM's table batching): one lookup and one fused kernel call serve all its tables,
so many small tables cost what one big table does. Backward records gradients on the group,
in the form the fused kernels consume.
"""

from __future__ import annotations

import zlib
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from embedding.config import EmbeddingTableConfig
from embedding.optim_config import SparseOptimizerConfig
from embedding.planner import TableSharding

INIT_BLOCK_ROWS = 1 << 16
"""Rows are initialised in blocks with a generator of their own, so that a rank initialises
only its rows and still gets exactly the values one process would have for them."""


@dataclass(frozen=True)
class GradRecord:
    """Gradients for the fused update: row ``ids[k]`` (local) receives
    ``grad_scale[k] * grad_rows[grad_index[k]]``."""

    ids: torch.Tensor
    grad_rows: torch.Tensor
    grad_index: torch.Tensor
    grad_scale: torch.Tensor | None


@dataclass
class TableShard:
    """Rows ``[row_start, row_end)`` of a table as stored on this rank: views into its group."""

    config: EmbeddingTableConfig
    sharding: TableSharding
    row_start: int
    row_end: int
    weight: torch.Tensor
    optimizer_state: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def num_rows(self) -> int:
        return self.row_end - self.row_start


@dataclass
class ShardGroup:
    """Shards stored one after the other in ``weight``, looked up and stepped together.

    Its tables share a dim and an optimizer. On a gang of several ranks, only replicated tables
    share a group, as each table-wise or row-wise table needs an all-to-all of its own.
    """

    shards: list[TableShard]
    buffer_offsets: list[int]
    weight: torch.Tensor
    optimizer_state: dict[str, torch.Tensor] = field(default_factory=dict)
    grads: list[GradRecord] = field(default_factory=list)

    @property
    def placement(self) -> str:
        return self.shards[0].sharding.placement

    @property
    def optimizer(self) -> SparseOptimizerConfig | None:
        """The optimizer override of the group's tables (``None``: the collection default)."""
        return self.shards[0].config.optimizer

    def set_optimizer_state(self, state: dict[str, torch.Tensor]) -> None:
        """Take ``state`` for the whole buffer, and give every shard its rows of it."""
        self.optimizer_state = state
        for shard, offset in zip(self.shards, self.buffer_offsets):
            shard.optimizer_state = {key: tensor[offset : offset + shard.num_rows] for key, tensor in state.items()}

    def record(self, grads: GradRecord) -> None:
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
) -> list[ShardGroup]:
    """Allocate and initialise this rank's shards of ``tables``, grouped into buffers."""
    members: dict[Hashable, list[EmbeddingTableConfig]] = {}
    for table in tables:
        sharding = plan[table.name]
        if gang_size == 1 or sharding.placement == "replicated":
            key: Hashable = (table.dim, table.optimizer)
        else:
            key = table.name
        members.setdefault(key, []).append(table)

    groups = []
    for group_tables in members.values():
        ranges = [plan[table.name].local_rows(rank) for table in group_tables]
        sizes = [end - start for start, end in ranges]
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        weight = torch.empty((sum(sizes), group_tables[0].dim), dtype=torch.float32, device=device)
        shards = []
        for table, (start, end), offset in zip(group_tables, ranges, offsets):
            shard_weight = weight[offset : offset + end - start]
            shard_weight.copy_(init_rows(table, start, end, seed, device))
            shards.append(TableShard(table, plan[table.name], start, end, shard_weight))
        groups.append(ShardGroup(shards, offsets, weight))
    return groups


def init_rows(
    config: EmbeddingTableConfig, row_start: int, row_end: int, seed: int, device: torch.device
) -> torch.Tensor:
    """The initial values of rows ``[row_start, row_end)`` of the table of ``config``."""
    scale = config.init_scale if config.init_scale is not None else (1.0 / config.num_rows) ** 0.5
    weight = torch.empty((row_end - row_start, config.dim), dtype=torch.float32, device=device)
    first_block = row_start // INIT_BLOCK_ROWS
    for block in range(first_block, -(-row_end // INIT_BLOCK_ROWS)):
        block_start = block * INIT_BLOCK_ROWS
        block_end = min(block_start + INIT_BLOCK_ROWS, config.num_rows)
        generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}/{config.name}/{block}".encode()))
        if config.initializer == "uniform":
            values = torch.rand((block_end - block_start, config.dim), generator=generator) * (2 * scale) - scale
        else:
            values = torch.randn((block_end - block_start, config.dim), generator=generator) * scale
        start, end = max(block_start, row_start), min(block_end, row_end)
        weight[start - row_start : end - row_start] = values[start - block_start : end - block_start]
    return weight


def _concat(records: list[GradRecord]) -> GradRecord:
    index_offsets = [0]
    for record in records[:-1]:
        index_offsets.append(index_offsets[-1] + record.grad_rows.size(0))
    scales = None
    if any(record.grad_scale is not None for record in records):
        scales = torch.cat(
            [r.grad_scale if r.grad_scale is not None else torch.ones_like(r.ids, dtype=torch.float32) for r in records]
        )
    return GradRecord(
        ids=torch.cat([r.ids for r in records]),
        grad_rows=torch.cat([r.grad_rows for r in records]),
        grad_index=torch.cat([r.grad_index + offset for r, offset in zip(records, index_offsets)]),
        grad_scale=scales,
    )
