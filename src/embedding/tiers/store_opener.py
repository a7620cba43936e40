"""How a tiered group's store comes to be: where it is, how wide its records are, what a fresh one holds.

A store opens when first needed, not when its collection is built: by then the framework has said
where the run's disk stores go (the run's directory) and the sparse optimizer has said what state
a record holds after the row.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from embedding.id_hashing import init_rows_by_key, init_salt
from embedding.optimizers import SparseOptimizerConfig, spec_of
from embedding.table_config import EmbeddingConfigError, EmbeddingTableConfig
from embedding.tiers.stores import DiskStore, HostStore, RowStore


@dataclass
class FreshRecords:
    """The record of a row no step has written: the row's initial values (from the seed, its table and its id,
    as a table on the device starts) and each optimizer state's initial value (``states``: width, value)."""

    tables: Sequence[EmbeddingTableConfig]
    ranges: Sequence[tuple[int, int]]
    """Each table's global rows held here, one after the other in the buffer from ``offsets``."""
    offsets: Sequence[int]
    seed: int
    by_id: bool = True
    """``False``: a hash table's slots, which start afresh when an id takes them: zeros until then."""
    states: list[tuple[int, float]] = field(default_factory=list)

    def __call__(self, rows: npt.NDArray[np.int64], out: npt.NDArray[np.float32]) -> None:
        dim = self.tables[0].dim
        if not self.by_id:
            out[:, :dim] = 0.0
            self._fill_states(out)
            return
        table_of_row = np.searchsorted(np.asarray(self.offsets), rows, side="right") - 1
        values = np.empty((rows.size, dim), dtype=np.float32)
        for index, (table, (row_start, _), offset) in enumerate(zip(self.tables, self.ranges, self.offsets)):
            mine = np.flatnonzero(table_of_row == index)
            if mine.size:
                keys = rows[mine] - offset + row_start
                normal = table.initializer == "normal"
                salt = init_salt(self.seed, table.name)
                # Fresh records are made on a train pipeline's thread too, beside the step's parallel kernels.
                init_rows_by_key(values, mine, keys, salt, table.initial_scale, normal, parallel=False)
        out[:, :dim] = values
        self._fill_states(out)

    def _fill_states(self, out: npt.NDArray[np.float32]) -> None:
        column = self.tables[0].dim
        for width, value in self.states:
            out[:, column : column + width] = value
            column += width


@dataclass(frozen=True)
class StoreOpener:
    """Opens the stores of one rank's tiered groups: disk stores in ``directory()`` (read when one opens), records
    with the state of each table's optimizer (its own, else ``default_optimizer``)."""

    directory: Callable[[], str | None]
    rank: int
    default_optimizer: SparseOptimizerConfig

    def floats_per_row(self, table: EmbeddingTableConfig) -> int:
        """The floats of a row and its optimizer state: a store's record, and what a cached row takes."""
        return spec_of(table.optimizer or self.default_optimizer).floats_per_row(table.dim)

    def open(self, tables: Sequence[EmbeddingTableConfig], num_rows: int, width: int, fresh: FreshRecords) -> RowStore:
        if tables[0].storage.tier == "host":
            return HostStore(num_rows, width, fresh)
        directory = self.directory()
        if directory is None:
            raise EmbeddingConfigError(
                f"Table '{tables[0].name}' is stored on disk, which needs a directory for its store, but none is "
                "set: set the collection's `storage_dir` (a run sets its own)."
            )
        names = ",".join(table.name for table in tables)
        file_name = f"{tables[0].name}.{zlib.crc32(names.encode()):08x}.rows"
        return DiskStore(os.path.join(directory, f"rank_{self.rank}", file_name), names, num_rows, width, fresh)
