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

import torch

from embedding.hash_index import ENTRIES_PER_SLOT, SKETCH_DEPTH
from embedding.optimizers import SparseOptimizerConfig, spec_of
from embedding.planner import TableSharding
from embedding.table_config import EmbeddingConfigError, EmbeddingTableConfig

_HASH_BYTES_PER_SLOT = 8 + 4 + 4 + 4 * ENTRIES_PER_SLOT
"""A hash table's key, last-seen step and frequency per slot, and its share of the index."""


class TableMemoryError(EmbeddingConfigError):
    """Raised when a rank's shards of the tables would not fit into its available memory."""


def shard_bytes(table: EmbeddingTableConfig, num_rows: int) -> int:
    """The bytes of ``num_rows`` rows of ``table`` (and of a hash table's map)."""
    total = num_rows * table.dim * 4
    if table.kind == "hash":
        total += int(num_rows * _HASH_BYTES_PER_SLOT)
        if table.hash_policy.min_count > 1:
            total += SKETCH_DEPTH * max(num_rows, 1024) * 4
    return total


def state_bytes(num_rows: int, dim: int, optimizer: SparseOptimizerConfig) -> int:
    """The bytes of the optimizer state of ``num_rows`` rows of width ``dim``."""
    return num_rows * (spec_of(optimizer).floats_per_row(dim) - dim) * 4


def rank_bytes(tables: Sequence[EmbeddingTableConfig], plan: Mapping[str, TableSharding], rank: int) -> int:
    """The bytes of ``rank``'s shards of ``tables``: rows (a table on disk: its cache's) and hash maps."""
    total = 0
    for table in tables:
        start, end = plan[table.name].local_rows(rank)
        num_rows = end - start
        if table.storage.tier == "disk":  # only its cache of hot rows is in memory (counted without the state)
            num_rows = table.storage.cache_size(num_rows, table.dim * 4)
        total += shard_bytes(table, num_rows)
    return total


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
