"""The cache of a tiered shard group: hot rows in the computing device's memory, the rest in a store.

A tiered group's ``weight`` and optimizer state are this cache's places, not the table: a lookup
hands its buffer rows to :meth:`TieredRows.install`, which brings in the missing ones and returns
their places, which the lookup and the fused update then use as they would the rows of a table on
the device. A row stays pinned from its lookup until the step that updates it (or, in evaluation,
until the lookup has read it), and only an unpinned row leaves, written back to the store if a step
changed it. So every row has one current copy, in the cache or in the store, and a run gives
bit-identical tables whatever the tier and the cache size.

A train pipeline knows the next batch's rows one step ahead: :meth:`prefetch` reads the records
the cache lacks on its thread while the current step computes, and ``install`` takes them from
there; a record that a write-back changed after it was read is read again.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt
import torch

from embedding.tiers import cache_kernels as kernels
from embedding.tiers.storage_config import TableStorage
from embedding.tiers.store_opener import FreshRecords
from embedding.tiers.stores import RowStore
from embedding.tiers.write_behind import WriteBehind

WAYS = 16
"""Places per set: a missing row may replace any unpinned row of its set."""

_MIN_OVERFLOW = 1024

_RESERVED = -2
"""The overflow tag of the zero place."""

_KEPT_WRITES = 64
"""Write-backs remembered, to tell which records read ahead went stale; older reads are read again."""


@dataclass(frozen=True)
class DistinctRows:
    """A lookup's rows ``ids`` as their ``distinct`` rows (sorted), how often each is looked up (``counts``), and
    where each id's row is among them (``inverse``)."""

    ids: npt.NDArray[np.int64]
    distinct: npt.NDArray[np.int64]
    inverse: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]

    @staticmethod
    def of(ids: npt.NDArray[np.int64]) -> DistinctRows:
        distinct, inverse, counts = np.unique(ids, return_inverse=True, return_counts=True)
        return DistinctRows(ids, distinct, inverse.reshape(-1), counts)


@dataclass(frozen=True)
class StagedRecords:
    """Records read ahead for a later lookup of ``looked_up``: the distinct ``rows`` (sorted) the cache lacked,
    read while no write-back after the ``writes``-th had happened."""

    rows: npt.NDArray[np.int64]
    records: npt.NDArray[np.float32]
    writes: int
    looked_up: DistinctRows | None = None


