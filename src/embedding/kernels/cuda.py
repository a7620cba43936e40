"""The fused sparse-optimizer step on GPU, as two numba.cuda kernels.

The ids are sorted on the device (stably; as 32-bit keys where the table allows, half the passes
of a 64-bit sort), so that each row's occurrences form one segment. The sorted positions are then
cut into *units*: a unit ends where its segment ends or at a multiple of ``_CHUNK``, so no unit
holds more than ``_CHUNK`` occurrences. A group of threads (a warp, or fewer lanes for a narrow
row) owns a unit, each lane striding over the row's elements and summing its elements' gradient
over the unit's occurrences in sorted order: no atomics, and the same result on every run.

Most segments are one unit, and their group updates the row at once. A row looked up more than a
chunk's worth (the head of a Zipf batch: one id can take a tenth of it) would otherwise hold one
group for all of its occurrences while the rest of the GPU idles: its units write partial sums
instead, and a second kernel, one block per such row, adds them in order and updates the row:
still the same result on every run. As the cuts fall at fixed multiples of ``_CHUNK`` (not at a
row's own offsets), a unit finds the slot of its partial sum from its start alone, and the second
kernel finds its rows from the sorted ids alone: the step waits for the device once (for the
count of units), not once per stage.

An optimizer with a row step (row-wise Adagrad) needs the whole row's squared gradient: the
row's gradient is kept in shared memory and one thread sums its squares in a fixed order.

The kernels are compiled once per optimizer around its update functions (see
:class:`embedding.optimizers.SparseOptimizerSpec`), which they call for each element and row.
Without a GPU, numba's simulator (``NUMBA_ENABLE_CUDASIM=1``) runs the same kernels on CPU
tensors; it is how the tests run them.

It expects inputs already checked by :func:`embedding.kernels.fused_step`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numba
import torch
from numba import cuda

from embedding.kernels.common import concatenated, gather, scatter, state_tensors, step_factors, touch_counts
from embedding.kernels.sorted_ids import SortedIds
from embedding.optimizers import SparseOptimizerConfig, SparseOptimizerError, spec_of
from embedding.optimizers.spec import UpdateFunction

_CHUNK = 256
"""The most occurrences one unit sums."""

_THREADS_PER_BLOCK = 128
"""Threads of a block of the units' kernel: several groups, so that a block of narrow rows still
fills whole warps."""

_MAX_THREADS_PER_ROW = 256
"""Threads of a block of the long rows' kernel: one thread per element up to this many."""

_WARP = 32


