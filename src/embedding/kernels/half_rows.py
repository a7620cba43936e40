"""A half-precision row widened to float32 and rounded back, a whole row at a time, for the CPU kernel.

:func:`~embedding.kernels.rounding.widen` and :func:`~embedding.kernels.rounding.round_stochastically` take one
element and branch on its range, which keeps the compiler from vectorising a row's loop. Here every element goes
through the same instructions, whatever its range, so that a row's loops vectorise: a float16 is widened by the
processor's own conversion (F16C's ``vcvtph2ps``, through LLVM's ``fpext`` from ``half``, which numba does not
expose), subnormals, infinities and NaN included. A rounding computes the normal result, the subnormal one (the
value in whole units of 2^-24 and the top 32 bits of its fraction, by variable shifts) and the special one for
every element and keeps the one its range asks for, with its random bits from the same 32-bit hash as
:func:`~embedding.kernels.rounding.element_random`. The rounding is written in LLVM's IR, in 32-bit integers:
numba widens integer arithmetic to 64 bits, half as many elements a vector instruction, and AVX2 has no 64-bit
multiply. The bits are those of the element-by-element functions, which the tests check.

A row that redid its elements one by one when one of them was outside the common range (zero or subnormal in
float16) took most of a float16 step's time: a row of the benchmark's (uniform in +-1/sqrt(rows)) nearly always
holds a float16 subnormal.

The helpers are inlined into the kernel (``inline="always"``): a call from its parallel loop would count the
references of the array arguments, atomically, once per row.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from embedding.kernels.rounding import BFLOAT16, ROUNDING_HASH

_I32 = ir.IntType(32)


def _constant(value: int) -> Any:
    """An i32 constant of ``value`` (0 to 2^32 - 1), written signed as LLVM reads it."""
    return ir.Constant(_I32, value - (1 << 32) if value >= 1 << 31 else value)


def _min(builder: Any, a: Any, b: Any) -> Any:
    return builder.select(builder.icmp_unsigned("<", a, b), a, b)


def _flag(builder: Any, condition: Any, value: int) -> Any:
    """``value`` where ``condition`` holds, else 0."""
    return builder.select(condition, _constant(value), _constant(0))


def _random32(builder: Any, base: Any, element: Any) -> Any:
    """:func:`~embedding.kernels.rounding.element_random`'s 32 bits, in i32 arithmetic."""
    low = builder.trunc(base, _I32)
    high = builder.trunc(builder.lshr(base, ir.Constant(ir.IntType(64), 32)), _I32)
    value = builder.add(low, builder.mul(builder.trunc(element, _I32), _constant(ROUNDING_HASH[0])))
    value = builder.xor(value, builder.lshr(value, _constant(16)))
    value = builder.xor(builder.mul(value, _constant(ROUNDING_HASH[1])), high)
    value = builder.xor(value, builder.lshr(value, _constant(15)))
    value = builder.mul(value, _constant(ROUNDING_HASH[2]))
    return builder.xor(value, builder.lshr(value, _constant(15)))


def _round_float16(builder: Any, bits: Any, random: Any) -> Any:
    """:func:`~embedding.kernels.rounding.round_stochastically`'s float16 bits of float32 ``bits``, every range
    computed and the value's kept. Under 2^-14 the value is taken in units of 2^-24: its whole units and the top
    32 bits of its fraction (the variable shifts of AVX2), rounded up when the random bits carry out of the
    fraction."""
    magnitude = builder.and_(bits, _constant(0x7FFFFFFF))
    sign = builder.and_(builder.lshr(bits, _constant(16)), _constant(0x8000))
    exponent = builder.lshr(magnitude, _constant(23))
    mantissa = builder.and_(magnitude, _constant(0x7FFFFF))
    normal = builder.add(magnitude, builder.lshr(random, _constant(19)))
    normal = builder.sub(builder.lshr(normal, _constant(13)), _constant(112 << 10))  # float32's bias less float16's

    has_exponent = builder.icmp_unsigned("!=", exponent, _constant(0))
    full = builder.or_(mantissa, _flag(builder, has_exponent, 0x800000))  # the implicit bit
    dropped = builder.sub(_constant(126), builder.select(has_exponent, exponent, _constant(1)))  # 14 and up here
    whole = builder.lshr(full, _min(builder, dropped, _constant(31)))
    near = builder.shl(full, _min(builder, builder.sub(_constant(32), dropped), _constant(31)))
    far = builder.lshr(full, _min(builder, builder.sub(dropped, _constant(32)), _constant(31)))
    fraction = builder.select(builder.icmp_unsigned("<=", dropped, _constant(32)), near, far)
    carry = builder.zext(builder.icmp_unsigned(">", random, builder.not_(fraction)), _I32)
    subnormal = builder.add(whole, carry)

    is_nan = builder.and_(
        builder.icmp_unsigned("==", exponent, _constant(255)), builder.icmp_unsigned("!=", mantissa, _constant(0))
    )
    special = builder.or_(_constant(0x7C00), _flag(builder, is_nan, 0x200))  # infinity, or a quiet NaN
    rounded = builder.select(builder.icmp_unsigned("<", magnitude, _constant(0x38800000)), subnormal, normal)
    rounded = builder.select(builder.icmp_unsigned("<", magnitude, _constant(0x47800000)), rounded, special)
    return builder.or_(sign, rounded)


