"""The fused sparse-optimizer step on CPU, as one parallel numba kernel.

The ids are sorted (stably) so that the occurrences of each row form one segment; threads then
take whole rows, so no two threads ever write the same row and no atomics are needed. Each row's
gradient is summed in float32, like torch, in the sorted occurrence order: the result is the
same whatever the number of threads, and bitwise the same from run to run.

The touched rows are scattered over tables far larger than the caches, and so are the gradient
rows each occurrence reads, so the kernel waits on memory, not on arithmetic. A row's update is
too long for the processor to look ahead to the next row's loads by itself: the kernel
prefetches the rows it will update a few segments ahead and the gradient rows it will read a few
occurrences ahead, which halves its time on a 1,000,000-row table.

The gradient rows come in pieces, one per feature as autograd hands them back; the kernel reads
them where they are, through their addresses, rather than from a concatenated copy. It first lists,
in parallel, the address of each occurrence's gradient row in sorted order, so that the loop over
rows reads its next addresses one after the other instead of through three dependent lookups.

The kernel is compiled once per optimizer around its update functions (see
:class:`embedding.optimizers.SparseOptimizerSpec`), which it calls for each element and row with
scalars: a call that took arrays would count their references, as the helpers below explain.

It expects inputs checked by :func:`embedding.kernels.check_step_inputs` but for the ranges of the ids and
gradient indices, which its first pass checks before any write.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
import torch
from numba import carray, njit, prange

from embedding import compiled_source
from embedding.kernels.common import check_step_ranges, gather, scatter, state_tensors, step_factors, touch_counts
from embedding.kernels.half_rows import round_row, widen_row
from embedding.kernels.prefetch import (
    float32_pointer,
    prefetch_address,
    prefetch_for_read,
    prefetch_row_for_write,
    prefetch_rows_for_write,
)
from embedding.kernels.rounding import FLOAT32, RowKeys, kind_of, round_stochastically, row_key, row_random_base
from embedding.kernels.sorted_ids import SortedIds
from embedding.optimizers import SparseOptimizerConfig, SparseOptimizerError, spec_of
from embedding.optimizers.optimizer_spec import UpdateFunction

# A row's update costs about as much as summing this many of its occurrences; used to give
# every thread the same amount of work although Zipf ids make a few rows very long.
_ROW_COST_IN_OCCURRENCES = 4

# The rows are split into chunks of equal cost, and numba hands each thread an equal run of
# them (its loop scheduling is static). Handing them out one at a time instead
# (``numba.parallel_chunksize(1)``) measured a whole step twice as slow; why, we did not find.
_CHUNKS_PER_THREAD = 8

# How far ahead the kernel prefetches: far enough to hide a memory access behind the work in
# between, near enough that the prefetched lines are still cached when they are used. Measured on
# the sparse step's rows (docs/benchmarks.md, "Sparse embedding step"): occurrences 8 ahead left the loop over rows
# waiting on memory (2.0 ms); 32 ahead took 1.2-1.5 ms, 64 to 128 no less.
_ROW_PREFETCH_DISTANCE = 8
_OCCURRENCE_PREFETCH_DISTANCE = 32

_NO_GRAD_SCALE: npt.NDArray[np.float32] = np.empty(0, dtype=np.float32)

# What the kernel takes in place of the arrays a table's dtype does not use.
_NO_FLOATS: npt.NDArray[np.float32] = np.empty((0, 0), dtype=np.float32)
_NO_BITS: npt.NDArray[np.uint16] = np.empty((0, 0), dtype=np.uint16)
_NO_SLOT_IDS: npt.NDArray[np.int64] = np.empty(0, dtype=np.int64)
_NO_KEYS = RowKeys(np.zeros(1, dtype=np.uint64), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64))


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
    row_keys: RowKeys | None = None,
) -> None:
    """Update, in place, the rows of ``weight`` and ``state`` that ``ids`` touches (see
    :func:`embedding.kernels.fused_step`); ``sorted_ids``, the ids sorted ahead, spare the sort. A half-precision
    ``weight`` is read and written as its bits, its rows rounded stochastically with random bits keyed by
    ``row_keys``."""
    if weight.device.type != "cpu":
        raise SparseOptimizerError(f"`weight` must be on the CPU, but is on {weight.device} instead.")
    if ids.numel() == 0:
        return
    spec = spec_of(config)
    lr = config.lr if lr is None else lr

    if sorted_ids is None:
        sorted_ids = SortedIds.of(ids, weight.size(0))

    row_states, element_states = state_tensors(spec, state)
    per_touch = spec.weight_decay.per_touch if spec.counts_touches else None
    rows_kind = kind_of(weight.dtype)
    kernel = _step_kernel(spec.update_element, spec.update_row, spec.weight_decay.apply, per_touch, rows_kind)
    if rows_kind == FLOAT32:
        weight_floats, weight_bits, keys = _as_numpy(weight), _NO_BITS, _NO_KEYS
    else:
        assert row_keys is not None, "fused_step gives a half-precision table its keys."
        weight_floats, weight_bits, keys = _NO_FLOATS, _as_numpy(weight.view(torch.int16)).view(np.uint16), row_keys
    slot_ids = _NO_SLOT_IDS if keys.slot_ids is None else keys.slot_ids
    misplaced, out_of_range = kernel(
        weight_floats,
        weight_bits,
        weight.size(0),
        weight.size(1),
        (keys.salts, keys.ends, keys.bases, slot_ids, np.int64(step)),
        tuple(_as_numpy(tensor) for tensor in row_states),
        tuple(_as_numpy(tensor) for tensor in element_states),
        _as_numpy(touch_counts(spec, state, weight)),
        _as_numpy(ids),
        _as_numpy(sorted_ids.keys),
        _as_numpy(sorted_ids.order),
        *_piece_layout(grad_rows),
        _as_numpy(grad_index),
        _NO_GRAD_SCALE if grad_scale is None else _as_numpy(grad_scale),
        grad_scale is not None,
        *step_factors(spec, config, step, lr),
        numba.get_num_threads() * _CHUNKS_PER_THREAD,
    )
    if misplaced or out_of_range:  # The ranges first, as the other backends check them before the sort.
        check_step_ranges(ids, grad_index, weight.size(0), grad_rows)
    if misplaced:
        raise SparseOptimizerError(
            f"`sorted_ids` must sort `ids` (`keys` equal to `ids[order]`, never decreasing), but {misplaced} of its "
            "positions do not; nothing was updated."
        )


def sum_by_id(
    sorted_ids: SortedIds,
    grad_rows: Sequence[torch.Tensor],
    grad_index: torch.Tensor,
    grad_scale: torch.Tensor | None,
    distinct_ids: torch.Tensor,
    sums: torch.Tensor,
) -> None:
    """Write each distinct id, in sorted order, to ``distinct_ids`` and its gradient to the same row of ``sums``:
    ``grad_scale[k] * grad_rows[grad_index[k]]`` summed over its occurrences ``k`` (``grad_rows`` read as the
    concatenation of its pieces), in their order, as :func:`fused_step` sums a row's. A replicated table's ranks
    send these rather than every occurrence: the fewer rows every rank gathers, sorts and sums.

    :raises SparseOptimizerError: if an index points outside its array, or the ids outnumber the rows given them.
    """
    if sums.shape != (distinct_ids.numel(), sums.size(1)) or sums.size(1) != grad_rows[0].size(1):
        raise SparseOptimizerError(
            f"`sums` must have a row per distinct id and the gradients' width, but has shape {tuple(sums.shape)} "
            f"for {distinct_ids.numel()} ids of width {grad_rows[0].size(1)} instead."
        )
    out_of_bounds = _sum_by_id(
        _as_numpy(sorted_ids.keys),
        _as_numpy(sorted_ids.order),
        *_piece_layout(grad_rows),
        _as_numpy(grad_index),
        _NO_GRAD_SCALE if grad_scale is None else _as_numpy(grad_scale),
        grad_scale is not None,
        _as_numpy(distinct_ids),
        _as_numpy(sums),
    )
    if out_of_bounds:
        raise SparseOptimizerError(
            f"`sorted_ids.order` and `grad_index` must point into `grad_index` and `grad_rows`, and `distinct_ids` "
            f"hold every distinct id, but {out_of_bounds} positions do not; `sums` is not filled."
        )


@njit(cache=True, nogil=True)
def _sum_by_id(  # type: ignore[no-untyped-def]
    keys, order, piece_addresses, piece_row_strides, piece_rows, grad_index, grad_scale, has_grad_scale, ids, sums
):
    """Fill ``ids`` and ``sums``; the number of positions whose indices point outside their arrays (then 0 first)."""
    grad_row_addresses = _row_addresses(piece_addresses, piece_row_strides, piece_rows)
    out_of_bounds, distinct = 0, 0
    for position in range(keys.size):
        occurrence = order[position]
        distinct += position == 0 or keys[position] != keys[position - 1]
        in_bounds = 0 <= occurrence < grad_index.size and distinct <= ids.size
        if not in_bounds or not 0 <= grad_index[occurrence] < grad_row_addresses.size:
            out_of_bounds += 1
    if out_of_bounds:
        return out_of_bounds
    distinct = -1
    for position in range(keys.size):
        if position == 0 or keys[position] != keys[position - 1]:
            distinct += 1
            ids[distinct] = keys[position]
            sums[distinct, :] = 0
        occurrence = order[position]
        source = carray(float32_pointer(grad_row_addresses[grad_index[occurrence]]), sums.shape[1])
        scale = grad_scale[occurrence] if has_grad_scale else np.float32(1)
        for d in range(sums.shape[1]):
            sums[distinct, d] += scale * source[d]
    return 0


def count_distinct(sorted_ids: SortedIds) -> int:
    """How many distinct ids ``sorted_ids`` holds."""
    keys = sorted_ids.keys
    return int(keys.numel() > 0) + int(torch.count_nonzero(keys[1:] != keys[:-1]))


def _piece_layout(pieces: Sequence[torch.Tensor]) -> tuple[npt.NDArray[np.int64], ...]:
    """Where the pieces of the gradient rows are: each one's address, row stride in bytes and rows.

    The kernel reads the rows where they are, through their addresses, rather than from one
    concatenated copy: copying every feature's gradient into one buffer cost about a sixth of
    a whole sparse step. The pieces stay alive meanwhile, as the caller holds them.
    """
    addresses = np.array([piece.data_ptr() for piece in pieces], dtype=np.int64)
    row_strides = np.array([piece.stride(0) * piece.element_size() for piece in pieces], dtype=np.int64)
    rows = np.array([piece.size(0) for piece in pieces], dtype=np.int64)
    return addresses, row_strides, rows


def _as_numpy(tensor: torch.Tensor) -> npt.NDArray[Any]:
    """The numpy view of ``tensor``'s memory, so the kernel's writes land in the tensor."""
    return tensor.detach().numpy()


@functools.cache
def _step_kernel(
    update_element: UpdateFunction,
    update_row: UpdateFunction | None,
    weight_decay: UpdateFunction,
    decay_per_touch: Callable[[Any, Any], Any] | None,
    rows_kind: int = FLOAT32,
) -> Callable[..., tuple[int, bool]]:
    """The fused step compiled around one optimizer's update functions (see
    :class:`embedding.optimizers.SparseOptimizerSpec`) and the rows' dtype (``rows_kind``, see
    :mod:`embedding.kernels.rounding`), once per process; numba's cache keeps it between processes, keyed by the
    functions the kernel captures.

    A half-precision row is widened into a float32 row of the thread's own, updated there and rounded back, so
    that the update reads the same code whatever the dtype; with float32 rows the branches fold away."""
    has_row_step = update_row is not None
    low_precision = rows_kind != FLOAT32
    counts_touches = decay_per_touch is not None  # Like has_row_step, compiled in: no branch without counts.
    # numba checks only this file for changes to the cached kernel: a digest of the files that
    # define the functions it compiles in, captured too, makes an edited optimizer compile anew.
    source_digest = compiled_source.source_digest(
        update_element, update_row, weight_decay, decay_per_touch, gather, round_stochastically, round_row.py_func
    )

    @njit(parallel=True, cache=True, fastmath=False)
    def fused_step_kernel(  # type: ignore[no-untyped-def]
        weight,
        weight_bits,
        num_rows,
        dim,
        rounding,
        row_states,
        element_states,
        touches,
        ids,
        sorted_ids,
        order,
        piece_addresses,
        piece_row_strides,
        piece_rows,
        grad_index,
        grad_scale,
        has_grad_scale,
        decays,
        decay,
        factors,
        num_chunks,
    ):
        """Each chunk of rows goes to one thread; each row is summed, updated and written once. Returns how
        many positions of the sort do not sort ``ids`` and whether an id or gradient index is out of range (then
        before it writes anything)."""
        source_digest  # noqa: B018 (named, so that the kernel captures it)
        grad_row_addresses = _row_addresses(piece_addresses, piece_row_strides, piece_rows)
        key_salts, key_ends, key_bases, slot_ids, step = rounding

        # Each occurrence's gradient row address and scale, in sorted order; whether the sort, which
        # may come from elsewhere, sorts the ids (a row that ``ids`` does not hold could lie outside
        # the table, and a row split over two segments would race between two threads); and whether
        # every gradient index is a gradient row. The ids are rows of the table if the sort's first
        # and last keys are.
        num_occurrences = order.size
        sorted_addresses = np.empty(num_occurrences, dtype=np.int64)
        sorted_scales = np.empty(num_occurrences if has_grad_scale else 0, dtype=np.float32)
        misplaced, bad_indices = 0, 0
        for chunk in prange(num_chunks):
            end = (chunk + 1) * num_occurrences // num_chunks
            for position in range(chunk * num_occurrences // num_chunks, end):
                # The order scatters the reads of ids and gradient indices: prefetched, the pass took half the time.
                if position + _OCCURRENCE_PREFETCH_DISTANCE < end:
                    coming = order[position + _OCCURRENCE_PREFETCH_DISTANCE]  # checked when its turn comes
                    prefetch_for_read(ids, (coming,))
                    prefetch_for_read(grad_index, (coming,))
                occurrence = order[position]
                if (
                    occurrence < 0
                    or occurrence >= num_occurrences
                    or ids[occurrence] != sorted_ids[position]
                    or (position > 0 and sorted_ids[position - 1] > sorted_ids[position])
                    # Stable (an id's occurrences in their order), so that no occurrence comes twice.
                    or (
                        position > 0
                        and sorted_ids[position - 1] == sorted_ids[position]
                        and order[position - 1] >= occurrence
                    )
                ):
                    misplaced += 1
                    continue
                index = grad_index[occurrence]
                if index < 0 or index >= grad_row_addresses.size:
                    bad_indices += 1
                    continue
                sorted_addresses[position] = grad_row_addresses[index]
                if has_grad_scale:
                    sorted_scales[position] = grad_scale[occurrence]
        out_of_range = bad_indices > 0 or sorted_ids[0] < 0 or sorted_ids[num_occurrences - 1] >= num_rows
        if misplaced or out_of_range:
            return misplaced, out_of_range
        segment_starts = _segment_starts(sorted_ids)
        chunk_bounds = _balanced_chunk_bounds(segment_starts, num_chunks)

        for chunk in prange(num_chunks):
            grad = np.empty(dim, dtype=np.float32)
            widened = np.empty((1, dim) if low_precision else (0, 0), dtype=np.float32)
            widened_bits = widened.view(np.uint32)
            first_segment, end_segment = chunk_bounds[chunk], chunk_bounds[chunk + 1]
            end_position = segment_starts[end_segment]
            for segment in range(first_segment, end_segment):
                if segment + _ROW_PREFETCH_DISTANCE < end_segment:
                    coming_row = np.intp(sorted_ids[segment_starts[segment + _ROW_PREFETCH_DISTANCE]])
                    if low_precision:
                        prefetch_row_for_write(weight_bits, coming_row)
                    else:
                        prefetch_row_for_write(weight, coming_row)
                    prefetch_rows_for_write(row_states, coming_row)
                    prefetch_rows_for_write(element_states, coming_row)

                begin, end = segment_starts[segment], segment_starts[segment + 1]
                row = np.intp(sorted_ids[begin])
                _sum_row_grad(grad, begin, end, end_position, sorted_addresses, sorted_scales, has_grad_scale)
                if low_precision:  # the row's float32 values, updated in ``rows[at]``
                    widen_row(weight_bits, row, widened, rows_kind)
                    rows, at = widened, np.intp(0)
                else:
                    rows, at = weight, row

                row_decay = decay
                if counts_touches:
                    touched = touches[row] + np.float32(1)
                    touches[row] = touched
                    row_decay = decay_per_touch(decay, touched)  # type: ignore[misc]

                multiplier = np.float32(1)
                if has_row_step:  # It takes the whole row's gradient, decayed first.
                    if decays:
                        for d in range(dim):
                            rows[at, d], grad[d] = weight_decay(rows[at, d], grad[d], row_decay)
                    squared = np.float32(0)
                    for d in range(dim):
                        squared += grad[d] * grad[d]
                    row_values = gather(row_states, (row,))
                    row_values, multiplier = update_row(row_values, squared / np.float32(dim), factors)  # type: ignore[misc]
                    scatter(row_states, (row,), row_values)
                for d in range(dim):
                    new_weight, new_grad = rows[at, d], grad[d]
                    if decays and not has_row_step:
                        new_weight, new_grad = weight_decay(new_weight, new_grad, row_decay)
                    element_values = gather(element_states, (row, d))
                    rows[at, d], element_values = update_element(
                        new_weight, new_grad, multiplier, element_values, factors
                    )
                    scatter(element_states, (row, d), element_values)
                if low_precision:
                    salt, key = row_key(row, key_ends, key_bases, key_salts, slot_ids)
                    round_row(widened_bits, weight_bits, row, row_random_base(salt, step, key), rows_kind)
        return 0, False

    return fused_step_kernel  # type: ignore[no-any-return]


# The helpers below are inlined (``inline="always"``): a call to a compiled helper from the
# parallel loop would update the reference counts of its array arguments, atomically, once
# per row, which made the kernel several times slower.


@njit(cache=True, inline="always")
def _segment_starts(sorted_ids):  # type: ignore[no-untyped-def]
    """The start of each run of equal ids, followed by ``len(sorted_ids)``."""
    starts = np.empty(sorted_ids.size + 1, dtype=np.int64)
    num_segments = 0
    for k in range(sorted_ids.size):
        if k == 0 or sorted_ids[k] != sorted_ids[k - 1]:
            starts[num_segments] = k
            num_segments += 1
    starts[num_segments] = sorted_ids.size
    return starts[: num_segments + 1]


@njit(cache=True, inline="always")
def _balanced_chunk_bounds(segment_starts, num_chunks):  # type: ignore[no-untyped-def]
    """Split the segments into ``num_chunks`` runs of about equal cost, counting each row's
    occurrences plus a fixed cost for its update."""
    num_segments = segment_starts.size - 1
    cost_before = segment_starts[:num_segments] + _ROW_COST_IN_OCCURRENCES * np.arange(num_segments)
    total_cost = segment_starts[num_segments] + _ROW_COST_IN_OCCURRENCES * num_segments
    bounds = np.empty(num_chunks + 1, dtype=np.int64)
    for chunk in range(num_chunks + 1):
        bounds[chunk] = np.searchsorted(cost_before, chunk * total_cost // num_chunks)
    bounds[num_chunks] = num_segments
    return bounds


@njit(cache=True, inline="always")
def _row_addresses(piece_addresses, piece_row_strides, piece_rows):  # type: ignore[no-untyped-def]
    """The address of every gradient row, the pieces' rows one after the other."""
    addresses = np.empty(piece_rows.sum(), dtype=np.int64)
    position = 0
    for piece in range(piece_addresses.size):
        for row in range(piece_rows[piece]):
            addresses[position] = piece_addresses[piece] + row * piece_row_strides[piece]
            position += 1
    return addresses


@njit(cache=True, inline="always")
def _sum_row_grad(grad, begin, end, end_position, sorted_addresses, sorted_scales, has_grad_scale):  # type: ignore[no-untyped-def]
    """Sum the gradient rows of the sorted occurrences ``begin:end`` of one row into ``grad``, in that
    order, prefetching the rows of the occurrences that follow, up to ``end_position``."""
    grad[:] = 0
    for position in range(begin, end):
        if position + _OCCURRENCE_PREFETCH_DISTANCE < end_position:
            coming = sorted_addresses[position + _OCCURRENCE_PREFETCH_DISTANCE]
            for offset in range(0, grad.size * 4, 64):  # Every 64-byte cache line of a float32 row.
                prefetch_address(coming + offset)
        source = carray(float32_pointer(sorted_addresses[position]), grad.size)
        if has_grad_scale:
            scale = sorted_scales[position]
            for d in range(grad.size):
                grad[d] += scale * source[d]
        else:
            for d in range(grad.size):
                grad[d] += source[d]
