"""Compiled memory hints and raw pointers for the CPU kernels: LLVM's prefetch, which numba does not expose, and a
float32 pointer at an address, through which a kernel reads gradient rows where autograd left them.

A prefetch is a hint: it never faults and changes no value, so a kernel's results do not depend on these; its
time does (see :mod:`embedding.kernels.cpu`). They are inlined (``inline="always"``) like the kernel's other
helpers, so that the parallel loop counts no references.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

FLOATS_PER_CACHE_LINE = 16
"""Floats per 64-byte cache line: a row is prefetched one line at a time."""


@njit(cache=True, inline="always")
def prefetch_row_for_write(matrix, row):  # type: ignore[no-untyped-def]
    """Prefetch every cache line of ``matrix[row]``."""
    for column in range(0, matrix.shape[1], FLOATS_PER_CACHE_LINE):
        prefetch_for_write(matrix, (row, column))


@njit(cache=True, inline="always")
def prefetch_value_for_write(vector, row):  # type: ignore[no-untyped-def]
    """Prefetch the cache line of ``vector[row]``."""
    prefetch_for_write(vector, (row,))


def prefetch_rows_for_write(states: tuple[Any, ...], row: Any) -> None:
    """Prefetch row ``row`` of every array of ``states``, per-row or per-element; compiled only
    (a prefetch is a hint: in Python, where nothing would use it, this does nothing)."""


@overload(prefetch_rows_for_write, inline="always")
def _compiled_prefetch_rows_for_write(states, row):  # type: ignore[no-untyped-def]
    if len(states) == 0:
        return lambda states, row: None
    prefetch_first = prefetch_row_for_write if states[0].ndim == 2 else prefetch_value_for_write

    def prefetch_first_then_rest(states, row):  # type: ignore[no-untyped-def]
        prefetch_first(states[0], row)
        prefetch_rows_for_write(states[1:], row)

    return prefetch_first_then_rest


def _call_prefetch(builder: Any, byte_pointer: Any, for_write: bool) -> None:
    """Emit LLVM's prefetch of the cache line at ``byte_pointer`` (an ``i8*``): read (0) or
    write (1), locality 3 (keep in every cache level), data cache (1)."""
    int32 = ir.IntType(32)
    prefetch_type = ir.FunctionType(ir.VoidType(), [byte_pointer.type, int32, int32, int32])
    prefetch_function = cgutils.get_or_insert_function(builder.module, prefetch_type, "llvm.prefetch.p0")
    builder.call(prefetch_function, [byte_pointer, int32(int(for_write)), int32(3), int32(1)])


def _element_prefetch(for_write: bool) -> Any:
    """An intrinsic ``(array, index)``: LLVM's prefetch hint, for writing or reading, of the cache line of
    ``array[index]``, which numba does not expose. A hint never faults and changes no value."""

    def prefetch(typingctx: Any, array: Any, index: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            array_type, index_type = signature.args
            array_value = context.make_array(array_type)(context, builder, args[0])
            indices = cgutils.unpack_tuple(builder, args[1], count=len(index_type))
            pointer = cgutils.get_item_pointer(context, builder, array_type, array_value, indices)
            _call_prefetch(builder, builder.bitcast(pointer, ir.IntType(8).as_pointer()), for_write=for_write)
            return context.get_dummy_value()

        return types.void(array, index), codegen

    return intrinsic(prefetch)


prefetch_for_write = _element_prefetch(for_write=True)
prefetch_for_read = _element_prefetch(for_write=False)


@intrinsic  # type: ignore[untyped-decorator]
def prefetch_address(typingctx: Any, address: Any) -> Any:
    """LLVM's prefetch hint, for reading, of the cache line at an address (an int64)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        _call_prefetch(builder, builder.inttoptr(args[0], ir.IntType(8).as_pointer()), for_write=False)
        return context.get_dummy_value()

    return types.void(types.int64), codegen


@intrinsic  # type: ignore[untyped-decorator]
def float32_pointer(typingctx: Any, address: Any) -> Any:
    """The float32 pointer at an address (an int64), for ``carray`` to view a gradient row."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], ir.FloatType().as_pointer())

    return types.CPointer(types.float32)(types.int64), codegen
