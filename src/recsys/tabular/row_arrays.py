"""Multi-hot fields as the readers hand them on: per row, an array of its ids (or weights), in an object array.

A chunk's values come flat, with offsets; cutting them into one view per row is done once per chunk and
column, for every row, so it is done here with a plain loop over the offsets: ``np.split`` costs ten times
as much, building each piece through a chain of swapaxes calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt


def object_array(parts: Sequence[npt.NDArray[Any]]) -> npt.NDArray[Any]:
    """An object array of the arrays ``parts``, one per row (numpy would stack equal-length arrays otherwise)."""
    bags = np.empty(len(parts), dtype=object)
    for index, part in enumerate(parts):
        bags[index] = part
    return bags


def split_rows(
    values: npt.NDArray[Any], offsets: npt.NDArray[np.int64], keep_last: int | None = None
) -> npt.NDArray[Any]:
    """``values[offsets[i]:offsets[i + 1]]`` for each row ``i``: views, in an object array of ``len(offsets) - 1``;
    with ``keep_last``, at most that many of each row's values, its last ones (a sequence's latest)."""
    bounds = offsets.tolist()
    bags = np.empty(max(len(bounds) - 1, 0), dtype=object)
    if keep_last is None:
        for row in range(len(bags)):
            bags[row] = values[bounds[row] : bounds[row + 1]]
    else:
        for row in range(len(bags)):
            bags[row] = values[max(bounds[row], bounds[row + 1] - keep_last) : bounds[row + 1]]
    return bags
