"""A stable sort of a CPU batch's row ids, by their digits, in as few passes as the table's size needs.

A batch's ids are rows of one table (or buffer): below ``num_rows``, so a sort needs only the bits that
``num_rows`` takes (20 for a million rows), not the key type's 32 or 64. Two passes of 10 bits sort a
million-row table's ids, where a sort of whole int32 keys by bytes makes four; each pass moves every id
once, to the next place of its digit, keeping equal ids in their order (the order of
``torch.sort(stable=True)``). One thread: a parallel region would wait for a second core on a shared
machine (torch's two-thread sort took 3.9 ms in a step beside a busy process; docs/benchmarks.md, "Sparse
embedding step").

In a training step the sort's arrays come cold from memory (the step's lookups and update stream tens of
megabytes through the caches in between), and a pass's writes go to a thousand places at once, more than
the processor's prefetchers follow: each write to a new cache line waited for it. So each id moves with its
position packed in one int64 (one write a move, not two), and every array a pass writes to is first touched
in order, which the prefetchers do follow. The sparse step's 106,496 ids of a million-row table took 0.93-1.02
ms in the step before, 0.72-0.91 packed, 0.48-0.67 packed and touched (docs/benchmarks.md, "Sparse embedding step").
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

MAX_DIGIT_BITS = 12
"""The most bits a pass sorts by: 4,096 digits, whose counts and write positions stay in the L1 cache."""

MAX_KEY_BITS = 31
"""The most bits an id may take (int32 keys); a larger table's ids are sorted by torch."""

_POSITION_BITS = 32
"""The low bits of a packed value, which hold the id's position: up to 2**32 ids a batch."""

_INT64_PER_CACHE_LINE = 8


def digit_bits(num_rows: int) -> list[int]:
    """The bits of each pass, lowest digit first, for ids below ``num_rows``: as few passes as
    ``MAX_DIGIT_BITS`` allows, their bits as even as can be."""
    bits = max(1, (num_rows - 1).bit_length())
    passes = -(-bits // MAX_DIGIT_BITS)
    return [bits // passes + (index < bits % passes) for index in range(passes)]


@numba.njit(cache=True, nogil=True, boundscheck=False)  # type: ignore[untyped-decorator]
def radix_sort(
    ids: npt.NDArray[np.integer],
    bits: npt.NDArray[np.int64],
    keys: npt.NDArray[np.int32],
    order: npt.NDArray[np.int64],
) -> bool:
    """Write ``ids`` sorted stably to ``keys`` and their positions in ``ids`` to ``order``, digit by digit
    (``bits``: each pass's, lowest first; at most ``MAX_KEY_BITS`` in all). Returns False, having sorted
    nothing, if an id is negative or not below ``2 ** sum(bits)``, or the ids number ``2 ** 32`` or more."""
    passes, size = bits.shape[0], ids.shape[0]
    if bits.sum() > MAX_KEY_BITS or size >= np.int64(1) << _POSITION_BITS:
        return False
    starts = np.zeros((passes, 1 << bits.max()), np.int64)
    # One read of the ids counts every pass's digits, checks them and packs each with its position.
    limit = np.int64(1) << bits.sum()
    packed = np.empty(size, np.int64)
    for i in range(size):
        key = np.int64(ids[i])
        if key < 0 or key >= limit:
            return False
        packed[i] = (key << _POSITION_BITS) | i
        shift = _POSITION_BITS
        for index in range(passes):
            starts[index, (key >> (shift - _POSITION_BITS)) & ((1 << bits[index]) - 1)] += 1
            shift += bits[index]
    for index in range(passes):
        total = 0
        for digit in range(1 << bits[index]):
            count = starts[index, digit]
            starts[index, digit] = total
            total += count
    other = np.empty(size if passes > 1 else 0, np.int64)
    shift = _POSITION_BITS
    for index in range(passes - 1):
        _touch(other, _INT64_PER_CACHE_LINE)
        _move(packed, other, keys, order, starts[index], shift, bits[index])
        packed, other = other, packed
        shift += bits[index]
    _touch(keys, 2 * _INT64_PER_CACHE_LINE)
    _touch(order, _INT64_PER_CACHE_LINE)
    _move(packed, other[:0], keys, order, starts[passes - 1], shift, bits[passes - 1])
    return True


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _move(source, target, keys, order, starts, shift, bits):  # type: ignore[no-untyped-def]
    """One pass: each packed value to the next place of its digit (the ``bits`` bits above ``shift``), whose
    first places ``starts`` holds: in ``target``, or, if it is empty (the last pass), unpacked, its id to
    ``keys`` and its position to ``order``."""
    mask, unpack = (1 << bits) - 1, target.shape[0] == 0
    for i in range(source.shape[0]):
        value = source[i]
        digit = (value >> shift) & mask
        at = starts[digit]
        starts[digit] = at + 1
        if unpack:
            keys[at] = value >> _POSITION_BITS
            order[at] = value & ((np.int64(1) << _POSITION_BITS) - 1)
        else:
            target[at] = value


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _touch(array, per_cache_line):  # type: ignore[no-untyped-def]
    """Write each cache line of ``array`` once, in order (what it holds does not matter: a pass overwrites it)."""
    for i in range(0, array.shape[0], per_cache_line):
        array[i] = 0
