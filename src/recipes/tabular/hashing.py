"""The stable 64-bit hash that maps a categorical value to its id, the same on every machine, rank and run.

``hash(column, text) = splitmix64(fnv1a64(column + "\\x1f" + text))`` over the UTF-8 bytes: FNV-1a
is keyed by the column so that equal texts of different columns (a shared table) land apart,
and splitmix64's finaliser spreads FNV's weak low bits before the modulo. The id of a value is
``1 + hash % (num_buckets - 1)``; an empty field is id 0, which no value shares.
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
SEPARATOR = 0x1F


# Untyped: numba compiles these for the types of their arguments (uint8 bytes, int64 offsets, uint64 state).
@numba.njit(cache=True)
def _fnv1a(data, start, end, state):  # type: ignore[no-untyped-def]
    for position in range(start, end):
        state = (state ^ np.uint64(data[position])) * FNV_PRIME
    return state


@numba.njit(cache=True)
def _splitmix64(value):  # type: ignore[no-untyped-def]
    value = (value ^ (value >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    value = (value ^ (value >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return value ^ (value >> np.uint64(31))


@numba.njit(cache=True)
def _ids(data, offsets, basis, num_buckets):  # type: ignore[no-untyped-def]
    ids = np.zeros(len(offsets) - 1, dtype=np.int64)
    modulus = np.uint64(num_buckets - 1)
    for i in range(len(ids)):
        if offsets[i + 1] > offsets[i]:
            ids[i] = 1 + np.int64(_splitmix64(_fnv1a(data, offsets[i], offsets[i + 1], basis)) % modulus)
    return ids


def column_basis(column: str) -> np.uint64:
    """FNV-1a's state after ``column`` and the separator: where every value of the column starts."""
    key = np.frombuffer(column.encode() + bytes([SEPARATOR]), dtype=np.uint8)
    return np.uint64(_fnv1a(key, 0, len(key), FNV_OFFSET))


def hash_ids(values: pa.Array, column: str, num_buckets: int) -> npt.NDArray[np.int64]:
    """The ids of a string array's values (nulls and empty strings: 0), in ``[0, num_buckets)``."""
    values = values.cast(pa.large_string()).fill_null("")
    buffers = values.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[values.offset : values.offset + len(values) + 1]
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    ids: npt.NDArray[np.int64] = _ids(data, np.ascontiguousarray(offsets), column_basis(column), num_buckets)
    return ids


def hash_value(text: str, column: str, num_buckets: int) -> int:
    """The id of one value: what ``hash_ids`` gives it (for tests, and for users looking an id up)."""
    return int(hash_ids(pa.array([text]), column, num_buckets)[0])
