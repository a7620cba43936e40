"""What the kernels share: an optimizer's state as the tuples its update functions take, the
factors of a step, the gradient rows as one tensor for the backends that take them so, and the
compiled loads and stores of a tuple of state arrays."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from numba.core.errors import TypingError
from numba.extending import overload

from embedding.optimizers import SparseOptimizerConfig, SparseOptimizerError
from embedding.optimizers.optimizer_spec import TOUCHES, SparseOptimizerSpec


def state_tensors(
    spec: SparseOptimizerSpec, state: dict[str, torch.Tensor]
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """The per-row and the per-element state tensors, each in the order the spec's updates take them."""
    return tuple(state[name] for name in spec.row_states), tuple(state[name] for name in spec.element_states)


def touch_counts(spec: SparseOptimizerSpec, state: dict[str, torch.Tensor], weight: torch.Tensor) -> torch.Tensor:
    """The rows' touch counts if the optimizer keeps them, else an empty tensor the kernel never reads."""
    return state[TOUCHES.name] if spec.counts_touches else weight.new_empty(0, dtype=torch.float32)


def step_factors(
    spec: SparseOptimizerSpec, config: SparseOptimizerConfig, step: int, lr: float
) -> tuple[bool, np.float32, tuple[np.float32, ...]]:
    """Whether weights decay at all, the weight decay's factor and the update's factors for
    ``step``, each rounded to float32 once, here, so that every kernel computes in float32 as
    torch does. Without weight decay the kernels skip it, which leaves every bit as it is."""
    decay = np.float32(spec.weight_decay.factor(lr, config.weight_decay))
    return config.weight_decay != 0, decay, tuple(np.float32(factor) for factor in spec.factors(step, lr))


def step_bounds(ids: torch.Tensor, grad_index: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The lowest and highest id and gradient index, as one tensor on their device (one read of it gives all
    four: on a GPU each read waits for the work queued before it); :func:`check_ranges` takes them in order."""
    return torch.stack([*torch.aminmax(ids), *torch.aminmax(grad_index)], out=out)


def check_step_ranges(
    ids: torch.Tensor, grad_index: torch.Tensor, num_rows: int, grad_rows: Sequence[torch.Tensor]
) -> None:
    """:func:`check_ranges` on the bounds of ``ids`` and ``grad_index`` (a table of ``num_rows`` rows, the
    gradient rows in pieces), read at once."""
    id_low, id_high, index_low, index_high = step_bounds(ids, grad_index).tolist()
    check_ranges(id_low, id_high, index_low, index_high, num_rows, sum(piece.size(0) for piece in grad_rows))


def check_ranges(id_low: int, id_high: int, index_low: int, index_high: int, num_rows: int, num_grad_rows: int) -> None:
    """Raise :class:`SparseOptimizerError` unless the step's ids (lowest, highest) are rows of the
    table and its gradient indices rows of the gradient."""
    for name, low, high, size, what in (
        ("ids", id_low, id_high, num_rows, "rows in `weight`"),
        ("grad_index", index_low, index_high, num_grad_rows, "rows in `grad_rows`"),
    ):
        if low < 0 or high >= size:
            bad = low if low < 0 else high
            raise SparseOptimizerError(
                f"`{name}` must be in [0, {size}) as there are {size} {what}, but contains {bad} instead."
            )


def concatenated(grad_rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """The pieces of ``grad_rows`` as one contiguous tensor (a copy unless there is one piece)."""
    if len(grad_rows) == 1 and grad_rows[0].is_contiguous():
        return grad_rows[0]
    return torch.cat([piece.contiguous() for piece in grad_rows])


# The values of a tuple of state arrays at one index (an element, a row; the reference's rows):
# what an update function takes and returns. The compiled versions are written out for each
# length numba must build (a star-unpacking of the rest, peeled recursively, compiles for the
# CPU but not with numba-cuda 0.30, whose lowering of the joined tuples fails); they are inlined,
# so that a kernel's parallel loop does not count references to the arrays at every call.

MAX_STATE_ARRAYS = 4
"""The most arrays of one kind (per row, per element) an optimizer's state may have."""


def gather(arrays: tuple[Any, ...], index: Any) -> tuple[Any, ...]:
    """``(arrays[0][index], arrays[1][index], ...)``."""
    return tuple(array[index] for array in arrays)


def scatter(arrays: tuple[Any, ...], index: Any, values: tuple[Any, ...]) -> None:
    """``arrays[k][index] = values[k]`` for every ``k``."""
    for array, value in zip(arrays, values):
        array[index] = value


def _check_length(arrays: Any) -> int:
    if len(arrays) > MAX_STATE_ARRAYS:
        raise TypingError(
            f"an optimizer's state must have at most {MAX_STATE_ARRAYS} arrays of a kind, but has {len(arrays)} instead"
        )
    return len(arrays)


@overload(gather, inline="always")
def _compiled_gather(arrays, index):  # type: ignore[no-untyped-def]
    return (
        lambda arrays, index: (),
        lambda arrays, index: (arrays[0][index],),
        lambda arrays, index: (arrays[0][index], arrays[1][index]),
        lambda arrays, index: (arrays[0][index], arrays[1][index], arrays[2][index]),
        lambda arrays, index: (arrays[0][index], arrays[1][index], arrays[2][index], arrays[3][index]),
    )[_check_length(arrays)]


@overload(scatter, inline="always")
def _compiled_scatter(arrays, index, values):  # type: ignore[no-untyped-def]
    def scatter_none(arrays, index, values):  # type: ignore[no-untyped-def]
        pass

    def scatter_one(arrays, index, values):  # type: ignore[no-untyped-def]
        arrays[0][index] = values[0]

    def scatter_two(arrays, index, values):  # type: ignore[no-untyped-def]
        arrays[0][index] = values[0]
        arrays[1][index] = values[1]

    def scatter_three(arrays, index, values):  # type: ignore[no-untyped-def]
        arrays[0][index] = values[0]
        arrays[1][index] = values[1]
        arrays[2][index] = values[2]

    def scatter_four(arrays, index, values):  # type: ignore[no-untyped-def]
        arrays[0][index] = values[0]
        arrays[1][index] = values[1]
        arrays[2][index] = values[2]
        arrays[3][index] = values[3]

    return (scatter_none, scatter_one, scatter_two, scatter_three, scatter_four)[_check_length(arrays)]
