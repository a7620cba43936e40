"""The fused sparse-optimizer step on GPU: torch sorts, numba.cuda kernels sum and update.

The ids are sorted on the device (stably; as 32-bit keys where the table allows, half the passes
of a 64-bit sort), so that each row's occurrences form one segment, and each sorted occurrence's
gradient row is looked up once, by torch, ahead of the kernels. The sorted positions are then cut
into *units*: a unit ends where its segment ends or at a multiple of ``CHUNK``, so that a row looked
up a tenth of the batch (the head of a Zipf batch) is summed by many groups of lanes at once, not
by one while the rest of the GPU idles. As the cuts fall at fixed multiples of ``CHUNK`` (not at
a row's own offsets), a unit finds the slot of its partial sum from its start alone.
:mod:`embedding.kernels.cuda_kernels` holds the two kernels: the units', which updates the rows
of one unit and writes the partial sums of longer rows, and the long rows', which adds those up.

The host never waits for the device inside a step but once, at its end, to read the range of the
ids and gradient indices: the kernels read the same range first and write nothing if it is bad,
and the step then raises. The count of units stays on the device too (the kernels loop over the
units on a grid of fixed size). Each launch of a numba kernel costs host time for every array it
takes, and making a numba view of a tensor more; a step takes the same buffers every time (a
workspace per device, stream, row width and key type) and the same table, so their views are made
once.

Without a GPU, numba's simulator (``NUMBA_ENABLE_CUDASIM=1``) runs the same kernels on CPU
tensors; it is how the tests run them.

It expects inputs checked by :func:`embedding.kernels.check_step_inputs` but for the ranges of
the ids and gradient indices, which it checks itself.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numba
import numpy as np
import torch
from numba import cuda

from embedding.kernels import cuda_kernels
from embedding.kernels.common import check_ranges, concatenated, state_tensors, step_bounds, step_factors, touch_counts
from embedding.kernels.cuda_kernels import CHUNK
from embedding.kernels.rounding import FLOAT32, DeviceRowKeys, RowKeys, kind_of
from embedding.kernels.sorted_ids import SortedIds
from embedding.optimizers import SparseOptimizerConfig, SparseOptimizerError, spec_of

THREADS_PER_BLOCK = 128
"""Threads of a block of the units' kernel: several groups of lanes (narrow rows fill whole warps)."""

BLOCKS_PER_MULTIPROCESSOR = 8
"""Blocks of the units' kernel per multiprocessor (as many as fit at once); they loop over the units."""

LONG_ROW_THREADS = 1024
"""The most threads of a block of the long rows' kernel."""

