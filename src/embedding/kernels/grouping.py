"""A CPU lookup's ids in one compiled pass: each feature's ids hashed or checked into its table's rows
and moved to the group's buffer; and, where every bag holds one id, their offsets in another.

Done with torch ops, this took a remainder, a range check with a read of its result and an offset per
feature: 0.6 ms for 26 features of a few ids a bag, against 0.3 ms here (docs/benchmarks.md, "Sparse embedding step").
Features with as many ids each took a few ops for all of them, a little slower than this pass still. The
pass releases the GIL, as a train pipeline groups the next batch's ids on a thread of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from numba import njit


class IdOutOfRange(Exception):
    """Raised by :func:`group_ids` on an id outside its table's rows: ``feature`` is the first feature that has one."""

    def __init__(self, feature: int) -> None:
        super().__init__(feature)
        self.feature = feature


def group_ids(
    ids: torch.Tensor,
    feature_ends: Sequence[int],
    num_rows: Sequence[int],
    hashed: Sequence[bool],
    checked: Sequence[bool],
    buffer_offsets: Sequence[int],
) -> None:
    """Turn ``ids`` (int64, on the CPU: the features' ids one after the other, feature ``f``'s ending at
    ``feature_ends[f]``) into rows of the group's buffer, in place.

    Feature ``f``'s ids are taken modulo ``num_rows[f]`` where ``hashed[f]``, else must lie in
    ``[0, num_rows[f])`` where ``checked[f]``; then they move by ``buffer_offsets[f]``.

    :raises IdOutOfRange: naming the first feature with an id out of its range (``ids`` half done then).
    """
    bad_feature = _group(
        ids.numpy(),
        np.asarray(feature_ends, dtype=np.int64),
        np.asarray(num_rows, dtype=np.int64),
        np.asarray(hashed, dtype=np.bool_),
        np.asarray(checked, dtype=np.bool_),
        np.asarray(buffer_offsets, dtype=np.int64),
    )
    if bad_feature >= 0:
        raise IdOutOfRange(bad_feature)


@njit(cache=True, nogil=True)
def _group(ids, feature_ends, num_rows, hashed, checked, buffer_offsets):  # type: ignore[no-untyped-def]
    """``ids`` to buffer rows, in place; the first feature out of range, or -1. Each feature's loop does one
    thing, without a branch or an exit inside, so that it compiles to vector instructions."""
    begin = 0
    for feature in range(feature_ends.size):
        values = ids[begin : feature_ends[feature]]
        begin = feature_ends[feature]
        rows, offset = num_rows[feature], buffer_offsets[feature]
        if hashed[feature]:
            for k in range(values.size):
                values[k] = values[k] % rows + offset  # numba's % takes the divisor's sign, as torch.remainder's
            continue
        if checked[feature] and values.size:
            low, high = values[0], values[0]
            for k in range(values.size):
                low, high = min(low, values[k]), max(high, values[k])
            if low < 0 or high >= rows:
                return feature
        if offset:
            for k in range(values.size):
                values[k] += offset
    return -1


def one_id_bag_offsets(feature_offsets: Sequence[torch.Tensor], num_ids: int) -> torch.Tensor | None:
    """The bag offsets of ``num_ids`` ids, one a bag (``0, 1, ..., num_ids``), if every feature's ``offsets``
    (int64, on the CPU) say each of its bags holds one id; else ``None``.

    One compiled pass on one thread checks them and writes the range. Torch's range, stack and comparison, which
    run in parallel regions that wait for every thread's core, took 0.03-0.04 ms more of the sparse step on an idle
    machine, and beside a busy process, two threads forced, the grouping's median was 3.86 ms in one run of four
    against 0.34-0.42 (docs/benchmarks.md, "Sparse embedding step").
    """
    offsets = torch.empty(num_ids + 1, dtype=torch.int64)
    checked = tuple(feature.contiguous().numpy() for feature in feature_offsets)
    return offsets if _one_id_bags(checked, offsets.numpy()) else None


@njit(cache=True, nogil=True)
def _one_id_bags(feature_offsets, offsets):  # type: ignore[no-untyped-def]
    """Whether every array of ``feature_offsets`` is ``0, 1, ...``; ``offsets`` filled with ``0, 1, ...`` if so."""
    for feature in range(len(feature_offsets)):
        values = feature_offsets[feature]
        for k in range(values.size):
            if values[k] != k:
                return False
    for k in range(offsets.size):
        offsets[k] = k
    return True
