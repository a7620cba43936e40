"""The fused step's two numba.cuda kernels (see :mod:`embedding.kernels.cuda` for how a step runs them).

**Units.** Each group of lanes (a warp, or fewer lanes for a narrow row) takes units in turn,
round after round over the whole grid (every thread makes the same number of rounds, so that the
lanes of a warp always meet at its shuffles). Each lane owns every ``lanes``-th element of the row
and keeps them in registers; it sums their gradient over the unit's occurrences in sorted order,
``OCCURRENCES_AT_ONCE`` occurrences at a time with no branch between their loads, so that it waits
on all of them at once rather than on one after the other. The row's weights and state are read
ahead, while the gradient loads are in flight. A unit that is its row's whole segment updates the
row. The units of a longer row write partial sums instead (slot ``2 * b + 1`` for the row's first
unit, which ends at boundary ``b``; slot ``2 * b`` for the unit starting at boundary ``b``), and
the row's first unit adds the row's first boundary to a list.

**Long rows.** Each block takes rows of that list in turn and adds the row's partial sums: slice
``s`` of its threads sums the partial sums numbered ``s``, ``s + slices``, ... (number 0 is the
first unit's, number ``i`` that of the unit starting at the row's ``i``-th boundary); the first
slice adds the slices' sums in order and updates the row.

No atomics touch a sum: every run adds the same numbers in the same order, and gives the same
bits. A row step (row-wise Adagrad) needs the row's squared gradient: each lane squares its own
elements and the group adds the lanes' sums by warp shuffles, in a fixed order.

**Half-precision rows.** A float16 or bfloat16 table's rows are read as their bits, widened to float32 in
registers, and rounded stochastically as they are written (:mod:`embedding.kernels.rounding`), with the random bits
of each element a function of the step, the row's table and global row (a hash table's: the id its slot holds, read
from the index's array on the device), and the element: the CPU kernel's bits.

The simulator (``NUMBA_ENABLE_CUDASIM=1``) has no warp shuffles or warp barriers: there, lanes
exchange values through shared memory between block barriers, adding in the same order. Nor does it have
libdevice's bit casts between float32 and int32: there numpy's views stand in for them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import cuda
from numba.cuda import libdevice

from embedding.kernels.common import gather, scatter
from embedding.kernels.rounding import FLOAT32, element_random, round_stochastically, row_key, row_random_base, widen
from embedding.optimizers.optimizer_spec import UpdateFunction

CHUNK = 256
"""The most occurrences one unit sums."""

OCCURRENCES_AT_ONCE = 2
"""The occurrences a lane loads before it adds any of them."""

_FULL_MASK = 0xFFFFFFFF


@cuda.jit(device=True)
def _shuffled(value, offset, scratch):  # type: ignore[no-untyped-def]
    """The ``value`` of the lane whose index differs from this one's in the bits of ``offset``.
    Every lane of the warp calls it."""
    return cuda.shfl_xor_sync(_FULL_MASK, value, offset)


@cuda.jit(device=True)
def _shuffled_in_simulator(value, offset, scratch):  # type: ignore[no-untyped-def]
    """:func:`_shuffled` through shared memory; every thread of the block calls it."""
    thread = cuda.threadIdx.x
    scratch[thread] = value
    cuda.syncthreads()
    other = scratch[thread ^ offset]
    cuda.syncthreads()
    return other


@cuda.jit(device=True)
def _lanes_synchronized():  # type: ignore[no-untyped-def]
    """Every lane of the warp has come this far."""
    cuda.syncwarp(_FULL_MASK)


@cuda.jit(device=True)
def _lanes_synchronized_in_simulator():  # type: ignore[no-untyped-def]
    cuda.syncthreads()


@cuda.jit(device=True)
def _float_of_bits(bits):  # type: ignore[no-untyped-def]
    """The float32 whose bits are ``bits`` (uint32)."""
    return libdevice.int_as_float(numba.int32(bits))


@cuda.jit(device=True)
def _bits_of_float(value):  # type: ignore[no-untyped-def]
    """The bits (uint32) of the float32 ``value``."""
    return numba.uint32(libdevice.float_as_int(value))


def _float_of_bits_in_simulator(bits):  # type: ignore[no-untyped-def]
    return np.uint32(bits).view(np.float32)


def _bits_of_float_in_simulator(value):  # type: ignore[no-untyped-def]
    return np.float32(value).view(np.uint32)


if numba.config.ENABLE_CUDASIM:
    _shuffled, _lanes_synchronized = _shuffled_in_simulator, _lanes_synchronized_in_simulator
    _float_of_bits, _bits_of_float = _float_of_bits_in_simulator, _bits_of_float_in_simulator


# A row's loads and stores, by its dtype: float32 as it is; float16 and bfloat16 (``kind``) as bits, widened on
# load and rounded stochastically on store with the row's random ``base``, drawn once a row (:func:`_row_base`).


@cuda.jit(device=True)
def _load_float32(weight, row, d, kind):  # type: ignore[no-untyped-def]
    return weight[row, d]


@cuda.jit(device=True)
def _store_float32(weight, row, d, value, base, kind):  # type: ignore[no-untyped-def]
    weight[row, d] = value


@cuda.jit(device=True)
def _base_float32(row, salts, ends, bases, slot_ids, step):  # type: ignore[no-untyped-def]
    return numba.uint64(0)


@cuda.jit(device=True)
def _load_half(weight, row, d, kind):  # type: ignore[no-untyped-def]
    return _float_of_bits(widen(weight[row, d], kind))


@cuda.jit(device=True)
def _store_half(weight, row, d, value, base, kind):  # type: ignore[no-untyped-def]
    weight[row, d] = round_stochastically(_bits_of_float(value), element_random(base, d), kind)


@cuda.jit(device=True)
def _base_half(row, salts, ends, bases, slot_ids, step):  # type: ignore[no-untyped-def]
    salt, key = row_key(row, ends, bases, salts, slot_ids)
    return row_random_base(salt, step, key)


SIMULATOR_SCRATCH_FLOATS_PER_THREAD = 1 if numba.config.ENABLE_CUDASIM else 0
"""The units' kernel's shared memory: the simulator's shuffles go through it."""


