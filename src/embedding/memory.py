"""How much memory a rank's shards of the tables take, checked before any is allocated.

Tables are the bulk of a recommendation model: ``dlrm_criteo``'s defaults hold 26 tables of
10,000,000 x 64 floats, 66.5 GB. Allocating them on a machine without that much memory ends in
the system's out-of-memory killer, or in swapping that looks like a hang; so a collection
counts its rank's bytes first (rows, a hash table's map) and refuses to start when they exceed
the memory the system says is available, and a sparse optimizer does the same with the state it
adds (an evaluation, which has none, needs only the rows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from embedding.hash_index import ENTRIES_PER_SLOT, SKETCH_DEPTH
from embedding.optimizers import SparseOptimizerConfig, spec_of
from embedding.planner import TableSharding
from embedding.table_config import EmbeddingConfigError, EmbeddingTableConfig
from embedding.tiers.stores import disk_store_bytes

_HASH_BYTES_PER_SLOT = 8 + 4 + 4 + 4 * ENTRIES_PER_SLOT
"""A hash table's key, last-seen step and frequency per slot, and its share of the index."""


class TableMemoryError(EmbeddingConfigError):
    """Raised when a rank's shards of the tables would not fit into its available memory."""


def hash_map_bytes(table: EmbeddingTableConfig, num_rows: int) -> int:
    """The bytes of the map of a hash table's shard of ``num_rows`` slots (0 for a fixed table): it stays in the
    memory that computes whatever the rows' tier."""
    if table.kind != "hash":
        return 0
    total = int(num_rows * _HASH_BYTES_PER_SLOT)
    if table.hash_policy.min_count > 1:
        total += SKETCH_DEPTH * max(num_rows, 1024) * 4
    return total


def state_bytes(num_rows: int, dim: int, optimizer: SparseOptimizerConfig) -> int:
    """The bytes of the optimizer state of ``num_rows`` rows of width ``dim``."""
    return num_rows * (spec_of(optimizer).floats_per_row(dim) - dim) * 4


def rank_bytes(tables: Sequence[EmbeddingTableConfig], plan: Mapping[str, TableSharding], rank: int) -> int:
    """The bytes of ``rank``'s shards of ``tables`` in the memory that computes: rows and hash maps, or, for a
    table stored off the device, its cache's rows."""
    total = 0
    for table in tables:
        start, end = plan[table.name].local_rows(rank)
        total += cached_rows(table, plan, rank, table.dim + 1) * table.row_bytes + hash_map_bytes(table, end - start)
    return total


def cached_rows(table: EmbeddingTableConfig, plan: Mapping[str, TableSharding], rank: int, floats_per_row: int) -> int:
    """The rows of ``table`` that ``rank`` holds in the memory that computes: all its rows on the device, else its
    cache's (sized by records of ``floats_per_row``)."""
    start, end = plan[table.name].local_rows(rank)
    if not table.storage.tiered:
        return end - start
    return table.storage.cache_size(end - start, floats_per_row * 4)


@dataclass(frozen=True)
class TierNeed:
    """What one table's shard takes: ``near`` bytes in the memory that computes (rows and state, or its cache), and
    ``far`` bytes on its tier off the device (host memory or disk; 0 on the device)."""

    table: EmbeddingTableConfig
    near: int
    far: int


def tier_needs(
    tables: Sequence[EmbeddingTableConfig],
    plan: Mapping[str, TableSharding],
    rank: int,
    optimizer: SparseOptimizerConfig,
) -> list[TierNeed]:
    """Each table's bytes on ``rank``, rows in their dtype with the optimizer state of its optimizer (its own, else
    ``optimizer``), which is float32."""
    needs = []
    for table in tables:
        floats = spec_of(table.optimizer or optimizer).floats_per_row(table.dim)
        record_bytes = table.row_bytes + (floats - table.dim) * 4
        start, end = plan[table.name].local_rows(rank)
        near_rows = cached_rows(table, plan, rank, floats)
        near = near_rows * record_bytes + hash_map_bytes(table, end - start)
        # Off the device, rows are float32 (a table's config refuses another dtype there).
        far = {"device": 0, "host": (end - start) * record_bytes, "disk": disk_store_bytes(end - start, floats)}[
            table.storage.tier
        ]
        needs.append(TierNeed(table, near, far))
    return needs


def check_tiers(needs: Sequence[TierNeed], device: torch.device, rank: int) -> None:
    """Raise, naming each table to move and the tier that would hold it, if the tables do not fit their tiers.

    The memory that computes holds the tables on ``device`` and the others' caches; host memory holds the tables
    on ``host`` (on a CPU the two are one memory). Where one is short, its biggest tables move first, until the
    rest fit: off a GPU to ``host`` while host memory has room, else to ``disk``.
    """
    one_memory = device.type != "cuda"
    near = sum(need.near for need in needs) + (sum(_on_host(need) for need in needs) if one_memory else 0)
    host = 0 if one_memory else sum(_on_host(need) for need in needs)
    near_free = available_bytes(device)
    host_free = None if one_memory else available_bytes(torch.device("cpu"))
    near_over = 0 if near_free is None else near - near_free
    host_over = 0 if host_free is None else host - host_free
    if near_over <= 0 and host_over <= 0:
        return
    moves = []
    for need in sorted(needs, key=lambda need: need.near + _on_host(need), reverse=True):
        tier = need.table.storage.tier
        if need.table.kind == "hash":  # a hash table stays on the device
            continue
        if near_over > 0 and (tier == "device" or (one_memory and tier == "host")):
            size = need.near + _on_host(need)
            to_host = tier == "device" and host_free is not None and host + size <= host_free
            host += size if to_host else 0
            moves.append(f"'{need.table.name}' ({_gib(size)} GiB) on {'host' if to_host else 'disk'}")
            near_over -= size
        elif host_over > 0 and tier == "host":
            moves.append(f"'{need.table.name}' ({_gib(need.far)} GiB) on disk")
            host_over -= need.far
    where = (
        f"store {', '.join(moves)} (`model.embeddings.tables.<name>.storage`), " if moves else "use smaller caches, "
    )
    short = f"{_gib(near)} GiB on rank {rank} ({device.type})"
    if host_free is not None and host > host_free:
        short += f" and {_gib(host)} GiB of host memory"
    raise TableMemoryError(
        f"The sparse tables need {short} for rows, optimizer state and caches, but only {_gib(near_free or 0)} GiB "
        f"are available: {where}use fewer or smaller tables, or more ranks."
    )


def _on_host(need: TierNeed) -> int:
    return need.far if need.table.storage.tier == "host" else 0


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / 2**30:.1f}"


def available_bytes(device: torch.device) -> int | None:
    """The memory the system can still give this process (``None`` where it does not say)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_memory(needed: int, device: torch.device, rank: int, what: str = "The sparse tables") -> None:
    """Raise if ``needed`` bytes of ``what`` exceed what ``device`` has available."""
    available = available_bytes(device)
    if available is not None and needed > available:
        raise TableMemoryError(
            f"{what} need {needed / 2**30:.1f} GiB on rank {rank} ({device.type}), but only "
            f"{available / 2**30:.1f} GiB are available: use fewer or smaller tables (rows, dim), hash tables "
            "of a smaller capacity, or more ranks."
        )
