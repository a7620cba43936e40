"""A CPU lookup's ids in one compiled pass: each feature's ids hashed or checked into its table's
rows and moved to the group's buffer.

Done with torch ops, this bookkeeping took a stack of the features' ids, a remainder, a range check
and a host read per feature, and an offset: each op a pass over the ids with Python around it,
together about a tenth of a whole sparse step of 26 one-id features. Here it is one pass, which
releases the GIL, as a train pipeline groups the next batch's ids on a thread of its own.
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
    """``ids`` to buffer rows, in place; the first feature out of range, or -1."""
    begin = 0
    for feature in range(feature_ends.size):
        rows, offset = num_rows[feature], buffer_offsets[feature]
        for position in range(begin, feature_ends[feature]):
            value = ids[position]
            if hashed[feature]:
                value %= rows  # numba's % takes the divisor's sign, as torch.remainder does
            elif checked[feature] and (value < 0 or value >= rows):
                return feature
            ids[position] = value + offset
        begin = feature_ends[feature]
    return -1