@cuda.jit(device=True)
def _lanes_sum(value, lanes, scratch):  # type: ignore[no-untyped-def]
    """The sum of ``value`` over a group's ``lanes`` lanes, every lane getting the same bits (a
    butterfly: the same additions in the same order on every run)."""
    offset = lanes // 2
    while offset > 0:
        value += _shuffled(value, offset, scratch)
        offset //= 2
    return value


@cuda.jit(device=True)
def _segment_end(keys, num_ids, start):  # type: ignore[no-untyped-def]
    """The first sorted position after ``start`` whose key differs from the one at ``start``."""
    low, high = start, num_ids
    while low < high:
        middle = (low + high) // 2
        if keys[middle] == keys[start]:
            low = middle + 1
        else:
            high = middle
    return low


@cuda.jit(device=True)
def _in_bounds(bounds, num_rows, num_grad_rows):  # type: ignore[no-untyped-def]
    """Whether the step's ids and gradient indices (their lowest and highest, ``bounds``) are all in range:
    the host checks the same bounds after the launch, and raises, but no kernel may write first."""
    return bounds[0] >= 0 and bounds[1] < num_rows and bounds[2] >= 0 and bounds[3] < num_grad_rows


@functools.cache
def compiled(
    update_element: UpdateFunction,
    update_row: UpdateFunction | None,
    weight_decay: UpdateFunction,
    decay_per_touch: Callable[[Any, Any], Any] | None,
    elements: int,
    rows_kind: int = FLOAT32,
) -> tuple[Any, Any]:
    """The units' and the long rows' kernels compiled around one optimizer's update functions (see
    :class:`embedding.optimizers.SparseOptimizerSpec`), the count of a row's elements each lane
    owns (so that they fit in registers) and the rows' dtype, once per process, count and dtype."""
    has_row_step = update_row is not None
    half = rows_kind != FLOAT32
    load, store = (_load_half, _store_half) if half else (_load_float32, _store_float32)
    row_base = _base_half if half else _base_float32
    counts_touches = decay_per_touch is not None  # Like has_row_step, compiled in: no branch without counts.

    @cuda.jit(device=True)
    def row_decay_of(touches, row, decay):  # type: ignore[no-untyped-def]
        """The row's touch count after this step, and its weight decay."""
        if counts_touches:
            touched = touches[row] + numba.float32(1)
            return touched, decay_per_touch(decay, touched)  # type: ignore[misc]
        return numba.float32(0), decay

    @cuda.jit(device=True)
    def update_at(weight, element_states, row, d, old_weight, grad, multiplier, factors, base):  # type: ignore[no-untyped-def]
        element_values = gather(element_states, (row, d))
        new_weight, element_values = update_element(old_weight, grad, multiplier, element_values, factors)
        store(weight, row, d, new_weight, base, rows_kind)
        scatter(element_states, (row, d), element_values)

    @cuda.jit(device=True)
    def sum_occurrences(grad, sorted_rows, sorted_scales, has_grad_scale, grad_rows, begin, end, lane, lanes):  # type: ignore[no-untyped-def]
        """Adds to ``grad`` (the lane's elements) the gradient rows of sorted occurrences ``begin``
        to ``end``, in order. Past the end, a lane loads the last occurrence again and adds nothing of it."""
        dim = grad_rows.shape[1]
        rows = cuda.local.array(OCCURRENCES_AT_ONCE, numba.int64)
        scales = cuda.local.array(OCCURRENCES_AT_ONCE, numba.float32)
        values = cuda.local.array((OCCURRENCES_AT_ONCE, elements), numba.float32)
        position = begin
        while position < end:
            for u in range(OCCURRENCES_AT_ONCE):
                at = min(position + u, end - 1)
                rows[u] = sorted_rows[at]
                scales[u] = sorted_scales[at] if has_grad_scale else numba.float32(1)
            for u in range(OCCURRENCES_AT_ONCE):
                for j in range(elements):
                    values[u, j] = grad_rows[rows[u], min(lane + j * lanes, dim - 1)]
            for u in range(OCCURRENCES_AT_ONCE):
                if position + u < end:
                    for j in range(elements):
                        grad[j] += scales[u] * values[u, j] if has_grad_scale else values[u, j]
            position += OCCURRENCES_AT_ONCE

    @cuda.jit
    def units_kernel(  # type: ignore[no-untyped-def]
        weight, row_states, element_states, touches, keys, partial_sums, long_rows, num_long_rows, num_ids,
        unit_starts, unit_numbers, sorted_rows, sorted_scales, has_grad_scale, grad_rows, bounds, lanes, decays,
        decay, factors, salts, ends, bases, slot_ids, step,
    ):  # fmt: skip
        if not _in_bounds(bounds, weight.shape[0], grad_rows.shape[0]):
            return
        scratch = cuda.shared.array(0, dtype=numba.float32)
        dim = weight.shape[1]
        groups = cuda.blockDim.x // lanes
        group = cuda.threadIdx.x // lanes
        lane = cuda.threadIdx.x - group * lanes
        num_units = unit_numbers[num_ids - 1]
        weights = cuda.local.array(elements, numba.float32)
        grad = cuda.local.array(elements, numba.float32)

        all_groups = cuda.gridDim.x * groups
        for first_unit in range(0, num_units, all_groups):
            unit = first_unit + cuda.blockIdx.x * groups + group
            begin, end = numba.int64(0), numba.int64(0)
            row = numba.int64(0)  # int64 whatever the keys' type: the state arrays are indexed by (row, d)
            first = updating = False
            if unit < num_units:
                begin = unit_starts[unit + 1]  # (1-based: see the workspace)
                end = unit_starts[unit + 2] if unit + 1 < num_units else num_ids
                row = numba.int64(keys[begin])
                first = begin == 0 or keys[begin - 1] != row
                updating = first and (end == num_ids or keys[end] != row)

            # Read ahead, while the gradient loads are in flight (a group without a row reads row 0, unused).
            touched, row_decay = row_decay_of(touches, row, decay)
            row_values = gather(row_states, (row,))
            for j in range(elements):
                weights[j] = (
                    load(weight, row, min(lane + j * lanes, dim - 1), rows_kind) if updating else numba.float32(0)
                )
                grad[j] = numba.float32(0)

            sum_occurrences(grad, sorted_rows, sorted_scales, has_grad_scale, grad_rows, begin, end, lane, lanes)

            if updating and decays:
                for j in range(elements):
                    weights[j], grad[j] = weight_decay(weights[j], grad[j], row_decay)
            multiplier = numba.float32(1)
            if has_row_step:
                squared = numba.float32(0)
                for j in range(elements):
                    if lane + j * lanes < dim:
                        squared += grad[j] * grad[j]
                squared = _lanes_sum(squared, lanes, scratch)
                row_values, multiplier = update_row(row_values, squared / numba.float32(dim), factors)  # type: ignore[misc]
            _lanes_synchronized()  # Every lane has read the row's state and count before they change.
            if updating:
                base = row_base(row, salts, ends, bases, slot_ids, step)
                for j in range(elements):
                    d = lane + j * lanes
                    if d < dim:
                        update_at(weight, element_states, row, d, weights[j], grad[j], multiplier, factors, base)
                if lane == 0:
                    scatter(row_states, (row,), row_values)
                    if counts_touches:
                        touches[row] = touched
            elif unit < num_units:
                slot = 2 * (begin // CHUNK + 1) + 1 if first else 2 * (begin // CHUNK)
                for j in range(elements):
                    d = lane + j * lanes
                    if d < dim:
                        partial_sums[slot, d] = grad[j]
                if first and lane == 0:
                    long_rows[cuda.atomic.add(num_long_rows, 0, 1)] = begin // CHUNK + 1

    @cuda.jit(device=True)
    def partial_sum(partial_sums, boundary, count, number, slices, d):  # type: ignore[no-untyped-def]
        """Element ``d`` of the partial sums numbered ``number``, ``number + slices``, ... below
        ``count`` of the long row whose first boundary is ``boundary``, added in order, four loads at a time."""
        grad = numba.float32(0)
        if number == 0:
            grad = partial_sums[2 * boundary + 1, d]
            number += slices
        slot, step = 2 * (boundary + number - 1), 2 * slices
        while number + 3 * slices < count:
            s0 = partial_sums[slot, d]
            s1 = partial_sums[slot + step, d]
            s2 = partial_sums[slot + 2 * step, d]
            s3 = partial_sums[slot + 3 * step, d]
            grad += s0
            grad += s1
            grad += s2
            grad += s3
            number += 4 * slices
            slot += 4 * step
        while number < count:
            grad += partial_sums[slot, d]
            number += slices
            slot += step
        return grad

    @cuda.jit
    def long_rows_kernel(  # type: ignore[no-untyped-def]
        weight, row_states, element_states, touches, keys, partial_sums, long_rows, num_long_rows, num_ids,
        columns, decays, decay, factors, salts, ends, bases, slot_ids, step,
    ):  # fmt: skip
        shared = cuda.shared.array(0, dtype=numba.float32)
        dim = weight.shape[1]
        slices = cuda.blockDim.x // columns
        piece = cuda.threadIdx.x // columns
        column = cuda.threadIdx.x - piece * columns
        # After the slices' sums: the columns' squares, the multiplier, and the row's weights (decayed), which
        # stay here until the update writes them once (a half-precision row must be rounded once).
        squares_at, multiplier_at, weights_at = slices * dim, slices * dim + columns, slices * dim + columns + 1
        for index in range(cuda.blockIdx.x, num_long_rows[0], cuda.gridDim.x):
            boundary = long_rows[index]
            row = numba.int64(keys[boundary * CHUNK])
            count = (_segment_end(keys, num_ids, boundary * CHUNK) - 1) // CHUNK - boundary + 2
            for d in range(column, dim, columns):
                shared[piece * dim + d] = partial_sum(partial_sums, boundary, count, piece, slices, d)
            cuda.syncthreads()
            touched, row_decay = row_decay_of(touches, row, decay)
            if piece == 0:
                squared = numba.float32(0)
                for d in range(column, dim, columns):
                    grad = shared[d]
                    for other in range(1, slices):
                        grad += shared[other * dim + d]
                    new_weight = load(weight, row, d, rows_kind)
                    if decays:
                        new_weight, grad = weight_decay(new_weight, grad, row_decay)
                    shared[weights_at + d] = new_weight
                    shared[d] = grad
                    squared += grad * grad
                shared[squares_at + column] = squared
            cuda.syncthreads()
            if has_row_step and cuda.threadIdx.x == 0:
                squared = numba.float32(0)
                for other in range(columns):
                    squared += shared[squares_at + other]
                row_values, multiplier = update_row(gather(row_states, (row,)), squared / numba.float32(dim), factors)  # type: ignore[misc]
                scatter(row_states, (row,), row_values)
                shared[multiplier_at] = multiplier
            cuda.syncthreads()
            if piece == 0:
                multiplier = shared[multiplier_at] if has_row_step else numba.float32(1)
                base = row_base(row, salts, ends, bases, slot_ids, step)
                for d in range(column, dim, columns):
                    new_weight = shared[weights_at + d]
                    update_at(weight, element_states, row, d, new_weight, shared[d], multiplier, factors, base)
                if counts_touches and cuda.threadIdx.x == 0:
                    touches[row] = touched
            cuda.syncthreads()  # The next row's sums may take the shared memory.

    return units_kernel, long_rows_kernel
