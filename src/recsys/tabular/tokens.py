"""Byte-level helpers of the numba tokenisers: whitespace and decimal numbers, read where they lie in a chunk."""

from __future__ import annotations

import numba
import numpy as np

# Exact in float64 up to 1e22: scaling by one of these rounds once, as float() does.
_POWERS_OF_TEN = np.array([10.0**k for k in range(23)])

# log(x + 1) of the counts 0..4095 in float32, looked up rather than computed (the same bits): counts
# such as Criteo's are mostly small, and the logarithm is a dense column's largest cost.
SMALL_COUNT_LOGS = np.log1p(np.arange(1 << 12, dtype=np.float64)).astype(np.float32)


# Untyped: numba compiles these for the types of their arguments (uint8 bytes, int64 positions).
@numba.njit(cache=True)
def is_space(byte):  # type: ignore[no-untyped-def]
    return byte == 32 or 9 <= byte <= 13  # ' ', \t, \n, \v, \f, \r


@numba.njit(cache=True)
def trim(data, start, end):  # type: ignore[no-untyped-def]
    """``data[start:end]`` without surrounding ASCII whitespace, as a ``(start, end)`` pair."""
    while start < end and is_space(data[start]):
        start += 1
    while end > start and is_space(data[end - 1]):
        end -= 1
    return start, end


@numba.njit(cache=True)
def number(data, start, end):  # type: ignore[no-untyped-def]
    """The decimal number in ``data[start:end]`` (sign, digits, point, exponent), and whether it is one.

    The digits are gathered as an integer and scaled once, so that numbers of up to 15 digits
    come out as ``float()`` reads them."""
    position, negative, mantissa, digits, decimals = start, False, 0.0, 0, 0
    if position < end and (data[position] == 45 or data[position] == 43):  # '-' '+'
        negative = data[position] == 45
        position += 1
    while position < end and 48 <= data[position] <= 57:
        mantissa, digits, position = mantissa * 10.0 + (data[position] - 48), digits + 1, position + 1
    if position < end and data[position] == 46:  # '.'
        position += 1
        while position < end and 48 <= data[position] <= 57:
            mantissa, digits, position = mantissa * 10.0 + (data[position] - 48), digits + 1, position + 1
            decimals += 1
    exponent = 0
    if digits and position < end and (data[position] == 101 or data[position] == 69):  # 'e' 'E'
        position += 1
        exponent_negative, exponent_digits = False, 0
        if position < end and (data[position] == 45 or data[position] == 43):
            exponent_negative = data[position] == 45
            position += 1
        while position < end and 48 <= data[position] <= 57:
            exponent, exponent_digits, position = (
                min(exponent * 10 + (data[position] - 48), 9999),
                exponent_digits + 1,
                position + 1,
            )
        if not exponent_digits:
            return 0.0, False
        if exponent_negative:
            exponent = -exponent
    scale = exponent - decimals
    if scale == 0:
        value = mantissa
    elif 0 < scale <= 22:
        value = mantissa * _POWERS_OF_TEN[scale]
    elif -22 <= scale < 0:
        value = mantissa / _POWERS_OF_TEN[-scale]
    else:
        value = mantissa * 10.0**scale if scale > 0 else mantissa / 10.0 ** (-scale)
    return -value if negative else value, digits > 0 and position == end


@numba.njit(cache=True, nogil=True)
def log_count(value, small_count_logs):  # type: ignore[no-untyped-def]
    """``log(max(value, 0) + 1)`` in float32, looked up in ``SMALL_COUNT_LOGS`` for the small integers."""
    value = max(value, 0.0)
    if value < len(small_count_logs) and value == np.floor(value):
        return small_count_logs[int(value)]
    return np.float32(np.log1p(value))
