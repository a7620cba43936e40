"""A stable sort of a CPU batch's row ids, by their digits, in as few passes as the table's size needs.

A batch's ids are rows of one table (or buffer): below ``num_rows``, so a sort needs only the bits that
``num_rows`` takes (20 for a million rows), not the key type's 32 or 64. Two passes of 10 bits sort a
million-row table's ids, where a sort of whole int32 keys by bytes makes four; each pass moves every id
once, to the next place of its digit, keeping equal ids in their order (the order of
``torch.sort(stable=True)``). One thread: a hundred thousand ids take about half a millisecond, and a
parallel region would wait for a second core on a shared machine (torch's two-thread sort took 3.9 ms
in a step beside a busy process; BENCHMARKS.md, issue 35).
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt

MAX_DIGIT_BITS = 12
"""The most bits a pass sorts by: 4,096 digits, whose counts and write positions stay in the L1 cache."""


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
    keys: npt.NDArray[np.integer],
    order: npt.NDArray[np.int64],
) -> bool:
    """Write ``ids`` sorted stably to ``keys`` and their positions in ``ids`` to ``order``, digit by digit
    (``bits``: each pass's, lowest first). Returns False, having sorted nothing, if an id is negative or
    not below ``2 ** sum(bits)``."""
    passes = bits.shape[0]
    starts = np.zeros((passes, 1 << bits.max()), np.int64)
    # One read of the ids counts every pass's digits (and checks them); then each pass moves them once.
    limit = np.int64(1) << bits.sum()
    for i in range(ids.shape[0]):
        key = ids[i]
        if key < 0 or key >= limit:
            return False
        shift = 0
        for index in range(passes):
            starts[index, (key >> shift) & ((1 << bits[index]) - 1)] += 1
            shift += bits[index]
    for index in range(passes):
        total = 0
        for digit in range(1 << bits[index]):
            count = starts[index, digit]
            starts[index, digit] = total
            total += count
    # The passes write to a scratch pair and the outputs in turn, the last one to the outputs.
    scratch_keys, scratch_order = np.empty_like(keys), np.empty_like(order)
    written_keys, written_order = (keys, order) if passes % 2 == 1 else (scratch_keys, scratch_order)
    other_keys, other_order = (scratch_keys, scratch_order) if passes % 2 == 1 else (keys, order)
    _move(ids, order, written_keys, written_order, starts[0], 0, bits[0], True)
    shift = bits[0]
    for index in range(1, passes):
        _move(written_keys, written_order, other_keys, other_order, starts[index], shift, bits[index], False)
        written_keys, other_keys = other_keys, written_keys
        written_order, other_order = other_order, written_order
        shift += bits[index]
    return True


@numba.njit(cache=True, nogil=True, boundscheck=False)
def _move(source_keys, source_order, target_keys, target_order, starts, shift, bits, first):  # type: ignore[no-untyped-def]
    """One pass: each key to the next place of its digit (the ``bits`` bits above ``shift``), whose first
    places ``starts`` holds; the first pass's order is the ids' positions."""
    mask = (1 << bits) - 1
    for i in range(source_keys.shape[0]):
        key = source_keys[i]
        digit = (key >> shift) & mask
        at = starts[digit]
        starts[digit] = at + 1
        target_keys[at] = key
        target_order[at] = i if first else source_order[i]
