"""The fused sparse-optimizer step on GPU, as one numba.cuda kernel.

The ids are sorted on the device (stably) so that each row's occurrences form one segment; one
thread block owns one row, its threads striding over the row's elements. Each thread sums its
elements' gradient over the row's occurrences in sorted order: no atomics, and the same result
on every run. A row looked up more than ``_CHUNK`` times (the head of a Zipf batch: one id can
take a tenth of it) would hold its block for all of them while the rest of the GPU idles, so its
occurrences are first summed in chunks, one block each, and its block then sums the chunks'
sums in order: still the same result on every run. An optimizer with a row step (row-wise
Adagrad) needs the whole row's squared gradient, so the row's gradient is kept in shared memory
and one thread sums it in a fixed order.

The kernel is compiled once per optimizer around its update functions (see
:class:`embedding.optimizers.SparseOptimizerSpec`), which it calls for each element and row.

Without a GPU, numba's simulator (``NUMBA_ENABLE_CUDASIM=1``) runs the same kernel on CPU
tensors; it is how the tests run it.

It expects inputs already checked by :func:`embedding.kernels.fused_step`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
import torch
from numba import cuda

from embedding.kernels.common import concatenated, gather, scatter, state_tensors, step_factors, touch_counts
from embedding.kernels.sorted_ids import SortedIds
from embedding.optimizers import SparseOptimizerConfig, SparseOptimizerError, spec_of
from embedding.optimizers.spec import UpdateFunction

# One thread per element up to this many: a narrower block still fills whole warps on the GPU,
# and is faster in the simulator.
_MAX_THREADS_PER_ROW = 256

# Stands for the scales of a step without them; one element, not zero, so that no device array is
# ever a null pointer.
_UNUSED = torch.zeros(1)

_CHUNK = 256
"""The most occurrences of a row one block sums; a row with more is summed in chunks first."""


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
    lr = config.lr if lr is None else lr

    sorted_keys, order = torch.sort(ids, stable=True)
    _, counts = torch.unique_consecutive(sorted_keys, return_counts=True)
    segment_starts = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=ids.device)
    torch.cumsum(counts, dim=0, out=segment_starts[1:])
    chunk_bounds, first_chunk = _chunks(counts, segment_starts)

    row_states, element_states = state_tensors(spec, state)

    dim = weight.size(1)
    threads_per_row = min(_MAX_THREADS_PER_ROW, dim)
    shared_bytes = dim * np.dtype(np.float32).itemsize
    gradient = as_device_array(concatenated(grad_rows))
    scale = as_device_array(_UNUSED.to(weight.device) if grad_scale is None else grad_scale)

    num_chunks = chunk_bounds.size(0)
    chunk_sums = torch.empty((max(num_chunks, 1), dim), dtype=torch.float32, device=weight.device)
    if num_chunks > 0:
        _chunk_sum_kernel[num_chunks, threads_per_row, stream_of(weight)](
            as_device_array(order), as_device_array(chunk_bounds), gradient,
            as_device_array(grad_index), scale, grad_scale is not None, as_device_array(chunk_sums),
        )  # fmt: skip

    per_touch = spec.weight_decay.per_touch if spec.counts_touches else None
    kernel = _step_kernel(spec.update_element, spec.update_row, spec.weight_decay.apply, per_touch)
    kernel[counts.numel(), threads_per_row, stream_of(weight), shared_bytes](
        as_device_array(weight),
        tuple(as_device_array(tensor) for tensor in row_states),
        tuple(as_device_array(tensor) for tensor in element_states),
        as_device_array(touch_counts(spec, state, weight)),
        as_device_array(sorted_keys),
        as_device_array(order),
        as_device_array(segment_starts),
        as_device_array(first_chunk),
        as_device_array(chunk_sums),
        gradient,
        as_device_array(grad_index),
        scale,
        grad_scale is not None,
        *step_factors(spec, config, step, lr),
    )


def _chunks(counts: torch.Tensor, segment_starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunks of the rows with more than ``_CHUNK`` occurrences: each chunk's [begin, end) in
    sorted order, and each row's chunks, ``first_chunk[row]`` to ``first_chunk[row + 1]`` (none for
    a row summed at once)."""
    device = counts.device
    per_row = torch.where(counts > _CHUNK, (counts + _CHUNK - 1) // _CHUNK, 0)
    first_chunk = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(per_row, dim=0, out=first_chunk[1:])
    num_chunks = int(first_chunk[-1])
    row_of_chunk = torch.repeat_interleave(torch.arange(counts.numel(), device=device), per_row)
    position = torch.arange(num_chunks, device=device) - first_chunk[row_of_chunk]
    begin = segment_starts[row_of_chunk] + position * _CHUNK
    end = torch.minimum(begin + _CHUNK, segment_starts[row_of_chunk + 1])
    return torch.stack([begin, end], dim=1), first_chunk


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
def _occurrence_sum(order, begin, end, grad_rows, grad_index, grad_scale, has_grad_scale, d):  # type: ignore[no-untyped-def]
    """Element ``d`` of the gradient summed over the sorted occurrences ``begin`` to ``end``."""
    grad = numba.float32(0)
    for position in range(begin, end):
        k = order[position]
        if has_grad_scale:
            grad += grad_scale[k] * grad_rows[grad_index[k], d]
        else:
            grad += grad_rows[grad_index[k], d]
    return grad


@cuda.jit
def _chunk_sum_kernel(order, chunk_bounds, grad_rows, grad_index, grad_scale, has_grad_scale, chunk_sums):  # type: ignore[no-untyped-def]
    chunk = cuda.blockIdx.x
    begin, end = chunk_bounds[chunk, 0], chunk_bounds[chunk, 1]
    for d in range(cuda.threadIdx.x, chunk_sums.shape[1], cuda.blockDim.x):
        chunk_sums[chunk, d] = _occurrence_sum(order, begin, end, grad_rows, grad_index, grad_scale, has_grad_scale, d)


@functools.cache
def _step_kernel(
    update_element: UpdateFunction,
    update_row: UpdateFunction | None,
    weight_decay: UpdateFunction,
    decay_per_touch: Callable[[Any, Any], Any] | None,
) -> Any:
    """The fused step compiled around one optimizer's update functions (see
    :class:`embedding.optimizers.SparseOptimizerSpec`), once per process."""
    has_row_step = update_row is not None
    counts_touches = decay_per_touch is not None  # Like has_row_step, compiled in: no branch without counts.

    @cuda.jit
    def fused_step_kernel(  # type: ignore[no-untyped-def]
        weight,
        row_states,
        element_states,
        touches,
        sorted_ids,
        order,
        segment_starts,
        first_chunk,
        chunk_sums,
        grad_rows,
        grad_index,
        grad_scale,
        has_grad_scale,
        decays,
        decay,
        factors,
    ):
        row_grad = cuda.shared.array(0, dtype=numba.float32)
        row_multiplier = cuda.shared.array(1, dtype=numba.float32)

        segment = cuda.blockIdx.x
        begin, end = segment_starts[segment], segment_starts[segment + 1]
        chunks_begin, chunks_end = first_chunk[segment], first_chunk[segment + 1]
        row = sorted_ids[begin]
        dim = weight.shape[1]

        row_decay = decay
        if counts_touches:
            touched = touches[row] + numba.float32(1)
            row_decay = decay_per_touch(decay, touched)  # type: ignore[misc]

        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            if chunks_end > chunks_begin:
                grad = numba.float32(0)
                for chunk in range(chunks_begin, chunks_end):
                    grad += chunk_sums[chunk, d]
            else:
                grad = _occurrence_sum(order, begin, end, grad_rows, grad_index, grad_scale, has_grad_scale, d)

            new_weight = weight[row, d]
            if decays:
                new_weight, grad = weight_decay(new_weight, grad, row_decay)
            if has_row_step:
                weight[row, d] = new_weight
                row_grad[d] = grad  # updated below, once the whole row's gradient is known
            else:
                element_values = gather(element_states, (row, d))
                weight[row, d], element_values = update_element(
                    new_weight, grad, numba.float32(1), element_values, factors
                )
                scatter(element_states, (row, d), element_values)

        if counts_touches:
            cuda.syncthreads()  # Every thread has read the count before it changes.
            if cuda.threadIdx.x == 0:
                touches[row] = touched

        if has_row_step:
            cuda.syncthreads()
            if cuda.threadIdx.x == 0:
                squared = numba.float32(0)
                for d in range(dim):
                    squared += row_grad[d] * row_grad[d]
                row_values = gather(row_states, (row,))
                row_values, multiplier = update_row(row_values, squared / numba.float32(dim), factors)  # type: ignore[misc]
                scatter(row_states, (row,), row_values)
                row_multiplier[0] = multiplier
            cuda.syncthreads()
            for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
                element_values = gather(element_states, (row, d))
                weight[row, d], element_values = update_element(
                    weight[row, d], row_grad[d], row_multiplier[0], element_values, factors
                )
                scatter(element_states, (row, d), element_values)

    return fused_step_kernel