class TieredRows:
    """A cache of about ``cache_rows`` rows of ``dim`` (and their optimizer state) on ``device``, over the store
    ``open_store(width)`` opens when first needed, whose fresh records ``fresh`` makes."""

    def __init__(
        self,
        open_store: Callable[[int], RowStore],
        fresh: FreshRecords,
        storage: TableStorage,
        cache_rows: int,
        dim: int,
        device: torch.device,
        zero_place: bool = False,
    ) -> None:
        self._open_store = open_store
        self._store: RowStore | None = None
        self._behind: WriteBehind | None = None
        self.fresh, self.storage, self.dim, self.device = fresh, storage, dim, device
        num_sets = max(1, math.ceil(cache_rows / WAYS))
        self.cached_places = num_sets * WAYS
        self._tags = np.full(self.cached_places, kernels.EMPTY, dtype=np.int64)
        self._scores = np.zeros(self.cached_places, dtype=np.int64)
        self._overflow_of = numba.typed.Dict.empty(numba.types.int64, numba.types.int64)
        self._tick = 0
        self._dirty = np.zeros(0, dtype=np.bool_)
        self._pins = np.zeros(0, dtype=np.int32)
        self._overflow_tags = np.zeros(0, dtype=np.int64)
        self._lock = threading.Lock()
        self._pinned: list[npt.NDArray[np.int64]] = []
        self._writes = 0
        self._written_rows: list[npt.NDArray[np.int64]] = []
        self.statistics = {
            "lookups": 0,
            "hits": 0,
            "fetched": 0,
            "read_ahead": 0,
            "written_back": 0,
            "read_seconds": 0.0,
        }
        """Rows looked up, found cached, brought in (of them, read ahead), written back, and the seconds spent
        reading records when they were needed."""
        self.optimizer_state: dict[str, torch.Tensor] = {}
        self.state_widths: dict[str, int] = {}
        self._allocate(self.cached_places + _MIN_OVERFLOW)
        self.zero_place = self.cached_places if zero_place else None
        """A place that holds zeros and takes no update, for lookups that find no row (a hash table's ids without
        one): kept out of the overflow's free places."""
        self._reserve_zero_place()

    @property
    def store(self) -> RowStore:
        """The store, opened on first use: by then the optimizer has said what state a record holds."""
        if self._store is None:
            self._store = self._open_store(self.dim + sum(self.state_widths.values()))
        return self._store

    @property
    def behind(self) -> WriteBehind:
        """The store's write-backs, landing on a thread of their own; its reads see those on their way."""
        if self._behind is None:
            self._behind = WriteBehind(self.store)
        return self._behind

    @property
    def num_places(self) -> int:
        return self.weight.size(0)

    def _allocate(self, num_places: int) -> None:
        """``num_places`` places: the cached ones, then the overflow, whose free places form a stack (its size
        first). Growing keeps every place's row, bookkeeping and state where it was."""
        old = getattr(self, "weight", None)
        kept = 0 if old is None else old.size(0)
        self.weight = _grown(old if old is not None else torch.empty((0, self.dim), device=self.device), num_places)
        self._dirty = np.resize(self._dirty, num_places) if kept else np.zeros(num_places, dtype=np.bool_)
        self._pins = np.resize(self._pins, num_places) if kept else np.zeros(num_places, dtype=np.int32)
        self._dirty[kept:], self._pins[kept:] = False, 0
        overflow = np.full(num_places - self.cached_places, kernels.EMPTY, dtype=np.int64)
        if kept:
            overflow[: kept - self.cached_places] = self._overflow_tags
            self.optimizer_state = {key: _grown(state, num_places) for key, state in self.optimizer_state.items()}
        self._overflow_tags = overflow
        self._stack_free_overflow()

    def _reserve_zero_place(self) -> None:
        if self.zero_place is not None:
            self._overflow_tags[self.zero_place - self.cached_places] = _RESERVED
            self._stack_free_overflow()

    def _stack_free_overflow(self) -> None:
        free = np.flatnonzero(self._overflow_tags == kernels.EMPTY)[::-1] + self.cached_places
        self._free_overflow = np.concatenate([[free.size], free]).astype(np.int64)

    def set_optimizer_state(self, state: Mapping[str, torch.Tensor], fill: Mapping[str, float]) -> None:
        """Take the places' optimizer state (fresh, ``fill`` its initial values): a store's record holds each state's
        values after the row's."""
        if self._store is not None:
            raise ValueError("The optimizer state of a tiered table must be set before its store opens.")
        self.optimizer_state = {key: _grown(tensor, self.num_places) for key, tensor in state.items()}
        self.state_widths = {key: math.prod(tensor.shape[1:]) for key, tensor in state.items()}
        self.fresh.states = [(self.state_widths[key], fill[key]) for key in state]

    def prefetch(self, rows: torch.Tensor) -> StagedRecords:
        """Read the records of ``rows`` that the cache lacks now (thread-safe; for a later :meth:`install`)."""
        looked_up = DistinctRows.of(_int64_ids(rows))  # on this thread, not the step's
        out = np.empty_like(looked_up.distinct)
        with self._lock:
            count = kernels.missing(looked_up.distinct, self._tags, WAYS, self._overflow_of, out)
            writes = self._writes
        lacking = out[:count]
        return StagedRecords(lacking, self.behind.read(lacking), writes, looked_up)

    def install(self, rows: torch.Tensor, training: bool, staged: StagedRecords | None = None) -> torch.Tensor:
        """The places of buffer rows ``rows``, pinned, the missing rows brought in (from ``staged`` where read
        ahead and still current); in training, marked as changed by the coming step."""
        ids = _int64_ids(rows)
        looked_up = staged.looked_up if staged is not None else None
        if looked_up is None or not np.array_equal(looked_up.ids, ids):
            looked_up = DistinctRows.of(ids)
        distinct = looked_up.distinct
        slots = np.empty_like(distinct)
        n = distinct.size
        fetch_rows, fetch_slots = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        evict_rows, evict_slots = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        counters = np.zeros(4, dtype=np.int64)
        with self._lock:
            self._tick += 1
            while True:
                kernels.assign(
                    distinct, looked_up.counts, counters[kernels.STOPPED], self._tags, self._scores, self._dirty,
                    self._pins, WAYS, self._tick, self.storage.eviction == "lfu", training, self._overflow_of,
                    self._overflow_tags, self._free_overflow, slots, fetch_rows, fetch_slots, evict_rows,
                    evict_slots, counters,
                )  # fmt: skip
                if counters[kernels.STOPPED] == n:
                    break
                self._grow()
            if training:
                self._pinned.append(slots)  # each distinct place once, as pinned
            fetched, evicted = int(counters[kernels.FETCHED]), int(counters[kernels.EVICTED])
            if evicted:
                self._write_back(evict_rows[:evicted], evict_slots[:evicted], evicted=True)
        if fetched:
            self._bring_in(fetch_rows[:fetched], fetch_slots[:fetched], staged)
        self.statistics["lookups"] += ids.size
        self.statistics["hits"] += int(counters[kernels.HITS])
        return torch.from_numpy(slots[looked_up.inverse]).to(rows.device)

    def release(self, places: list[npt.NDArray[np.int64]] | None = None) -> None:
        """Unpin ``places`` (an evaluation lookup's), or every place a training lookup pinned since the last
        release (after the update); overflow rows no longer pinned go back to the store."""
        with self._lock:
            if places is None:
                places, self._pinned = self._pinned, []
            for slots in places:
                kernels.unpin(slots if self.zero_place is None else slots[slots != self.zero_place], self._pins)
            used = np.flatnonzero(self._overflow_tags >= 0)
            done = used[self._pins[used + self.cached_places] == 0]
            if done.size:
                overflow, rows = done + self.cached_places, self._overflow_tags[done]
                dirty = self._dirty[overflow]
                if dirty.any():
                    self._write_back(rows[dirty], overflow[dirty])
                for row in rows.tolist():
                    del self._overflow_of[row]
                self._overflow_tags[done] = kernels.EMPTY
                self._stack_free_overflow()

    def flush(self) -> None:
        """Write every changed cached row back to the store (before a checkpoint reads the store)."""
        with self._lock:
            places = np.flatnonzero(self._dirty[: self.cached_places] & (self._tags != kernels.EMPTY))
            if places.size:
                self._write_back(self._tags[places], places)
            overflow = np.flatnonzero(self._overflow_tags >= 0)
            places = overflow + self.cached_places
            dirty = self._dirty[places]
            if dirty.any():
                self._write_back(self._overflow_tags[overflow[dirty]], places[dirty])
            self.behind.drain()

    def clear(self) -> None:
        """Forget every cached row and every written record: every row reads as fresh (before a load)."""
        with self._lock:
            self._tags[:], self._scores[:], self._dirty[:], self._pins[:] = kernels.EMPTY, 0, False, 0
            self._pinned.clear()
            self._overflow_of.clear()
            self._overflow_tags[:] = kernels.EMPTY
            self._stack_free_overflow()
            self._reserve_zero_place()
            self.behind.drain()
            self.store.clear()
            self._writes += 1  # every record read ahead before now is stale (``_written_since`` cannot say which)
            self._written_rows.clear()

    def _grow(self) -> None:
        self._allocate(self.cached_places + 2 * (self.num_places - self.cached_places))

    def _write_back(self, rows: npt.NDArray[np.int64], places: npt.NDArray[np.int64], evicted: bool = False) -> None:
        """Under the lock: the records of ``places`` written to the store as rows ``rows``, and marked clean unless
        ``evicted`` (the places' new rows are marked already)."""
        order = np.argsort(rows)  # gathered in the order the writes land in (and reads search them in)
        rows, places = rows[order], places[order]
        views = self._host_views()
        if views is not None:  # one pass a part, straight into the records, the interpreter's lock let go
            records = np.empty((places.size, self.store.width), dtype=np.float32)
            for view, column in views:
                kernels.gather_columns(view, places, records, column)
        else:
            index = torch.from_numpy(places).to(self.device)
            parts = [self.weight.index_select(0, index)] + [
                state.index_select(0, index).reshape(places.size, -1) for state in self.optimizer_state.values()
            ]
            records = torch.cat(parts, dim=1).cpu().numpy()
        self.behind.write(rows, records)
        if not evicted:
            self._dirty[places] = False
        self._writes += 1
        self._written_rows.append(rows.copy())
        if len(self._written_rows) > _KEPT_WRITES:
            self._written_rows.pop(0)
        self.statistics["written_back"] += rows.size

    def _bring_in(
        self, rows: npt.NDArray[np.int64], places: npt.NDArray[np.int64], staged: StagedRecords | None
    ) -> None:
        """Put the records of ``rows`` into ``places``: from ``staged`` where read ahead and not written back since,
        the others read now (on the step's thread: what the read-ahead missed)."""
        unread = np.arange(rows.size)
        if staged is not None and staged.rows.size:
            position = np.searchsorted(staged.rows, rows).clip(max=staged.rows.size - 1)
            found = staged.rows[position] == rows
            with self._lock:
                changed = self._written_since(staged.writes)
            if changed is None:
                found[:] = False
            elif changed.size:
                found &= ~np.isin(rows, changed)
            ahead = np.flatnonzero(found)
            self._put(staged.records, position[ahead], places[ahead])
            unread = np.flatnonzero(~found)
            self.statistics["read_ahead"] += ahead.size
        if unread.size:
            started = time.perf_counter()
            records = self.behind.read(rows[unread])
            self.statistics["read_seconds"] += time.perf_counter() - started
            self._put(records, np.arange(unread.size), places[unread])
        self.statistics["fetched"] += rows.size

    def _put(
        self, records: npt.NDArray[np.float32], which: npt.NDArray[np.int64], places: npt.NDArray[np.int64]
    ) -> None:
        """Copy ``records[which]`` into the distinct ``places``: the row, then each optimizer state."""
        views = self._host_views()
        if views is not None:
            for view, column in views:
                kernels.scatter_columns(records, which, column, places, view)
            return
        index = torch.from_numpy(places).to(self.device)
        values = torch.from_numpy(records[which]).to(self.device)
        # The places are distinct (each pinned as it is given): a plain copy, far faster than an indexed assignment.
        self.weight.index_copy_(0, index, values[:, : self.dim])
        column = self.dim
        for key, state in self.optimizer_state.items():
            width = self.state_widths[key]
            state.index_copy_(0, index, values[:, column : column + width].reshape(-1, *state.shape[1:]))
            column += width

    def _host_views(self) -> list[tuple[npt.NDArray[np.float32], int]] | None:
        """On a CPU, the places' row and each optimizer state as 2-D arrays (views), with the column where each starts
        in a record: copied by compiled loops, not by torch's indexed copies, whose threads wait on each other when
        the write-back and read-ahead threads hold the cores. ``None`` elsewhere."""
        tensors = [self.weight, *self.optimizer_state.values()]
        if self.device.type != "cpu" or any(t.dtype != torch.float32 or not t.is_contiguous() for t in tensors):
            return None
        views, column = [], 0
        for tensor in tensors:
            view = tensor.view(tensor.size(0), -1).numpy()
            views.append((view, column))
            column += view.shape[1]
        return views

    def _written_since(self, writes: int) -> npt.NDArray[np.int64] | None:
        """The rows written back after the ``writes``-th write-back (``None``: too long ago to say)."""
        missed = self._writes - writes
        if missed > len(self._written_rows):
            return None
        pieces = self._written_rows[len(self._written_rows) - missed :]
        return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)


def _int64_ids(rows: torch.Tensor) -> npt.NDArray[np.int64]:
    return rows.detach().cpu().numpy().astype(np.int64, copy=False).reshape(-1)


def _grown(state: torch.Tensor, num_places: int) -> torch.Tensor:
    """``state`` with rows up to ``num_places``, the new ones zero."""
    grown = state.new_zeros((num_places, *state.shape[1:]))
    grown[: state.size(0)] = state
    return grown
