"""Rows stored in float16 or bfloat16: their float32 values, and stochastic rounding back to them.

A step computes a row in float32 and writes it back in the table's dtype. Rounded to nearest, an update
smaller than half the gap between two neighbouring half-precision values is lost every time, and a
row that many small steps should move stays where it is. Rounded stochastically, up with the
probability of the value's distance from the value below (in units of the gap), a row moves by the
update in expectation (Zhang et al., "Training with Low-precision Embedding Tables"; FBGEMM's default
for tables that are not float32).

The random bits are a pure function of the table's salt (the run's seed and its name), the step, the
row's global key (its global row, or a hash table's id) and the element: no generator carries state, so a
resumed run and a run on another number of ranks round every element alike. A row's 64 bits come from splitmix64,
its elements' 32 each from a 32-bit hash of them, which vectorises: the hash, not the rounding, was most of a
half-precision row's cost. The rounding is exact
for every input, subnormal results included (FBGEMM's float16 rounding is biased there): it compares the
dropped bits with as many random bits, as integers.

The compiled functions (``register_jitable``) take and return bits as integers, so that the CPU and
the CUDA kernels compile them alike; the numpy functions below them are the reference's, written
apart so that the tests compare two ways of computing the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch
from numba.extending import register_jitable

from embedding.id_hashing import mix64

FLOAT32, FLOAT16, BFLOAT16 = 0, 1, 2
"""Codes of a table's dtype, as the kernels are compiled for it."""

_KINDS = {torch.float32: FLOAT32, torch.float16: FLOAT16, torch.bfloat16: BFLOAT16}

ROW_DTYPES: tuple[torch.dtype, ...] = tuple(_KINDS)
"""The dtypes a table's rows may have."""

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
"""splitmix64's increment: the random bits of successive steps lie this far apart."""
ROUNDING_HASH = (0x9E3779B9, 0x21F0AAAD, 0x735A2D97)
"""The constants of :func:`element_random`: the step between a row's elements (the golden ratio in 32 bits) and
the hash's two multipliers."""
_GOLDEN32, _MIX32_FIRST, _MIX32_SECOND = (np.uint64(constant) for constant in ROUNDING_HASH)
_LOW32 = np.uint64(0xFFFFFFFF)


def kind_of(dtype: torch.dtype) -> int:
    """The code of a row dtype (:data:`FLOAT32`, :data:`FLOAT16`, :data:`BFLOAT16`)."""
    return _KINDS[dtype]


