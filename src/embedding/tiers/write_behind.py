"""Write-backs that land in a store behind the step: the step hands the records over and goes on.

Writing a record into a disk store is the slow part of evicting it: the row's page of the file is
found, allocated where the file is still a hole, and changed, for each of thousands of rows a step
evicts (a third of a second a step for a 300,000,000-row table, ``benchmarks/tiered_tables.py``).
So a cache copies out the records it evicts and :class:`WriteBehind` writes them on a thread of
its own, in order, while the step computes; until one lands, a read of its rows takes the values
from it. Every read sees the latest records, so the rows are those of a store written at once.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from embedding.tiers.stores import RowStore

_MAX_PENDING = 4
"""Write-backs not yet landed before the next one waits for the oldest: a store slower than the steps slows them,
rather than filling memory."""


@dataclass
class _Pending:
    rows: npt.NDArray[np.int64]
    """Sorted and distinct."""
    records: npt.NDArray[np.float32]
    landed: Future[None] = field(default_factory=Future)


class WriteBehind:
    """Writes into ``store`` on a thread of its own; reads through it see what is still on its way."""

    def __init__(self, store: RowStore) -> None:
        self.store = store
        self.write_seconds = 0.0
        """The time the writes took on their thread, in all."""
        self._pending: list[_Pending] = []
        self._lock = threading.Lock()
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="row-store-writes")

    def write(self, rows: npt.NDArray[np.int64], records: npt.NDArray[np.float32]) -> None:
        """Write ``records`` (the caller's no longer) as distinct ``rows``, sorted, soon."""
        pending = _Pending(rows, records)
        with self._lock:
            oldest = self._pending[0] if len(self._pending) >= _MAX_PENDING else None
            self._pending.append(pending)
        if oldest is not None:
            oldest.landed.result()
        self._thread.submit(self._land, pending)

    def read(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """The records of ``rows``, as the store will hold them once every write so far has landed."""
        with self._lock:
            pending = list(self._pending)  # a write landing while the store is read is still taken from here
        records = self.store.read(rows)
        for write in pending:  # oldest first: a later write of a row wins
            position = np.searchsorted(write.rows, rows).clip(max=max(write.rows.size - 1, 0))
            found = np.flatnonzero(write.rows[position] == rows) if write.rows.size else position[:0]
            records[found] = write.records[position[found]]
        return records

    def drain(self) -> None:
        """Wait until every write so far has landed (raising what one raised)."""
        with self._lock:
            pending = list(self._pending)
        for write in pending:
            write.landed.result()

    def _land(self, pending: _Pending) -> None:
        started = time.perf_counter()
        try:
            self.store.write(pending.rows, pending.records)
        except BaseException as error:
            pending.landed.set_exception(error)
            raise
        self.write_seconds += time.perf_counter() - started
        with self._lock:
            self._pending.remove(pending)
        pending.landed.set_result(None)
