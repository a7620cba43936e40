"""Hashes of ids that do not depend on any table's state: which rank owns an id, and its initial row.

Both must be the same functions of the id in every process and run, so that a table sharded by id
reshards to any number of ranks, and a row started for an id on one rank equals the row it would
have started from on another. ``mix64`` and ``reduce_hash`` compile for the CPU and CUDA alike.
"""

from __future__ import annotations

import zlib

import numba
import numpy as np
import numpy.typing as npt
from numba.extending import register_jitable

_OWNER_SALT = np.uint64(0x27D4EB2F165667C5)


@register_jitable
def mix64(value):  # type: ignore[no-untyped-def]
    """splitmix64's finaliser: every bit of ``value`` (uint64) moves every bit of the result."""
    value = (value ^ (value >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    value = (value ^ (value >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return value ^ (value >> np.uint64(31))


@register_jitable
def reduce_hash(hash_value, size):  # type: ignore[no-untyped-def]
    """``hash_value`` mapped onto ``[0, size)`` by its high 32 bits (Lemire's multiply-shift)."""
    return np.int64(((hash_value >> np.uint64(32)) * np.uint64(size)) >> np.uint64(32))


@numba.njit(cache=True)
def _owners_kernel(ids, num_ranks, owners):  # type: ignore[no-untyped-def]
    for i in range(ids.size):
        owners[i] = reduce_hash(mix64(np.uint64(ids[i]) ^ _OWNER_SALT), num_ranks)


def owner_ranks(ids: npt.NDArray[np.int64], num_ranks: int) -> npt.NDArray[np.int64]:
    """The rank that holds each id of a table sharded by hash over ``num_ranks`` ranks."""
    owners = np.empty(ids.size, dtype=np.int64)
    _owners_kernel(np.ascontiguousarray(ids, dtype=np.int64), num_ranks, owners)
    return owners


@numba.njit(cache=True)
def _init_row(weight, row, key, salt, scale, normal):  # type: ignore[no-untyped-def]
    base = mix64(np.uint64(key) ^ salt)
    for column in range(weight.shape[1]):
        first = mix64(base + np.uint64(2 * column + 1))
        uniform = (first >> np.uint64(11)) * (1.0 / 9007199254740992.0)
        if normal:
            second = mix64(base + np.uint64(2 * column + 2))
            other = ((second >> np.uint64(11)) + 1) * (1.0 / 9007199254740992.0)
            value = np.sqrt(-2.0 * np.log(other)) * np.cos(2.0 * np.pi * uniform) * scale
        else:
            value = (2.0 * uniform - 1.0) * scale
        weight[row, column] = value


@numba.njit(cache=True, parallel=True)
def _init_kernel(weight, rows, keys, salt, scale, normal):  # type: ignore[no-untyped-def]
    for i in numba.prange(rows.size):
        _init_row(weight, rows[i], keys[i], salt, scale, normal)


@numba.njit(cache=True)
def _init_kernel_serial(weight, rows, keys, salt, scale, normal):  # type: ignore[no-untyped-def]
    for i in range(rows.size):
        _init_row(weight, rows[i], keys[i], salt, scale, normal)


def init_salt(seed: int, table: str) -> int:
    """What the initial rows of ``table`` hash their ids with: the run's seed and the table's name."""
    return zlib.crc32(f"{seed}/{table}".encode())


def init_rows_by_key(
    weight: npt.NDArray[np.float32],
    rows: npt.NDArray[np.int64],
    keys: npt.NDArray[np.int64],
    salt: int,
    scale: float,
    normal: bool,
    parallel: bool = True,
) -> None:
    """Write into ``weight[rows[i]]`` the initial values of id ``keys[i]``: a function of the id and
    ``salt`` alone, so that an id starts from the same values whichever slot, rank or run it lands on.

    ``parallel=False`` computes the same values on this thread alone: for a thread that works beside the step's
    parallel kernels (numba's workqueue layer aborts when two threads launch parallel kernels at once)."""
    (_init_kernel if parallel else _init_kernel_serial)(weight, rows, keys, np.uint64(salt), scale, normal)
