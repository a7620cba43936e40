"""The compiled loops of a row cache: where each row of a lookup sits, and which rows come and go.

The cache is set-associative, like FBGEMM's: a row may sit only in the ``ways`` places of the set
its id hashes to, so that finding it, or the row it replaces, scans those few places and never the
whole cache. A row in use (pinned: looked up by a step that has not run its update yet) is never
replaced; a row finding every place of its set pinned goes to an overflow place until its step is
done. All loops run on the host, over the cache's bookkeeping; the rows themselves may be on a GPU.
They release the interpreter's lock (the caller holds the cache's own): a step's lookup and the
next batch's read-ahead on another thread then run side by side.
"""

from __future__ import annotations

import numba
import numpy as np

from embedding.id_hashing import mix64, reduce_hash

EMPTY = -1
"""The tag of a place that holds no row."""

_SET_SALT = np.uint64(0x9E3779B97F4A7C15)

# The counters ``assign`` fills: rows fetched, rows written back, lookups that found their row, and where
# it stopped (the number of rows when it did not: it stops early when the overflow places run out).
FETCHED, EVICTED, HITS, STOPPED = 0, 1, 2, 3


@numba.njit(cache=True)
def set_of(row, num_sets):  # type: ignore[no-untyped-def]
    return reduce_hash(mix64(np.uint64(row) ^ _SET_SALT), num_sets)


@numba.njit(nogil=True, cache=True)
def assign(  # type: ignore[no-untyped-def]
    rows,
    counts,
    start,
    tags,
    scores,
    dirty,
    pins,
    ways,
    tick,
    lfu,
    training,
    overflow_of,
    overflow_tags,
    free_overflow,
    slots,
    fetch_rows,
    fetch_slots,
    evict_rows,
    evict_slots,
    counters,
):
    """Give the distinct ``rows[start:]``, looked up ``counts`` times each, their places (``slots``), pinning each.

    A lookup's ids repeat (a skewed draw: about 45,000 distinct of 106,000 in ``benchmarks/tiered_tables.py``),
    so each distinct row is placed once. In training a row is pinned once (its step unpins the distinct places),
    in evaluation once per look-up (the lookup unpins every place it read). A missing row takes the unpinned
    place of its set with the lowest score (an empty one first), and the row it replaces is written back if a
    step changed it (``evict_*``); with every place pinned it takes an overflow place. Each new row's place is
    listed in ``fetch_*``. LRU scores a place by the tick of its last lookup, LFU by its lookups since the row
    came in; the first look-up of a missing row misses, the others (and every one of a cached row) hit. In
    training, a place is marked dirty: its step will change it. ``free_overflow`` is a stack whose size is
    ``free_overflow[0]``.
    """
    num_sets = tags.size // ways
    for i in range(start, rows.size):
        row = rows[i]
        first = set_of(row, num_sets) * ways
        slot = -1
        for way in range(first, first + ways):
            if tags[way] == row:
                slot = way
                break
        if slot < 0 and row in overflow_of:
            slot = overflow_of[row]
        if slot >= 0:
            counters[HITS] += counts[i]
            if slot < tags.size:
                scores[slot] = scores[slot] + counts[i] if lfu else tick
        else:
            for way in range(first, first + ways):
                if pins[way] == 0 and (slot < 0 or tags[way] == EMPTY or scores[way] < scores[slot]):
                    slot = way
                    if tags[way] == EMPTY:
                        break
            if slot >= 0:
                if tags[slot] != EMPTY and dirty[slot]:
                    evict_rows[counters[EVICTED]] = tags[slot]
                    evict_slots[counters[EVICTED]] = slot
                    counters[EVICTED] += 1
                tags[slot] = row
                scores[slot] = counts[i] if lfu else tick
                dirty[slot] = False
            else:
                if free_overflow[0] == 0:
                    counters[STOPPED] = i
                    return
                slot = free_overflow[free_overflow[0]]
                free_overflow[0] -= 1
                overflow_of[row] = slot
                overflow_tags[slot - tags.size] = row
                dirty[slot] = False
            fetch_rows[counters[FETCHED]] = row
            fetch_slots[counters[FETCHED]] = slot
            counters[FETCHED] += 1
            counters[HITS] += counts[i] - 1
        pins[slot] += 1 if training else counts[i]
        if training:
            dirty[slot] = True
        slots[i] = slot
    counters[STOPPED] = rows.size


@numba.njit(nogil=True, cache=True)
def unpin(slots, pins):  # type: ignore[no-untyped-def]
    for i in range(slots.size):
        pins[slots[i]] -= 1


@numba.njit(nogil=True, cache=True)
def missing(rows, tags, ways, overflow_of, out):  # type: ignore[no-untyped-def]
    """Write into ``out`` the distinct ``rows`` (sorted) that the cache lacks; return how many."""
    num_sets = tags.size // ways
    count = 0
    for i in range(rows.size):
        row = rows[i]
        if i > 0 and row == rows[i - 1]:
            continue
        first = set_of(row, num_sets) * ways
        found = False
        for way in range(first, first + ways):
            if tags[way] == row:
                found = True
                break
        if not found and row not in overflow_of:
            out[count] = row
            count += 1
    return count


@numba.njit(nogil=True, cache=True)
def gather_columns(source, places, out, column):  # type: ignore[no-untyped-def]
    """Copy ``source[places[i]]`` into ``out[i]``'s columns from ``column`` on (a record's part, out of the cache)."""
    width = source.shape[1]
    for i in range(places.size):
        for c in range(width):
            out[i, column + c] = source[places[i], c]


@numba.njit(nogil=True, cache=True)
def scatter_columns(records, which, column, places, out):  # type: ignore[no-untyped-def]
    """Copy the columns from ``column`` on of ``records[which[i]]`` into ``out[places[i]]`` (into the cache)."""
    width = out.shape[1]
    for i in range(places.size):
        for c in range(width):
            out[places[i], c] = records[which[i], column + c]
