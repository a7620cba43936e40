"""Fused sparse-optimizer steps: for each embedding row touched in a step, reduce its gradient
over all its occurrences, update its optimizer state and write the row, in one pass.

:func:`fused_step` checks its inputs and hands them to one of three backends with the same
signature: ``reference`` (plain torch, the oracle), ``cpu`` (numba, parallel over rows) and
``cuda`` (numba.cuda, a group of lanes per run of a row's sorted occurrences).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from embedding.kernels.common import check_ranges, check_step_ranges
from embedding.kernels.rounding import ROW_DTYPES, DeviceRowKeys, RowKeys
from embedding.kernels.sorted_ids import SortedIds
from embedding.optimizers import SparseOptimizerConfig, SparseOptimizerError, spec_of

BACKENDS = ("reference", "cpu", "cuda")


FusedStep = Callable[
    [
        SparseOptimizerConfig,
        torch.Tensor,
        dict[str, torch.Tensor],
        torch.Tensor,
        Sequence[torch.Tensor],
        torch.Tensor,
        torch.Tensor | None,
        int,
        float | None,
        SortedIds | None,
        RowKeys | None,
    ],
    None,
]


def fused_step(
    config: SparseOptimizerConfig,
    weight: torch.Tensor,
    state: dict[str, torch.Tensor],
    ids: torch.Tensor,
    grad_rows: torch.Tensor | Sequence[torch.Tensor],
    grad_index: torch.Tensor,
    grad_scale: torch.Tensor | None,
    step: int,
    lr: float | None = None,
    backend: str | None = None,
    sorted_ids: SortedIds | None = None,
    row_keys: RowKeys | None = None,
) -> None:
    """Apply one lazy optimizer step, in place, to the rows of ``weight`` that ``ids`` touches.

    The gradient of row ``r`` is the sum over the occurrences ``k`` with ``ids[k] == r`` of
    ``grad_scale[k] * grad_rows[grad_index[k]]``: the per-occurrence gradient is gathered inside
    the kernel, never materialised. ``grad_rows`` may come in pieces, read as if concatenated
    (the CPU kernel reads them where they are, sparing a copy of every feature's gradient);
    a piece's rows may be strided, its columns must not. ``step`` counts the optimizer steps taken, this one
    included (Adam's bias correction); ``lr``, when given, overrides ``config.lr`` so that an
    LR scheduler can drive it. ``backend`` defaults to ``cuda`` for CUDA tensors, else ``cpu``.
    ``sorted_ids``: ``ids`` sorted already (see :class:`SortedIds`); the CPU kernel takes them in place
    of a sort of its own, after checking, as it reads them, that they sort ``ids``; the others sort anyway.

    ``weight`` may be float16 or bfloat16: each touched row is computed in float32 and rounded stochastically as it
    is written back, with random bits keyed by ``row_keys`` (default: the buffer's rows, as rows of one table of
    salt 0) and ``step`` (see :mod:`embedding.kernels.rounding`); a hash table's slot ids held on a CUDA device
    (:class:`DeviceRowKeys`) are read there by the CUDA backend, and copied to the host for the others. The state
    and the gradients stay float32.

    :raises SparseOptimizerError: if a shape, dtype, device, id or ``step`` is invalid.
    """
    if backend is None:
        backend = "cuda" if weight.is_cuda else "cpu"
    step_fn = _backend_step(backend)

    pieces = (grad_rows,) if isinstance(grad_rows, torch.Tensor) else tuple(grad_rows)
    # The CUDA step reads the ranges of the ids once its kernels are queued (they check them too): a read
    # here would make the host wait for the device. The CPU kernel checks them in its first pass, which reads
    # every id and gradient index anyway: a pass of its own took 0.1-0.2 ms of a 4-8 ms sparse step.
    check_step_inputs(config, weight, state, ids, pieces, grad_index, grad_scale, step, ranges=backend == "reference")
    if sorted_ids is not None:
        _check_sorted_ids(sorted_ids, ids)

    if row_keys is None and weight.dtype != torch.float32:
        row_keys = RowKeys.of_buffer(weight.size(0))
    elif isinstance(row_keys, DeviceRowKeys) and backend != "cuda":
        row_keys = row_keys.on_host()
    step_fn(config, weight, state, ids, pieces, grad_index, grad_scale, step, lr, sorted_ids, row_keys)


def _backend_step(backend: str) -> FusedStep:
    # The backends import lazily: numba's CUDA machinery is slow to import and unused on CPU.
    if backend == "reference":
        from embedding.kernels import reference

        return reference.fused_step
    if backend == "cpu":
        from embedding.kernels import cpu

        return cpu.fused_step
    if backend == "cuda":
        from embedding.kernels import cuda

        return cuda.fused_step
    raise SparseOptimizerError(f"`backend` must be one of {', '.join(BACKENDS)}, but is '{backend}' instead.")


def check_step_inputs(
    config: SparseOptimizerConfig,
    weight: torch.Tensor,
    state: dict[str, torch.Tensor],
    ids: torch.Tensor,
    grad_rows: Sequence[torch.Tensor],
    grad_index: torch.Tensor,
    grad_scale: torch.Tensor | None,
    step: int,
    ranges: bool = True,
) -> None:
    """Raise :class:`SparseOptimizerError` on any input that would make a kernel read or write
    out of bounds, or compute with the wrong types; with ``ranges=False``, but for the values of
    ``ids`` and ``grad_index`` (which a caller then checks with :func:`check_ranges`)."""
    if weight.dtype not in ROW_DTYPES:
        raise SparseOptimizerError(
            f"`weight` must be of dtype {', '.join(map(str, ROW_DTYPES))}, but is {weight.dtype} instead."
        )
    _check_tensor("weight", weight, dim=2, dtype=weight.dtype, device=weight.device)
    num_rows, dim = weight.shape
    if dim == 0:
        raise SparseOptimizerError("`weight` must have at least one column, but has none.")
    if not grad_rows:
        raise SparseOptimizerError("`grad_rows` must hold at least one piece, but holds none.")
    for index, piece in enumerate(grad_rows):
        name = "grad_rows" if len(grad_rows) == 1 else f"grad_rows[{index}]"
        _check_tensor(name, piece, dim=2, dtype=torch.float32, device=weight.device, contiguous=False)
        if piece.size(1) != dim:
            raise SparseOptimizerError(
                f"`{name}` must have the dimension of `weight` ({dim}), but has {piece.size(1)} instead."
            )
        if piece.size(1) > 1 and piece.stride(1) != 1:
            raise SparseOptimizerError(f"`{name}` must have contiguous rows, but has strides {piece.stride()} instead.")
    _check_tensor("ids", ids, dim=1, dtype=torch.int64, device=weight.device)
    _check_tensor("grad_index", grad_index, dim=1, dtype=torch.int64, device=weight.device)
    if grad_scale is not None:
        _check_tensor("grad_scale", grad_scale, dim=1, dtype=torch.float32, device=weight.device)

    for name, tensor in (("grad_index", grad_index), ("grad_scale", grad_scale)):
        if tensor is not None and tensor.shape != ids.shape:
            raise SparseOptimizerError(
                f"`{name}` must have the shape of `ids` {tuple(ids.shape)}, but has {tuple(tensor.shape)} instead."
            )
    if step < 1:
        raise SparseOptimizerError(f"`step` must be greater than or equal to 1, but is {step} instead.")

    _check_state(config, state, weight)

    if ranges and ids.numel() > 0:
        check_step_ranges(ids, grad_index, num_rows, grad_rows)


def _check_tensor(
    name: str, tensor: torch.Tensor, dim: int, dtype: torch.dtype, device: torch.device, contiguous: bool = True
) -> None:
    if tensor.dim() != dim:
        raise SparseOptimizerError(f"`{name}` must be {dim}-D, but has shape {tuple(tensor.shape)} instead.")
    if tensor.dtype != dtype:
        raise SparseOptimizerError(f"`{name}` must be of dtype {dtype}, but is {tensor.dtype} instead.")
    if tensor.device != device:
        raise SparseOptimizerError(
            f"`{name}` must be on the device of `weight` ({device}), but is on {tensor.device} instead."
        )
    if contiguous and not tensor.is_contiguous():
        raise SparseOptimizerError(f"`{name}` must be contiguous, but is not.")


def _check_state(config: SparseOptimizerConfig, state: dict[str, torch.Tensor], weight: torch.Tensor) -> None:
    """``state`` is laid out as the optimizer's spec says: its tensors by name, per row or per element."""
    layout = spec_of(config).layout
    if state.keys() != {tensor.name for tensor in layout}:
        raise SparseOptimizerError(
            f"`state` of optimizer '{config.name}' must have the keys {sorted(tensor.name for tensor in layout)}, "
            f"but has {sorted(state)} instead."
        )
    for declared in layout:
        tensor = state[declared.name]
        expected_shape = weight.shape[:1] if declared.per_row else weight.shape
        name = f"state['{declared.name}']"
        _check_tensor(name, tensor, dim=len(expected_shape), dtype=torch.float32, device=weight.device)
        if tensor.shape != expected_shape:
            raise SparseOptimizerError(
                f"`{name}` must have shape {tuple(expected_shape)}, but has {tuple(tensor.shape)} instead."
            )


def _check_sorted_ids(sorted_ids: SortedIds, ids: torch.Tensor) -> None:
    """The shapes and types of a sort made ahead; whether it sorts ``ids`` the kernel checks as it reads it."""
    if sorted_ids.keys.dtype not in (torch.int32, torch.int64):
        raise SparseOptimizerError(
            f"`sorted_ids.keys` must be of dtype torch.int32 or torch.int64, but is {sorted_ids.keys.dtype} instead."
        )
    _check_tensor("sorted_ids.keys", sorted_ids.keys, dim=1, dtype=sorted_ids.keys.dtype, device=ids.device)
    _check_tensor("sorted_ids.order", sorted_ids.order, dim=1, dtype=torch.int64, device=ids.device)
    for name, tensor in (("sorted_ids.keys", sorted_ids.keys), ("sorted_ids.order", sorted_ids.order)):
        if tensor.shape != ids.shape:
            raise SparseOptimizerError(
                f"`{name}` must have the shape of `ids` {tuple(ids.shape)}, but has {tuple(tensor.shape)} instead."
            )


__all__ = [
    "BACKENDS",
    "DeviceRowKeys",
    "FusedStep",
    "RowKeys",
    "SortedIds",
    "check_ranges",
    "check_step_inputs",
    "fused_step",
]