@dataclass(frozen=True)
class RowKeys:
    """What the random bits of a buffer's rows are keyed by, so that they do not depend on where a row is.

    The buffer holds shards one after the other: shard ``s`` ends before buffer row ``ends[s]``, its
    table's salt is ``salts[s]`` and its buffer row ``b`` is global row ``b + bases[s]``. A hash table's
    rows are keyed by the id each slot holds, ``slot_ids[b]``, which any number of ranks agree on
    (``None`` for a fixed table).
    """

    salts: npt.NDArray[np.uint64]
    ends: npt.NDArray[np.int64]
    bases: npt.NDArray[np.int64]
    slot_ids: npt.NDArray[np.int64] | None = None

    @staticmethod
    def of_buffer(num_rows: int, salt: int = 0) -> RowKeys:
        """One shard holding the global rows ``[0, num_rows)``: the keys of a table that is its buffer."""
        return RowKeys(
            np.array([salt], dtype=np.uint64), np.array([num_rows], dtype=np.int64), np.zeros(1, dtype=np.int64)
        )

    def keys(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        """The global key of each buffer row of ``rows``, as the kernels compute it (:func:`row_key`)."""
        if self.slot_ids is not None:
            return self.slot_ids[rows].astype(np.uint64)
        shard = np.searchsorted(self.ends, rows, side="right")
        return (rows + self.bases[shard]).astype(np.uint64)

    def salts_of(self, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        """The salt of each buffer row's table."""
        return self.salts[np.searchsorted(self.ends, rows, side="right")]


@dataclass(frozen=True, kw_only=True)
class DeviceRowKeys(RowKeys):
    """The :class:`RowKeys` of a hash table whose index lives on a CUDA device: ``device_slot_ids`` is the index's
    own tensor of the id each slot holds, as the step's lookups left it, which the CUDA kernels read where it is.
    The index's host copy lags behind it (it is brought up to date for a checkpoint only), so ``slot_ids`` stays
    ``None``, and a backend on the CPU takes :meth:`on_host` instead (:func:`embedding.kernels.fused_step` sees to
    it)."""

    device_slot_ids: torch.Tensor

    def on_host(self) -> RowKeys:
        """The same keys with the slot ids copied to the host (the host waits for the device)."""
        return RowKeys(self.salts, self.ends, self.bases, self.device_slot_ids.cpu().numpy())


# Compiled: the CPU and the CUDA kernels call these for each row and element.


@register_jitable
def row_key(row, ends, bases, salts, slot_ids):  # type: ignore[no-untyped-def]
    """The salt of buffer row ``row``'s table and its global key (see :class:`RowKeys`); a buffer holds a few
    shards, so a scan finds the row's."""
    shard = 0
    while shard < ends.size - 1 and row >= ends[shard]:
        shard += 1
    key = np.uint64(slot_ids[row]) if slot_ids.size else np.uint64(row + bases[shard])
    return salts[shard], key


@register_jitable
def row_random_base(salt, step, key):  # type: ignore[no-untyped-def]
    """The 64 bits a row's elements draw their random bits from, in step ``step``."""
    return mix64(mix64(salt ^ (np.uint64(step) * _GOLDEN)) ^ key)


@register_jitable
def element_random(base, element):  # type: ignore[no-untyped-def]
    """32 random bits (in a uint64) for element ``element`` of a row whose bits come from ``base``: a 32-bit
    integer hash (Wellons' "lowbias32", the row's high 32 bits mixed in between its two rounds) of the row's low
    32 bits plus the element's multiple of the golden ratio. The arithmetic is 32 bits wide, which a vector unit
    without 64-bit multiplies (AVX2) computes eight elements at a time: splitmix64 for every pair of elements
    cost a bfloat16 row more than its loads and stores."""
    value = (base + np.uint64(element) * _GOLDEN32) & _LOW32
    value ^= value >> np.uint64(16)
    value = ((value * _MIX32_FIRST) & _LOW32) ^ (base >> np.uint64(32))
    value ^= value >> np.uint64(15)
    value = (value * _MIX32_SECOND) & _LOW32
    return value ^ (value >> np.uint64(15))


@register_jitable
def widen(bits, kind):  # type: ignore[no-untyped-def]
    """The float32 bits (uint32) of a float16 or bfloat16 value's ``bits``: exact, subnormals normalised. A bfloat16
    and a normal float16 are a shift (and an addition); zero, subnormals, infinities and NaN take a branch."""
    bits = np.uint32(bits) & np.uint32(0xFFFF)
    if kind == BFLOAT16:
        return bits << np.uint32(16)
    sign = (bits & np.uint32(0x8000)) << np.uint32(16)
    magnitude = bits & np.uint32(0x7FFF)
    if np.uint32(0x0400) <= magnitude < np.uint32(0x7C00):  # a normal float16: its exponent moved to float32's bias
        return sign | ((magnitude << np.uint32(13)) + np.uint32(112 << 23))
    mantissa = magnitude & np.uint32(0x3FF)
    if magnitude >= np.uint32(0x7C00):  # infinity or NaN
        return sign | np.uint32(0x7F800000) | (mantissa << np.uint32(13))
    if mantissa == 0:
        return sign
    exponent32 = np.uint32(113)  # a subnormal: shifted until its leading bit is the implicit one
    while mantissa & np.uint32(0x400) == 0:
        mantissa <<= np.uint32(1)
        exponent32 -= np.uint32(1)
    return sign | (exponent32 << np.uint32(23)) | ((mantissa & np.uint32(0x3FF)) << np.uint32(13))


@register_jitable
def round_stochastically(bits, random, kind):  # type: ignore[no-untyped-def]
    """The float16 or bfloat16 bits (uint16 in a uint32) of the float32 value of ``bits``, rounded up in magnitude
    when the dropped bits and as many random bits (the top of ``random``'s 32) carry into the kept ones: with the
    probability of the dropped bits' fraction of a unit.

    The common cases, a bfloat16 and a normal float16, are one addition and a shift; the rest (subnormal float16,
    infinities, NaN) take :func:`_round_rare`. Every operand is a uint64: numba computes a mix of signed and unsigned
    integers in float64."""
    bits, random = np.uint64(bits), np.uint64(random)
    sign = (bits >> np.uint64(16)) & np.uint64(0x8000)
    magnitude = bits & np.uint64(0x7FFFFFFF)
    if kind == BFLOAT16 and magnitude < np.uint64(0x7F800000):
        return np.uint32(sign | ((magnitude + (random >> np.uint64(16))) >> np.uint64(16)))
    if kind != BFLOAT16 and np.uint64(0x38800000) <= magnitude < np.uint64(0x47800000):  # 2^-14 to 2^16
        return np.uint32(sign | (((magnitude + (random >> np.uint64(19))) >> np.uint64(13)) - np.uint64(112 << 10)))
    return np.uint32(sign | _round_rare(magnitude, random, kind))


@register_jitable
def _round_rare(magnitude, random, kind):  # type: ignore[no-untyped-def]
    """:func:`round_stochastically`'s magnitude bits of an infinity, a NaN, or a value beyond float16's normal range."""
    exponent, mantissa = magnitude >> np.uint64(23), magnitude & np.uint64(0x7FFFFF)
    if exponent == np.uint64(255):  # infinity stays infinity, NaN stays a (quiet) NaN
        if kind == BFLOAT16:
            return (magnitude >> np.uint64(16)) | (np.uint64(0x40) if mantissa != np.uint64(0) else np.uint64(0))
        return np.uint64(0x7C00) | (np.uint64(0x200) if mantissa != np.uint64(0) else np.uint64(0))
    if exponent >= np.uint64(143):  # 2^16 and beyond: infinity in float16
        return np.uint64(0x7C00)
    # A subnormal float16, in units of 2^-24: the smaller the value, the more bits dropped.
    if exponent > np.uint64(0):
        full, dropped = mantissa | np.uint64(0x800000), np.uint64(126) - exponent
    else:  # a float32 subnormal: no implicit bit
        full, dropped = mantissa, np.uint64(125)
    if dropped >= np.uint64(56):  # under 2^-32 of a unit: the random bits cannot reach it
        return np.uint64(0)
    if dropped <= np.uint64(32):
        return (full + (random >> (np.uint64(32) - dropped))) >> dropped
    # More bits dropped than random ones: the dropped bits' top 32 take the carry (an error under 2^-32).
    carry = (full & ((np.uint64(1) << dropped) - np.uint64(1))) >> (dropped - np.uint64(32))
    return (full >> dropped) + ((carry + random) >> np.uint64(32))


# The reference's: the same bits, from whole arrays with numpy.


def random_bits(keys: RowKeys, rows: npt.NDArray[np.int64], step: int, dim: int) -> npt.NDArray[np.uint64]:
    """The 32 random bits (in uint64) of every element of the buffer's ``rows`` in step ``step``, ``[rows, dim]``."""
    with np.errstate(over="ignore"):
        salt = keys.salts_of(rows)
        base = _mix64(_mix64(salt ^ (np.uint64(step) * _GOLDEN)) ^ keys.keys(rows))[:, None]
        low, high = (base & _LOW32).astype(np.uint32), (base >> np.uint64(32)).astype(np.uint32)
        value = low + np.arange(dim, dtype=np.uint32)[None, :] * np.uint32(_GOLDEN32)
        value ^= value >> np.uint32(16)
        value = (value * np.uint32(_MIX32_FIRST)) ^ high
        value ^= value >> np.uint32(15)
        value *= np.uint32(_MIX32_SECOND)
        return (value ^ (value >> np.uint32(15))).astype(np.uint64)


def round_array(values: torch.Tensor, random: npt.NDArray[np.uint64], dtype: torch.dtype) -> torch.Tensor:
    """``values`` (float32) rounded stochastically to ``dtype`` with ``random`` (32 bits each, in uint64): the
    dropped bits and as many random bits added, carrying into the kept bits, computed apart from
    :func:`round_stochastically` (as the value's kept and dropped bits, whatever its range)."""
    bits = values.contiguous().view(torch.int32).numpy().astype(np.int64) & 0xFFFFFFFF
    sign = (bits >> 16) & 0x8000
    magnitude = bits & 0x7FFFFFFF
    exponent, mantissa = magnitude >> 23, magnitude & 0x7FFFFF
    random = random.astype(np.int64)
    if dtype == torch.bfloat16:
        kept, fraction, dropped = magnitude >> 16, magnitude & 0xFFFF, np.full_like(bits, 16)
        special = exponent == 255
        special_bits = (magnitude >> 16) | np.where(mantissa != 0, 0x40, 0)
    else:
        normal = (exponent >= 113) & (exponent < 143)
        full = np.where(exponent > 0, mantissa | 0x800000, mantissa)
        dropped = np.where(normal, 13, 126 - np.maximum(exponent, 1))
        shift = np.minimum(dropped, 63)
        kept = np.where(normal, ((exponent - 112) << 10) | (mantissa >> 13), full >> shift)
        fraction = np.where(normal, mantissa & 0x1FFF, full & ((1 << shift) - 1))
        special = exponent >= 143
        special_bits = np.where(exponent == 255, 0x7C00 | np.where(mantissa != 0, 0x200, 0), 0x7C00)
    near = dropped <= 32
    # Up when the dropped bits and the random bits (as many, or the dropped bits' top 32) carry.
    carry_near = (fraction + (random >> np.clip(32 - dropped, 0, 32))) >> np.clip(dropped, 0, 32)
    carry_far = ((fraction >> np.clip(dropped - 32, 0, 63)) + random) >> 32
    up = np.where(near, carry_near, np.where(dropped < 56, carry_far, 0))
    rounded = sign | np.where(special, special_bits, kept + up)
    return torch.from_numpy(rounded.astype(np.uint16).view(np.int16)).view(dtype)


def _mix64(value: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    value = (value ^ (value >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    value = (value ^ (value >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return value ^ (value >> np.uint64(31))
