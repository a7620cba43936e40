"""Leave-one-out: each key's (user's) last row is a test row, the one before it a validation row, the earlier
ones train; ``split.last_of`` of ``recsys.tabular.schema.SplitByValue``.

A row's split depends on the key's other rows, which may lie anywhere in any configured file (one file often
serves every split), so one pass over every file gathers each row's key, its time (``split.column``) and its tie
(the 64-bit key of ``split.tie_break``'s value, or 0); ``EventRanksBuilder.build`` sorts them by key, time and tie
into ``EventRanks``, which answers a chunk of rows with a binary search per row (numba): how many later events the
row's key has (0: test, 1: valid, 2 or more: train). Rows equal in key, time and tie are one event and share it.
Nothing depends on the order the rows are read in, so shuffling, parse threads and a resume keep every row's split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt

UNKNOWN = -1
"""The rank of a row without a key or a time, or of no row gathered."""
SPLIT_RANKS = {"test": 0, "valid": 1}
"""The rank of the rows of each scored split; ``train`` keeps every rank from 2 on."""


@dataclass(frozen=True)
class EventRanks:
    """The rows of every key, sorted by key (``keys`` unique, ``starts`` where each key's rows begin, one more at
    the end), then by time (``times``) and tie (``ties``; empty: every tie is 0)."""

    keys: npt.NDArray[np.uint64]
    starts: npt.NDArray[np.int64]
    times: npt.NDArray[np.float64]
    ties: npt.NDArray[np.uint64]

    def lookup(
        self, keys: npt.NDArray[np.uint64], times: npt.NDArray[np.float64], ties: npt.NDArray[np.uint64]
    ) -> npt.NDArray[np.int64]:
        """Per row, the number of its key's events after it, counted up to 2 (``UNKNOWN`` for a row without a
        key, 0, or time, NaN, or one the pass did not see)."""
        if len(self.keys):
            at = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
            at = np.where((self.keys[at] == keys) & (keys != 0), at, -1).astype(np.int64)
        else:
            at = np.full(len(keys), -1, np.int64)
        ranks: npt.NDArray[np.int64] = _ranks_from_end(self.starts, self.times, self.ties, at, times, ties)
        return ranks


def keeps(split: str, ranks: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Which rows of these ranks (``EventRanks.lookup``) ``split`` (``train``, ``valid`` or ``test``) keeps."""
    kept: npt.NDArray[np.bool_] = ranks == SPLIT_RANKS[split] if split in SPLIT_RANKS else ranks >= 2
    return kept


class EventRanksBuilder:
    """Gathers the rows of every key over many chunks (16 bytes a row, 24 with ties, while gathering), then sorts
    them once."""

    def __init__(self, with_ties: bool) -> None:
        self._with_ties = with_ties
        # An empty part each, so that no rows still concatenate to typed arrays.
        self._keys = [np.zeros(0, np.uint64)]
        self._times = [np.zeros(0, np.float64)]
        self._ties = [np.zeros(0, np.uint64)]

    def add(
        self,
        keys: npt.NDArray[np.uint64],
        times: npt.NDArray[np.float64],
        ties: npt.NDArray[np.uint64],
        rows: npt.NDArray[np.bool_],
    ) -> None:
        """The ``rows`` of a chunk with their keys, times and ties; rows without a key or a time are left out."""
        kept = rows & (keys != 0) & np.isfinite(times)
        self._keys.append(keys[kept])
        self._times.append(times[kept].astype(np.float64))
        if self._with_ties:
            self._ties.append(ties[kept])

    def build(self) -> EventRanks:
        keys, times, ties = np.concatenate(self._keys), np.concatenate(self._times), np.concatenate(self._ties)
        order = np.lexsort((ties, times, keys)) if self._with_ties else np.lexsort((times, keys))
        unique, first = np.unique(keys[order], return_index=True)
        starts = np.append(first, len(keys)).astype(np.int64)
        return EventRanks(unique, starts, times[order], ties[order] if self._with_ties else ties)


# Untyped, as numba compiles these for their arguments' types.
@numba.njit(cache=True)
def _ranks_from_end(starts, sorted_times, sorted_ties, at, times, ties):  # type: ignore[no-untyped-def]
    """Per row of key ``at`` (-1: none), the events of the key after the row's, up to 2; ``UNKNOWN`` where the
    key's rows hold none of the row's time and tie."""
    with_ties = len(sorted_ties) > 0
    ranks = np.full(len(at), UNKNOWN, np.int64)
    for row in range(len(at)):
        if at[row] < 0 or np.isnan(times[row]):
            continue
        low, high = starts[at[row]], starts[at[row] + 1]
        first = low + np.searchsorted(sorted_times[low:high], times[row])
        last = low + np.searchsorted(sorted_times[low:high], times[row], side="right")
        if with_ties:
            first += np.searchsorted(sorted_ties[first:last], ties[row])
            last = first
            while last < high and sorted_times[last] == times[row] and sorted_ties[last] == ties[row]:
                last += 1
        if first == last:
            continue  # A row the pass over the files did not see.
        rank = 0
        while last < high and rank < 2:  # Count the later events, each its rows of one time and tie.
            rank += 1
            event = last
            while (
                last < high
                and sorted_times[last] == sorted_times[event]
                and (not with_ties or sorted_ties[last] == sorted_ties[event])
            ):
                last += 1
        ranks[row] = rank
    return ranks
