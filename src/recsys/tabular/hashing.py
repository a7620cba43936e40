"""The stable 64-bit hash that maps a categorical value to its id, the same on every machine, rank and run.

``key(column, text) = splitmix64(fnv1a64(column + "\\x1f" + text))`` over the UTF-8 bytes of the
text with surrounding ASCII whitespace trimmed: FNV-1a is keyed by the column so that equal texts
of different columns (a shared table) land apart, and splitmix64's finaliser spreads FNV's weak
low bits before the modulo. An empty field has key 0 (a text whose key is 0, chance 2**-64,
becomes 1 instead). The id of a value is ``1 + key % (num_buckets - 1)``; an empty field is
id 0, which no value shares.

The numba functions here are the building blocks of the readers' tokenisers, which hash a
field's bytes where they lie in the chunk, without making a string of it.
"""

from __future__ import annotations

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from embedding import mix64
from recsys.tabular.tokens import trim

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
SEPARATOR = 0x1F
NO_QUOTE = -1


# Untyped: numba compiles these for the types of their arguments (uint8 bytes, int64 offsets, uint64 state).
@numba.njit(cache=True)
def _fnv1a(data, start, end, state):  # type: ignore[no-untyped-def]
    for position in range(start, end):
        state = (state ^ np.uint64(data[position])) * FNV_PRIME
    return state


@numba.njit(cache=True)
def finish_key(state):  # type: ignore[no-untyped-def]
    """The key of a non-empty value whose bytes FNV-1a has taken in (``state``)."""
    key = mix64(state)
    return key if key != 0 else np.uint64(1)  # 0 is the empty value's key, which no value shares.


@numba.njit(cache=True)
def span_key(data, start, end, basis, quote):  # type: ignore[no-untyped-def]
    """The key of the text ``data[start:end]`` (0 if it is empty once trimmed). With ``quote`` >= 0 the
    span is a quoted field's inside, whose doubled quotes stand for one."""
    start, end = trim(data, start, end)
    if start == end:
        return np.uint64(0)
    if quote < 0:
        return finish_key(_fnv1a(data, start, end, basis))
    state, position = basis, start
    while position < end:
        state = (state ^ np.uint64(data[position])) * FNV_PRIME
        position += 2 if data[position] == quote and position + 1 < end and data[position + 1] == quote else 1
    return finish_key(state)


@numba.njit(cache=True)
def bucket_id(key, num_buckets):  # type: ignore[no-untyped-def]
    """The id of ``key`` in a table of ``num_buckets`` rows; with 0 rows, the key itself (as int64)."""
    if num_buckets == 0:
        return np.int64(key)
    return np.int64(0) if key == 0 else np.int64(key % (num_buckets - np.uint64(1))) + 1


@numba.njit(cache=True)
def _span_keys(data, starts, ends, basis):  # type: ignore[no-untyped-def]
    keys = np.zeros(len(starts), dtype=np.uint64)
    for i in range(len(keys)):
        keys[i] = span_key(data, starts[i], ends[i], basis, NO_QUOTE)
    return keys


def column_basis(column: str) -> np.uint64:
    """FNV-1a's state after ``column`` and the separator: where every value of the column starts."""
    key = np.frombuffer(column.encode() + bytes([SEPARATOR]), dtype=np.uint8)
    return np.uint64(_fnv1a(key, 0, len(key), FNV_OFFSET))


def bucket_ids(keys: npt.NDArray[np.uint64], num_buckets: int | npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    """The ids of ``keys`` in tables of ``num_buckets`` rows (one number, or one per last-axis column); with 0
    rows, the keys themselves as int64 (for a hash table, which takes any id).

    One compiled pass: numpy's uint64 modulo, the casts and the masks cost a reader more than the
    tokenising of the text they come from."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    if keys.size == 0:
        return np.zeros(keys.shape, dtype=np.int64)
    columns = np.ascontiguousarray(np.broadcast_to(np.asarray(num_buckets, dtype=np.uint64), keys.shape[-1:]))
    return _bucket_ids(keys.reshape(-1, columns.size), columns).reshape(keys.shape)  # type: ignore[no-any-return]


@numba.njit(cache=True)
def _bucket_ids(keys, num_buckets):  # type: ignore[no-untyped-def]
    ids = np.empty(keys.shape, dtype=np.int64)
    for row in range(keys.shape[0]):
        for column in range(keys.shape[1]):
            ids[row, column] = bucket_id(keys[row, column], num_buckets[column])
    return ids


def span_keys(
    data: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], column: str
) -> npt.NDArray[np.uint64]:
    """The keys of the texts ``data[starts[i]:ends[i]]`` as values of ``column``."""
    keys: npt.NDArray[np.uint64] = _span_keys(data, starts, ends, column_basis(column))
    return keys


def text_keys(values: pa.Array | pa.ChunkedArray, column: str) -> npt.NDArray[np.uint64]:
    """The keys of the texts of an array's values as values of ``column`` (nulls and empty strings: 0); an
    integer's text is its decimal text."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks else pa.array([], pa.string())
    values = values.cast(pa.large_string()).fill_null("")
    buffers = values.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[values.offset : values.offset + len(values) + 1]
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return span_keys(data, offsets[:-1], offsets[1:], column)


def hash_ids(values: pa.Array, column: str, num_buckets: int) -> npt.NDArray[np.int64]:
    """The ids of a string array's values (nulls and empty strings: 0), in ``[0, num_buckets)``."""
    return bucket_ids(text_keys(values, column), num_buckets)


@numba.njit(cache=True)
def _integer_keys(values, basis):  # type: ignore[no-untyped-def]
    keys = np.zeros(len(values), dtype=np.uint64)
    digits = np.zeros(24, dtype=np.uint8)
    for i in range(len(values)):
        if np.isnan(values[i]):
            continue
        number, size = np.int64(values[i]), 0
        magnitude = -number if number < 0 else number
        while True:
            digits[size], size = 48 + magnitude % 10, size + 1
            magnitude //= 10
            if magnitude == 0:
                break
        state = basis
        if number < 0:
            state = (state ^ np.uint64(45)) * FNV_PRIME
        for k in range(size - 1, -1, -1):
            state = (state ^ np.uint64(digits[k])) * FNV_PRIME
        keys[i] = finish_key(state)
    return keys


def integer_keys(values: npt.NDArray[np.float64], column: str) -> npt.NDArray[np.uint64]:
    """The keys of the decimal texts of whole numbers (``3.0`` is ``"3"``; NaN, a missing value, is key 0) as
    values of ``column``: a derived column's values hash as the same numbers written in a file would."""
    keys: npt.NDArray[np.uint64] = _integer_keys(np.asarray(values, np.float64), column_basis(column))
    return keys


def hash_value(text: str, column: str, num_buckets: int) -> int:
    """The id of one value: what ``hash_ids`` gives it (for tests, and for users looking an id up)."""
    return int(hash_ids(pa.array([text]), column, num_buckets)[0])