def fused_step(
    config: SparseOptimizerConfig,
    weight: torch.Tensor,
    state: dict[str, torch.Tensor],
    ids: torch.Tensor,
    grad_rows: Sequence[torch.Tensor],
    grad_index: torch.Tensor,
    grad_scale: torch.Tensor | None,
    step: int,
    lr: float | None = None,
    sorted_ids: SortedIds | None = None,
) -> None:
    """Update, in place, the rows of ``weight`` and ``state`` that ``ids`` touches (see
    :func:`embedding.kernels.fused_step`). ``sorted_ids`` is not read: the ids are sorted on the device."""
    if not weight.is_cuda and not numba.config.ENABLE_CUDASIM:
        raise SparseOptimizerError(
            f"`weight` must be on a CUDA device (or NUMBA_ENABLE_CUDASIM=1 be set), but is on {weight.device} instead."
        )
    if ids.numel() == 0:
        return
    spec = spec_of(config)
    num_rows, dim = weight.shape

    sort = SortedIds.of(ids, num_rows)
    keys, order = sort.keys, sort.order
    unit_starts = _unit_starts(keys)
    num_boundaries = (keys.numel() - 1) // _CHUNK
    partial_sums = torch.empty((2 * num_boundaries + 2, dim), dtype=torch.float32, device=weight.device)

    row_states, element_states = state_tensors(spec, state)
    per_touch = spec.weight_decay.per_touch if spec.counts_touches else None
    units_kernel, long_rows_kernel = _kernels(spec.update_element, spec.update_row, spec.weight_decay.apply, per_touch)
    tables = (
        as_device_array(weight),
        tuple(as_device_array(tensor) for tensor in row_states),
        tuple(as_device_array(tensor) for tensor in element_states),
        as_device_array(touch_counts(spec, state, weight)),
        as_device_array(keys),
        as_device_array(partial_sums),
    )
    factors = step_factors(spec, config, step, config.lr if lr is None else lr)
    stream = stream_of(weight)

    lanes = min(_WARP, 1 << (dim - 1).bit_length())  # a power of two: groups never straddle a warp
    groups = max(1, _THREADS_PER_BLOCK // lanes)
    units_kernel[(unit_starts.numel() + groups - 1) // groups, groups * lanes, stream, 4 * groups * (dim + 1)](
        *tables,
        as_device_array(unit_starts),
        as_device_array(order),
        as_device_array(concatenated(grad_rows)),
        as_device_array(grad_index),
        as_device_array(_unused(weight.device) if grad_scale is None else grad_scale),
        grad_scale is not None,
        lanes,
        *factors,
    )
    if num_boundaries > 0:
        long_rows_kernel[num_boundaries, min(_MAX_THREADS_PER_ROW, dim), stream, 4 * (dim + 1)](*tables, *factors)


def _unit_starts(keys: torch.Tensor) -> torch.Tensor:
    """The sorted positions where a unit starts: each segment's first, and every multiple of ``_CHUNK``."""
    starts = torch.empty(keys.numel(), dtype=torch.bool, device=keys.device)
    torch.ne(keys[1:], keys[:-1], out=starts[1:])
    starts[::_CHUNK] = True
    return torch.nonzero(starts).view(-1)


@functools.cache
def _unused(device: torch.device) -> torch.Tensor:
    """Stands for the scales of a step without them; one element, not zero, so that no device
    array is ever a null pointer. Made once per device: a copy to the device each step would wait."""
    return torch.zeros(1, device=device)


def as_device_array(tensor: torch.Tensor) -> object:
    """A zero-copy numba view of a CUDA tensor; under the simulator, the numpy view of a CPU
    tensor, which the simulator copies in and writes back around the launch."""
    if tensor.is_cuda:
        return cuda.as_cuda_array(tensor.detach())
    return tensor.detach().numpy()


def stream_of(tensor: torch.Tensor) -> object:
    """torch's current stream, so the kernel runs after the torch work that fed it."""
    if tensor.is_cuda:
        return cuda.external_stream(torch.cuda.current_stream(tensor.device).cuda_stream)
    return 0


@cuda.jit(device=True)
def _occurrence(order, position, grad_rows, grad_index, grad_scale, has_grad_scale, d):  # type: ignore[no-untyped-def]
    """Element ``d`` of the gradient of the occurrence at sorted ``position``."""
    k = order[position]
    if has_grad_scale:
        return grad_scale[k] * grad_rows[grad_index[k], d]
    return grad_rows[grad_index[k], d]


@cuda.jit(device=True)
def _occurrence_sum(order, begin, end, grad_rows, grad_index, grad_scale, has_grad_scale, d):  # type: ignore[no-untyped-def]
    """Element ``d`` of the gradient summed over the sorted occurrences ``begin`` to ``end``, in
    order; four at a time, so that four loads are in flight where one would leave the lane waiting."""
    grad = numba.float32(0)
    position = begin
    while position + 4 <= end:
        g0 = _occurrence(order, position, grad_rows, grad_index, grad_scale, has_grad_scale, d)
        g1 = _occurrence(order, position + 1, grad_rows, grad_index, grad_scale, has_grad_scale, d)
        g2 = _occurrence(order, position + 2, grad_rows, grad_index, grad_scale, has_grad_scale, d)
        g3 = _occurrence(order, position + 3, grad_rows, grad_index, grad_scale, has_grad_scale, d)
        grad += g0
        grad += g1
        grad += g2
        grad += g3
        position += 4
    while position < end:
        grad += _occurrence(order, position, grad_rows, grad_index, grad_scale, has_grad_scale, d)
        position += 1
    return grad


@cuda.jit(device=True)
def _partial_sum(partial_sums, first_boundary, last_boundary, d):  # type: ignore[no-untyped-def]
    """Element ``d`` of a long row's gradient: its first unit's partial sum (slot ``2 * b + 1``
    for the row's first boundary ``b``), then those of the units starting at each boundary it
    spans (slot ``2 * b``), in order; four loads in flight at a time."""
    grad = partial_sums[2 * first_boundary + 1, d]
    boundary = first_boundary
    while boundary + 4 <= last_boundary + 1:
        s0 = partial_sums[2 * boundary, d]
        s1 = partial_sums[2 * boundary + 2, d]
        s2 = partial_sums[2 * boundary + 4, d]
        s3 = partial_sums[2 * boundary + 6, d]
        grad += s0
        grad += s1
        grad += s2
        grad += s3
        boundary += 4
    while boundary <= last_boundary:
        grad += partial_sums[2 * boundary, d]
        boundary += 1
    return grad


@cuda.jit(device=True)
def _segment_end(keys, start):  # type: ignore[no-untyped-def]
    """The first sorted position after ``start`` whose key differs from the one at ``start``."""
    low, high = start, keys.shape[0]
    while low < high:
        middle = (low + high) // 2
        if keys[middle] == keys[start]:
            low = middle + 1
        else:
            high = middle
    return low


@functools.cache
def _kernels(
    update_element: UpdateFunction,
    update_row: UpdateFunction | None,
    weight_decay: UpdateFunction,
    decay_per_touch: Callable[[Any, Any], Any] | None,
) -> tuple[Any, Any]:
    """The units' and the long rows' kernels compiled around one optimizer's update functions (see
    :class:`embedding.optimizers.SparseOptimizerSpec`), once per process."""
    has_row_step = update_row is not None
    counts_touches = decay_per_touch is not None  # Like has_row_step, compiled in: no branch without counts.

    @cuda.jit(device=True)
    def row_decay_of(touches, row, decay):  # type: ignore[no-untyped-def]
        """The row's touch count after this step, and its weight decay."""
        if counts_touches:
            touched = touches[row] + numba.float32(1)
            return touched, decay_per_touch(decay, touched)  # type: ignore[misc]
        return numba.float32(0), decay

    @cuda.jit(device=True)
    def update_element_of(weight, element_states, shared, base, row, d, grad, decays, row_decay, factors):  # type: ignore[no-untyped-def]
        """Element ``d``'s decay and, without a row step, its update; with one, its gradient
        waits in ``shared`` for the row's."""
        new_weight = weight[row, d]
        if decays:
            new_weight, grad = weight_decay(new_weight, grad, row_decay)
        if has_row_step:
            weight[row, d] = new_weight
            shared[base + d] = grad
        else:
            element_values = gather(element_states, (row, d))
            weight[row, d], element_values = update_element(new_weight, grad, numba.float32(1), element_values, factors)
            scatter(element_states, (row, d), element_values)

    @cuda.jit(device=True)
    def finish_rows(  # type: ignore[no-untyped-def]
        weight, row_states, element_states, touches, shared, groups, group, lane, lanes, updating, row, touched, factors
    ):
        """The row step of each group's row, then its touch count. Every thread of the block
        calls it (it holds barriers); ``updating`` says whether this thread's group has a row."""
        dim = weight.shape[1]
        base = group * dim
        if has_row_step:
            cuda.syncthreads()  # The row's whole gradient is in shared memory.
            if updating and lane == 0:
                squared = numba.float32(0)
                for d in range(dim):
                    squared += shared[base + d] * shared[base + d]
                row_values = gather(row_states, (row,))
                row_values, multiplier = update_row(row_values, squared / numba.float32(dim), factors)  # type: ignore[misc]
                scatter(row_states, (row,), row_values)
                shared[groups * dim + group] = multiplier
            cuda.syncthreads()
            if updating:
                multiplier = shared[groups * dim + group]
                for d in range(lane, dim, lanes):
                    element_values = gather(element_states, (row, d))
                    weight[row, d], element_values = update_element(
                        weight[row, d], shared[base + d], multiplier, element_values, factors
                    )
                    scatter(element_states, (row, d), element_values)
        if counts_touches:
            cuda.syncthreads()  # Every thread has read the count before it changes.
            if updating and lane == 0:
                touches[row] = touched

    @cuda.jit
    def units_kernel(  # type: ignore[no-untyped-def]
        weight, row_states, element_states, touches, keys, partial_sums,
        unit_starts, order, grad_rows, grad_index, grad_scale, has_grad_scale, lanes, decays, decay, factors,
    ):  # fmt: skip
        shared = cuda.shared.array(0, dtype=numba.float32)
        groups = cuda.blockDim.x // lanes
        group = cuda.threadIdx.x // lanes
        lane = cuda.threadIdx.x - group * lanes
        unit = cuda.blockIdx.x * groups + group
        num_units, num_ids = unit_starts.shape[0], keys.shape[0]

        updating = False
        row = numba.int64(0)  # int64 whatever the keys' type: the state arrays are indexed by (row, d)
        touched = numba.float32(0)
        if unit < num_units:
            begin = unit_starts[unit]
            end = unit_starts[unit + 1] if unit + 1 < num_units else num_ids
            row = numba.int64(keys[begin])
            first = begin == 0 or keys[begin - 1] != row
            updating = first and (end == num_ids or keys[end] != row)
            if updating:
                touched, row_decay = row_decay_of(touches, row, decay)
                for d in range(lane, weight.shape[1], lanes):
                    grad = _occurrence_sum(order, begin, end, grad_rows, grad_index, grad_scale, has_grad_scale, d)
                    update_element_of(
                        weight, element_states, shared, group * weight.shape[1], row, d, grad, decays, row_decay,
                        factors,
                    )  # fmt: skip
            else:
                # A long row's first unit ends at the next boundary, the others start at one.
                slot = 2 * (begin // _CHUNK + 1) + 1 if first else 2 * (begin // _CHUNK)
                for d in range(lane, weight.shape[1], lanes):
                    partial_sums[slot, d] = _occurrence_sum(
                        order, begin, end, grad_rows, grad_index, grad_scale, has_grad_scale, d
                    )
        finish_rows(
            weight, row_states, element_states, touches, shared, groups, group, lane, lanes, updating, row, touched,
            factors,
        )  # fmt: skip

    @cuda.jit
    def long_rows_kernel(  # type: ignore[no-untyped-def]
        weight, row_states, element_states, touches, keys, partial_sums, decays, decay, factors
    ):
        shared = cuda.shared.array(0, dtype=numba.float32)
        boundary = cuda.blockIdx.x + 1
        start = boundary * _CHUNK
        row = numba.int64(keys[start])
        if keys[start - 1] != row or (boundary > 1 and keys[start - _CHUNK - 1] == row):
            return  # No row spans this boundary, or it spans an earlier one too, whose block updates it.
        last_boundary = (_segment_end(keys, start) - 1) // _CHUNK
        touched, row_decay = row_decay_of(touches, row, decay)
        for d in range(cuda.threadIdx.x, weight.shape[1], cuda.blockDim.x):
            grad = _partial_sum(partial_sums, boundary, last_boundary, d)
            update_element_of(weight, element_states, shared, 0, row, d, grad, decays, row_decay, factors)
        finish_rows(
            weight, row_states, element_states, touches, shared, 1, 0, cuda.threadIdx.x, cuda.blockDim.x, True, row,
            touched, factors,
        )  # fmt: skip

    return units_kernel, long_rows_kernel
