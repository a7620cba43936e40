"""A half-precision row widened to float32 and rounded back, a whole row at a time, for the CPU kernel.

:func:`~embedding.kernels.rounding.widen` and :func:`~embedding.kernels.rounding.round_stochastically` take one
element and branch on its range, which keeps the compiler from vectorising a row's loop: with them, and one
hash per element, a step on float16 rows took twice a float32 step's time. Here each row goes through loops
without branches that compute the common case (a normal float16, a bfloat16 that is not infinite or NaN) for
every element and count the elements outside it; a row with any such element (zero in float16, a subnormal, an
infinity, a NaN) is done again element by element with the exact functions. The bits are the same either way.

The helpers are inlined into the kernel (``inline="always"``): a call from its parallel loop would count the
references of the array arguments, atomically, once per row.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from embedding.kernels.rounding import BFLOAT16, pair_random, round_stochastically, widen

_SIGN16 = np.uint64(0x8000)
_MAGNITUDE16 = np.uint64(0x7FFF)
_MAGNITUDE32 = np.uint64(0x7FFFFFFF)
_LOW32 = np.uint64(0xFFFFFFFF)
_EXPONENT_BIAS_GAP = np.uint64(112)  # float32's exponent bias (127) less float16's (15)
_FLOAT16_MIN_NORMAL = np.uint64(0x0400)
_FLOAT16_NORMALS = np.uint64(0x7C00 - 0x0400)  # normal magnitudes above the least, as float16 bits
_FLOAT16_MIN_NORMAL32 = np.uint64(0x38800000)  # 2^-14 as float32 bits
_FLOAT16_NORMALS32 = np.uint64(0x47800000 - 0x38800000)  # float32 magnitudes from 2^-14 up to 2^16
_FLOAT32_INFINITY = np.uint64(0x7F800000)


@njit(cache=True, inline="always")
def widen_row(weight_bits, row, out, kind):  # type: ignore[no-untyped-def]
    """``out[0]`` (uint32) = the float32 bits of ``weight_bits[row]`` (float16 or bfloat16 bits, uint16)."""
    dim = out.shape[1]
    if kind == BFLOAT16:
        for d in range(dim):
            out[0, d] = np.uint64(weight_bits[row, d]) << np.uint64(16)
        return
    rare = np.uint64(0)
    for d in range(dim):
        bits = np.uint64(weight_bits[row, d])
        magnitude = bits & _MAGNITUDE16
        sign = (bits & _SIGN16) << np.uint64(16)
        out[0, d] = sign | ((magnitude << np.uint64(13)) + (_EXPONENT_BIAS_GAP << np.uint64(23)))
        rare |= np.uint64(magnitude - _FLOAT16_MIN_NORMAL >= _FLOAT16_NORMALS)
    if rare:
        for d in range(dim):
            out[0, d] = widen(weight_bits[row, d], kind)


@njit(cache=True, inline="always")
def round_row(values, weight_bits, row, base, kind, randoms):  # type: ignore[no-untyped-def]
    """``weight_bits[row]`` = the float32 bits ``values[0]`` rounded stochastically, element ``d`` with the random
    bits :func:`~embedding.kernels.rounding.element_random` gives it from ``base``; ``randoms`` (uint64, the row's
    width rounded up to even) is scratch."""
    dim = values.shape[1]
    hashes = randoms.size // 2  # where the hashes go, after the elements' bits
    for pair in range(hashes // 2):  # the hashes first, so that the loop vectorises
        randoms[hashes + pair] = pair_random(base, pair)
    for d in range(dim):
        randoms[d] = (randoms[hashes + d // 2] >> (np.uint64(32) * np.uint64(1 - d % 2))) & _LOW32
    rare = np.uint64(0)
    if kind == BFLOAT16:
        for d in range(dim):
            bits = np.uint64(values[0, d])
            magnitude = bits & _MAGNITUDE32
            sign = (bits >> np.uint64(16)) & _SIGN16
            weight_bits[row, d] = sign | ((magnitude + (randoms[d] >> np.uint64(16))) >> np.uint64(16))
            rare |= np.uint64(magnitude >= _FLOAT32_INFINITY)
    else:
        for d in range(dim):
            bits = np.uint64(values[0, d])
            magnitude = bits & _MAGNITUDE32
            sign = (bits >> np.uint64(16)) & _SIGN16
            kept = (magnitude + (randoms[d] >> np.uint64(19))) >> np.uint64(13)
            weight_bits[row, d] = sign | (kept - (_EXPONENT_BIAS_GAP << np.uint64(10)))
            rare |= np.uint64(magnitude - _FLOAT16_MIN_NORMAL32 >= _FLOAT16_NORMALS32)
    if rare:
        for d in range(dim):
            weight_bits[row, d] = round_stochastically(values[0, d], randoms[d], kind)
