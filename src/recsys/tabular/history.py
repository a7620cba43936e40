"""Histories: per row, the values its key (a user) held in its earlier rows, such as the genres of the movies the
user rated before; the ``history`` transform of ``recsys.tabular.schema.DerivedColumn``.

One pass over every configured file gathers each row's key, its place in time (the split column) and the
source's bag of value keys; ``HistoryBuilder.build`` sorts them by key, then time, into a ``History``, which
answers a chunk of rows with one binary search per row and a numba copy of the latest ``length`` bags before
it. Only rows strictly earlier than a row count, so rows of the same moment never see each other; under
leave-one-out with a ``split.tie_break``, rows are ordered by time, then by the tie's key (the order that split
the rows), and the rows of one moment before a row in that order count too, so that a test row's history holds
its validation row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt

from recsys.tabular.joins import Bags


@dataclass(frozen=True)
class History:
    """The rows of every key, sorted by key (``keys`` unique, ``starts`` where each key's rows begin, one more
    at the end) and within a key by time (``times``), then tie (``ties``; empty: every tie is 0);
    ``values[value_offsets[r]:value_offsets[r + 1]]`` is row ``r``'s bag of value keys."""

    keys: npt.NDArray[np.uint64]
    starts: npt.NDArray[np.int64]
    times: npt.NDArray[np.float64]
    values: npt.NDArray[np.uint64]
    value_offsets: npt.NDArray[np.int64]
    ties: npt.NDArray[np.uint64]

    def lookup(
        self,
        keys: npt.NDArray[np.uint64],
        times: npt.NDArray[np.float64],
        length: int,
        ties: npt.NDArray[np.uint64] | None = None,
    ) -> Bags:
        """Per row, the values of the latest ``length`` rows of its key before its time (and tie, where the
        history has ties), concatenated (the oldest first); a row with none, or with the missing key 0, gets the
        bag of the missing value 0."""
        if len(self.keys):
            at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
            at = np.where((self.keys[at] == keys) & (keys != 0), at, -1).astype(np.int64)
        else:
            at = np.full(len(keys), -1, np.int64)
        row_ties = np.zeros(len(keys), np.uint64) if ties is None else ties
        bags: Bags = _latest_bags(
            self.starts, self.times, self.ties, self.values, self.value_offsets, at, times, row_ties, length
        )
        return bags


class HistoryBuilder:
    """Gathers the rows of one history over many chunks (memory follows the rows: 16 bytes each, 24 with ties,
    plus 8 per value), then sorts them once."""

    def __init__(self, with_ties: bool = False) -> None:
        self._with_ties = with_ties
        self._ties = [np.zeros(0, np.uint64)]
        # An empty part each, so that no rows still concatenate to typed arrays.
        self._keys = [np.zeros(0, np.uint64)]
        self._times = [np.zeros(0, np.float64)]
        self._values = [np.zeros(0, np.uint64)]
        self._lengths = [np.zeros(0, np.int64)]

    def add(
        self,
        keys: npt.NDArray[np.uint64],
        times: npt.NDArray[np.float64],
        bags: Bags,
        rows: npt.NDArray[np.bool_],
        ties: npt.NDArray[np.uint64] | None = None,
    ) -> None:
        """The ``rows`` of a chunk with their keys, times, source bags and (with ties) ties; rows without a key or
        a time are left out, and so are missing values (key 0) in a bag."""
        values, offsets = bags
        kept = rows & (keys != 0) & np.isfinite(times)
        lengths = np.diff(offsets)
        in_kept_rows = np.repeat(kept, lengths) & (values != 0)
        self._keys.append(keys[kept])
        self._times.append(times[kept].astype(np.float64))
        if self._with_ties:
            assert ties is not None
            self._ties.append(ties[kept])
        self._values.append(values[in_kept_rows])
        row_of_value = np.repeat(np.arange(len(keys)), lengths)[in_kept_rows]
        self._lengths.append(np.bincount(row_of_value, minlength=len(keys)).astype(np.int64)[kept])

    def build(self) -> History:
        keys, times = np.concatenate(self._keys), np.concatenate(self._times)
        values, lengths = np.concatenate(self._values), np.concatenate(self._lengths)
        ties = np.concatenate(self._ties)
        # Stable: rows of one key and moment (and tie) keep the files' order.
        order = np.lexsort((ties, times, keys)) if self._with_ties else np.lexsort((times, keys))
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        sorted_values, sorted_offsets = _reorder_bags(values, offsets, order)
        unique, first = np.unique(keys[order], return_index=True)
        starts = np.append(first, len(keys)).astype(np.int64)
        return History(unique, starts, times[order], sorted_values, sorted_offsets, ties[order] if len(ties) else ties)


# Untyped, as numba compiles these for their arguments' types.
@numba.njit(cache=True)
def _reorder_bags(values, offsets, order):  # type: ignore[no-untyped-def]
    """The bags of rows ``order[0], order[1], ...``, concatenated, and their offsets."""
    new_offsets = np.zeros(len(order) + 1, np.int64)
    for r in range(len(order)):
        new_offsets[r + 1] = new_offsets[r] + offsets[order[r] + 1] - offsets[order[r]]
    out = np.empty(new_offsets[-1], np.uint64)
    for r in range(len(order)):
        out[new_offsets[r] : new_offsets[r + 1]] = values[offsets[order[r]] : offsets[order[r] + 1]]
    return out, new_offsets


@numba.njit(cache=True)
def _latest_bags(starts, sorted_times, sorted_ties, values, value_offsets, at, times, ties, length):  # type: ignore[no-untyped-def]
    """Per row, the values of rows ``[max(start, end - length), end)`` of its key (``at``; -1: none), ``end``
    being the first of the key's rows not before the row's time (and tie, if ``sorted_ties`` holds any); an empty
    bag becomes ``[0]``."""
    firsts = np.zeros(len(at), np.int64)
    lasts = np.zeros(len(at), np.int64)
    row_offsets = np.zeros(len(at) + 1, np.int64)
    for row in range(len(at)):
        size = 0
        if at[row] >= 0 and not np.isnan(times[row]):
            start = starts[at[row]]
            stop = starts[at[row] + 1]
            end = start + np.searchsorted(sorted_times[start:stop], times[row])
            if len(sorted_ties):
                same = end + np.searchsorted(sorted_times[end:stop], times[row], side="right")
                end += np.searchsorted(sorted_ties[end:same], ties[row])
            firsts[row] = value_offsets[max(start, end - length)]
            lasts[row] = value_offsets[end]
            size = lasts[row] - firsts[row]
        row_offsets[row + 1] = row_offsets[row] + max(size, 1)
    out = np.zeros(row_offsets[-1], np.uint64)
    for row in range(len(at)):
        if lasts[row] > firsts[row]:
            out[row_offsets[row] : row_offsets[row + 1]] = values[firsts[row] : lasts[row]]
    return out, row_offsets