def _round_bfloat16(builder: Any, bits: Any, random: Any) -> Any:
    """:func:`~embedding.kernels.rounding.round_stochastically`'s bfloat16 bits of float32 ``bits``."""
    magnitude = builder.and_(bits, _constant(0x7FFFFFFF))
    sign = builder.and_(builder.lshr(bits, _constant(16)), _constant(0x8000))
    rounded = builder.lshr(builder.add(magnitude, builder.lshr(random, _constant(16))), _constant(16))
    is_nan = builder.icmp_unsigned("!=", builder.and_(magnitude, _constant(0x7FFFFF)), _constant(0))
    special = builder.or_(builder.lshr(magnitude, _constant(16)), _flag(builder, is_nan, 0x40))
    finite = builder.icmp_unsigned("<", magnitude, _constant(0x7F800000))
    return builder.or_(sign, builder.select(finite, rounded, special))


def _rounding_intrinsic(round_bits: Any) -> Any:
    """An intrinsic ``(bits, base, element)``: float32 ``bits`` (uint32) rounded with element ``element``'s random
    bits from ``base`` by ``round_bits``, as uint32."""

    def rounding(typingctx: Any, bits: Any, base: Any, element: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            value, row_base, index = args
            return round_bits(builder, builder.trunc(value, _I32), _random32(builder, row_base, index))

        return types.uint32(bits, base, element), codegen

    return intrinsic(rounding)


_to_float16 = _rounding_intrinsic(_round_float16)
_to_bfloat16 = _rounding_intrinsic(_round_bfloat16)


@intrinsic  # type: ignore[untyped-decorator]
def float16_to_float32(typingctx: Any, bits: Any) -> Any:
    """The float32 value of float16 ``bits`` (an unsigned integer's low 16): LLVM's ``fpext`` from ``half``, which
    it lowers to the processor's conversion (F16C) and vectorises; exact for every pattern, NaN staying NaN."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        low = builder.trunc(args[0], ir.IntType(16)) if bits.bitwidth > 16 else args[0]
        return builder.fpext(builder.bitcast(low, ir.HalfType()), ir.FloatType())

    return types.float32(bits), codegen


@intrinsic  # type: ignore[untyped-decorator]
def bfloat16_to_float32(typingctx: Any, bits: Any) -> Any:
    """The float32 value of bfloat16 ``bits`` (an unsigned integer's low 16): the bits moved up by 16."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        low = builder.trunc(args[0], ir.IntType(16)) if bits.bitwidth > 16 else args[0]
        return builder.bitcast(builder.shl(builder.zext(low, _I32), _constant(16)), ir.FloatType())

    return types.float32(bits), codegen


@njit(cache=True, inline="always")
def widen_row(weight_bits, row, out, kind):  # type: ignore[no-untyped-def]
    """``out[0]`` = the float32 values of ``weight_bits[row]`` (float16 or bfloat16 bits, uint16)."""
    if kind == BFLOAT16:
        for d in range(out.shape[1]):
            out[0, d] = bfloat16_to_float32(weight_bits[row, d])
    else:
        for d in range(out.shape[1]):
            out[0, d] = float16_to_float32(weight_bits[row, d])


@njit(cache=True, inline="always")
def round_row(values, weight_bits, row, base, kind):  # type: ignore[no-untyped-def]
    """``weight_bits[row]`` = the float32 bits ``values[0]`` (uint32) rounded stochastically, element ``d`` with the
    random bits :func:`~embedding.kernels.rounding.element_random` gives it from ``base``: the bits
    :func:`~embedding.kernels.rounding.round_stochastically` gives, without its branches."""
    if kind == BFLOAT16:
        for d in range(values.shape[1]):
            weight_bits[row, d] = _to_bfloat16(values[0, d], base, d)
    else:
        for d in range(values.shape[1]):
            weight_bits[row, d] = _to_float16(values[0, d], base, d)