LONG_ROW_SLICES = 8
"""The most slices a long row's partial sums are split into, each summed by its own threads."""

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
    row_keys: RowKeys | None = None,
) -> None:
    """Update, in place, the rows of ``weight`` and ``state`` that ``ids`` touches (see
    :func:`embedding.kernels.fused_step`). ``sorted_ids`` is not read: the ids are sorted on the device. A
    half-precision ``weight``'s rows round stochastically, keyed by ``row_keys``.

    :raises SparseOptimizerError: if an id or gradient index is out of range (nothing is updated then).
    """
    if not weight.is_cuda and not numba.config.ENABLE_CUDASIM:
        raise SparseOptimizerError(
            f"`weight` must be on a CUDA device (or NUMBA_ENABLE_CUDASIM=1 be set), but is on {weight.device} instead."
        )
    if ids.numel() == 0:
        return
    spec = spec_of(config)
    (num_rows, dim), num_ids = weight.shape, ids.numel()
    rows = concatenated(grad_rows)
    stream = stream_of(weight)
    space = _workspace(weight.device, stream, dim, SortedIds.key_dtype(num_rows), num_ids)
    space.prepare(ids, num_rows, grad_index, grad_scale)

    lanes = min(_WARP, 1 << (dim - 1).bit_length())  # a power of two: groups never straddle a warp
    row_states, element_states = state_tensors(spec, state)
    per_touch = spec.weight_decay.per_touch if spec.counts_touches else None
    rows_kind = kind_of(weight.dtype)
    units_kernel, long_rows_kernel = cuda_kernels.compiled(
        spec.update_element, spec.update_row, spec.weight_decay.apply, per_touch, -(-dim // lanes), rows_kind
    )
    tables = (
        kept_device_array(weight) if rows_kind == FLOAT32 else _bits_array(weight),
        tuple(kept_device_array(tensor) for tensor in row_states),
        tuple(kept_device_array(tensor) for tensor in element_states),
        kept_device_array(touch_counts(spec, state, weight)),
        *space.views("keys", "partial_sums", "long_rows", "num_long_rows"),
        num_ids,
    )
    step_arguments = (*step_factors(spec, config, step, config.lr if lr is None else lr), *_rounding(row_keys, weight))

    groups = THREADS_PER_BLOCK // lanes
    blocks = min(-(-num_ids // groups), BLOCKS_PER_MULTIPROCESSOR * _multiprocessors(weight.device))
    scratch = 4 * THREADS_PER_BLOCK * cuda_kernels.SIMULATOR_SCRATCH_FLOATS_PER_THREAD
    units_kernel[blocks, THREADS_PER_BLOCK, stream, scratch](
        *tables,
        *space.views("unit_starts", "unit_numbers", "sorted_rows", "sorted_scales"),
        grad_scale is not None,
        as_device_array(rows),
        space.views("bounds")[0],
        lanes,
        *step_arguments,
        np.int64(step),
    )
    columns = min(dim, LONG_ROW_THREADS)
    slices = min(LONG_ROW_SLICES, LONG_ROW_THREADS // columns)
    shared = 4 * (slices * dim + columns + 1 + dim)
    long_rows_kernel[_multiprocessors(weight.device), columns * slices, stream, shared](
        *tables, columns, *step_arguments, np.int64(step)
    )

    # The one wait of the step: the kernels have read the same bounds and done nothing if they are bad.
    id_low, id_high, index_low, index_high = space.bounds.tolist()
    check_ranges(id_low, id_high, index_low, index_high, num_rows, rows.size(0))


def _bits_array(weight: torch.Tensor) -> object:
    """A half-precision table as its bits (uint16), which the kernels widen and round themselves."""
    if weight.is_cuda:
        return kept_device_array(weight.view(torch.int16)).view(np.uint16)  # type: ignore[attr-defined]
    return weight.detach().view(torch.int16).numpy().view(np.uint16)


def _rounding(row_keys: RowKeys | None, weight: torch.Tensor) -> tuple[object, ...]:
    """The kernels' arguments that key a half-precision row's rounding (but the step): salts, ends, bases and slot
    ids (empty for a fixed table); for float32 rows, one table's, which no kernel reads. On a GPU, a buffer's keys
    are copied to the device once (a copy from the host would wait). A hash table's slot ids are read where its
    index holds them (:class:`DeviceRowKeys`), as this step's lookups left them; slot ids given on the host are
    copied every step."""
    keys = row_keys if row_keys is not None else RowKeys.of_buffer(weight.size(0))
    slot_ids: object = _NO_SLOT_IDS if keys.slot_ids is None else keys.slot_ids
    if isinstance(keys, DeviceRowKeys):
        held = keys.device_slot_ids
        if held.device != weight.device or held.dtype != torch.int64 or held.dim() != 1:
            raise SparseOptimizerError(
                f"`row_keys.device_slot_ids` must be 1-D int64 on the device of `weight` ({weight.device}), but is "
                f"{held.dim()}-D {held.dtype} on {held.device} instead."
            )
        slot_ids = kept_device_array(held)
    if not weight.is_cuda:
        return (keys.salts, keys.ends, keys.bases, slot_ids)
    shards = _device_keys(weight.device, keys.salts.tobytes(), keys.ends.tobytes(), keys.bases.tobytes())
    if slot_ids is _NO_SLOT_IDS:
        slot_ids = _device_keys(weight.device, _NO_SLOT_IDS.tobytes())[0]
    return (*shards, cuda.to_device(slot_ids) if isinstance(slot_ids, np.ndarray) else slot_ids)


_NO_SLOT_IDS = np.empty(0, dtype=np.int64)


@functools.lru_cache(maxsize=256)
def _device_keys(device: torch.device, *arrays: bytes) -> tuple[object, ...]:
    """Arrays of keys (their bytes: uint64 salts, int64 ends and bases or slot ids) on ``device``."""
    dtypes = (np.uint64, np.int64, np.int64) if len(arrays) == 3 else (np.int64,)
    with torch.cuda.device(device):
        return tuple(cuda.to_device(np.frombuffer(data, dtype=dtype)) for data, dtype in zip(arrays, dtypes))


class _Workspace:
    """The buffers of a step's sort and units, kept from step to step (on one device and stream, for
    one row width and key type), with their numba views. Sized for the most ids a step has had."""

    def __init__(self, device: torch.device, dim: int, key_dtype: torch.dtype, capacity: int) -> None:
        self.capacity = capacity
        self.keys = torch.empty(capacity, dtype=key_dtype, device=device)
        self.order = torch.empty(capacity, dtype=torch.int64, device=device)
        self.sorted_rows = torch.empty(capacity, dtype=torch.int64, device=device)
        self.sorted_scales = torch.ones(capacity, dtype=torch.float32, device=device)
        self.starts = torch.empty(capacity, dtype=torch.bool, device=device)
        self.unit_numbers = torch.empty(capacity, dtype=torch.int64, device=device)
        self.unit_slots = torch.empty(capacity, dtype=torch.int64, device=device)
        # Unit u starts at unit_starts[u + 1]; a position that starts no unit is written past the units, at
        # capacity + 1 + its position, so that no two positions write one slot.
        self.unit_starts = torch.empty(2 * capacity + 1, dtype=torch.int64, device=device)
        self.positions = torch.arange(capacity, dtype=torch.int64, device=device)
        self.past_the_units = torch.arange(capacity + 1, 2 * capacity + 1, dtype=torch.int64, device=device)
        self.long_rows = torch.empty(capacity // CHUNK + 1, dtype=torch.int64, device=device)
        self.num_long_rows = torch.zeros(1, dtype=torch.int32, device=device)
        self.partial_sums = torch.empty((2 * (capacity // CHUNK) + 2, dim), dtype=torch.float32, device=device)
        self.bounds = torch.empty(4, dtype=torch.int64, device=device)
        self._views = {name: as_device_array(tensor) for name, tensor in vars(self).items() if torch.is_tensor(tensor)}

    def views(self, *names: str) -> tuple[object, ...]:
        return tuple(self._views[name] for name in names)

    def prepare(
        self, ids: torch.Tensor, num_rows: int, grad_index: torch.Tensor, grad_scale: torch.Tensor | None
    ) -> None:
        """Queue the torch work ahead of the kernels: the bounds, the sort, the gradient rows and
        scales in sorted order, and the units."""
        n = ids.numel()
        step_bounds(ids, grad_index, out=self.bounds)
        keys, order = self.keys[:n], self.order[:n]
        SortedIds.of(ids, num_rows, out=(keys, order))
        torch.index_select(grad_index, 0, order, out=self.sorted_rows[:n])
        if grad_scale is not None:
            torch.index_select(grad_scale, 0, order, out=self.sorted_scales[:n])
        starts = self.starts[:n]
        torch.ne(keys[1:], keys[:-1], out=starts[1:])
        starts[::CHUNK] = True
        unit_numbers = torch.cumsum(starts, 0, out=self.unit_numbers[:n])
        slots = torch.where(starts, unit_numbers, self.past_the_units[:n], out=self.unit_slots[:n])
        self.unit_starts.scatter_(0, slots, self.positions[:n])
        self.num_long_rows.zero_()


def _workspace(device: torch.device, stream: object, dim: int, key_dtype: torch.dtype, num_ids: int) -> _Workspace:
    key = (device, id(stream), dim, key_dtype)
    space = _WORKSPACES.get(key)
    if space is None or space.capacity < num_ids:
        capacity = num_ids if space is None else max(num_ids, space.capacity * 5 // 4)  # grown by steps, not by ids
        _WORKSPACES.pop(key, None)
        del space  # the old buffers are freed before the new ones are made
        space = _WORKSPACES[key] = _Workspace(device, dim, key_dtype, capacity)
    return space


_WORKSPACES: dict[tuple[object, ...], _Workspace] = {}


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    """The device's multiprocessors (the simulator's grid: 2 blocks)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 2


def as_device_array(tensor: torch.Tensor) -> object:
    """A zero-copy numba view of a CUDA tensor; under the simulator, the numpy view of a CPU
    tensor, which the simulator copies in and writes back around the launch."""
    if tensor.is_cuda:
        return cuda.as_cuda_array(tensor.detach())
    return tensor.detach().numpy()


def kept_device_array(tensor: torch.Tensor) -> object:
    """:func:`as_device_array` of a tensor that outlives the step (a table, its state), made once per
    address and layout: a view that holds no reference, so that it keeps no memory alive."""
    if not tensor.is_cuda:
        return as_device_array(tensor)
    key = (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, tensor.device)
    view = _KEPT_VIEWS.get(key)
    if view is None:
        if len(_KEPT_VIEWS) >= _MAX_KEPT_VIEWS:
            _KEPT_VIEWS.clear()
        view = _KEPT_VIEWS[key] = cuda.from_cuda_array_interface(tensor.detach().__cuda_array_interface__, owner=None)
    return view


_KEPT_VIEWS: dict[tuple[object, ...], object] = {}
_MAX_KEPT_VIEWS = 1024


def stream_of(tensor: torch.Tensor) -> object:
    """torch's current stream, so the kernel runs after the torch work that fed it."""
    if tensor.is_cuda:
        return _external_stream(torch.cuda.current_stream(tensor.device).cuda_stream)
    return 0


@functools.lru_cache(maxsize=64)
def _external_stream(handle: int) -> object:
    return cuda.external_stream(handle)
