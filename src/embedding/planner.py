"""The sharding planner: which rank holds which rows of each table.

Every rank runs the planner on the same configs and gets the same plan, so no communication
is needed to agree on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from embedding.table_config import EmbeddingTableConfig, Placement

DEFAULT_REPLICATE_MAX_BYTES = 8 << 20
"""Tables up to 8 MiB (e.g. 131,072 x 16) are replicated when there are several ranks. All of them then share
one buffer and one local lookup, and a step all-gathers their gradients once, where tables placed whole each
cost an all-to-all path of their own (about 20 small ops per table and phase). On 2 ranks of DLRM with 26
tables (docs/benchmarks.md, "Data-parallel scaling"), replicating 640 KB and 6.5 MB tables ran 2.0-2.1x the
steps/s of placing them whole at batch 512, 1.1-1.2x at 8192. The price: every rank holds the rows and applies
every rank's gradients, so the update of these tables does not shrink as ranks are added."""


@dataclass(frozen=True)
class TableSharding:
    """The placement of one table over a gang of ``len(row_bounds) - 1`` ranks.

    Rank ``r`` owns rows ``[row_bounds[r], row_bounds[r + 1])``; a table-wise table is the
    special case where one rank owns every row and the others an empty range. A replicated
    table ignores ``row_bounds`` for storage: every rank holds every row.
    """

    placement: Placement
    row_bounds: tuple[int, ...]

    @property
    def num_rows(self) -> int:
        return self.row_bounds[-1]

    def local_rows(self, rank: int) -> tuple[int, int]:
        """The global row range ``[start, end)`` that ``rank`` stores."""
        if self.placement == "replicated":
            return 0, self.num_rows
        return self.row_bounds[rank], self.row_bounds[rank + 1]


def table_wise(num_rows: int, owner: int, world_size: int) -> TableSharding:
    bounds = (*(0 if rank <= owner else num_rows for rank in range(world_size)), num_rows)
    return TableSharding("table_wise", bounds)


def row_wise(num_rows: int, world_size: int) -> TableSharding:
    """Contiguous ranges of ``ceil(num_rows / world_size)`` rows, the last ones possibly shorter."""
    rows_per_rank = -(-num_rows // world_size)
    bounds = tuple(min(rank * rows_per_rank, num_rows) for rank in range(world_size + 1))
    return TableSharding("row_wise", bounds)


def replicated(num_rows: int, world_size: int) -> TableSharding:
    return TableSharding("replicated", (0,) * world_size + (num_rows,))


def plan_sharding(
    tables: Sequence[EmbeddingTableConfig],
    world_size: int,
    replicate_max_bytes: int = DEFAULT_REPLICATE_MAX_BYTES,
) -> Mapping[str, TableSharding]:
    """Place every table, balancing bytes and lookups over ``world_size`` ranks.

    Unless a table's config names its placement: on several ranks, tables up to ``replicate_max_bytes``
    are replicated; a table bigger than a rank's fair share of all bytes is split row-wise (on one
    rank it would unbalance the others whatever the rest does); the others go whole, largest
    first, to the least loaded rank. A table's load is its share of all bytes plus its share
    of all features, the number of lookups it serves per sample.
    """
    total_bytes = sum(table.num_bytes for table in tables)
    total_features = sum(len(table.features) for table in tables)

    def cost(table: EmbeddingTableConfig) -> float:
        return table.num_bytes / total_bytes + len(table.features) / total_features

    placements: dict[str, Placement] = {}
    for table in tables:
        if table.kind == "hash":
            placements[table.name] = "row_wise"  # slots split evenly; ids go to ranks by a hash
        elif table.placement is not None:
            placements[table.name] = table.placement
        elif world_size > 1 and table.num_bytes <= replicate_max_bytes:
            placements[table.name] = "replicated"
        elif world_size > 1 and table.num_bytes > total_bytes / world_size:
            placements[table.name] = "row_wise"
        else:
            placements[table.name] = "table_wise"

    plan: dict[str, TableSharding] = {}
    loads = [0.0] * world_size
    for table in tables:
        if placements[table.name] == "row_wise":
            plan[table.name] = row_wise(table.num_rows, world_size)
            loads = [load + cost(table) / world_size for load in loads]
        elif placements[table.name] == "replicated":
            plan[table.name] = replicated(table.num_rows, world_size)

    whole_tables = [table for table in tables if placements[table.name] == "table_wise"]
    for table in sorted(whole_tables, key=lambda t: (-cost(t), t.name)):
        owner = min(range(world_size), key=lambda rank: (loads[rank], rank))
        plan[table.name] = table_wise(table.num_rows, owner, world_size)
        loads[owner] += cost(table)

    return {table.name: plan[table.name] for table in tables}
