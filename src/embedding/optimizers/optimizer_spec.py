"""What a sparse optimizer is to the code that runs it: the state it keeps, the numbers an update
takes, and the update itself, written once for every kernel.

Each optimizer's module (see :mod:`embedding.optimizers`) registers the function of its config to
its :class:`SparseOptimizerSpec`. The kernels know no optimizer by name: the CPU and CUDA kernels
compile the spec's functions into their loops, and the torch reference calls the very same
functions on whole tensors. Memory accounting, the state checks and a table's fresh state read
the spec's state layout.

The update functions are ``numba.extending.register_jitable``: plain Python when called from
Python (by the reference, on tensors; by numba's CUDA simulator, on numpy scalars), compiled for
the target of the kernel that calls them. They take and return scalars (one element's weight,
gradient and state; one row's statistic), never arrays: the CPU kernel calls them once per
element from a parallel loop, where a call taking arrays would update their reference counts
each time, which made that kernel several times slower.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numba.extending import overload, register_jitable

UpdateFunction = Callable[..., tuple[Any, Any]]
"""A ``register_jitable`` function of scalars (or, from the reference, of tensors)."""


def sqrt(value: Any) -> Any:
    """The square root, for update functions that one source serves on every target:
    ``torch.sqrt`` on the reference's tensors, ``np.sqrt`` (float32) in the CPU kernel,
    ``math.sqrt`` in the CUDA kernel and its simulator. ``np.sqrt`` does not compile for CUDA,
    nor does ``math.sqrt`` take a tensor."""
    return torch.sqrt(value) if isinstance(value, torch.Tensor) else math.sqrt(value)


@overload(sqrt, target="cpu")
def _sqrt_on_cpu(value):  # type: ignore[no-untyped-def]
    return lambda value: np.sqrt(value)


@overload(sqrt, target="cuda")
def _sqrt_on_cuda(value):  # type: ignore[no-untyped-def]
    return lambda value: math.sqrt(value)


@register_jitable  # type: ignore[untyped-decorator]
def _l2_penalty(weight: Any, grad: Any, weight_decay: Any) -> tuple[Any, Any]:
    """The gradient of the penalty ``weight_decay / 2 * weight**2`` joins the gradient."""
    return weight, grad + weight_decay * weight


@register_jitable  # type: ignore[untyped-decorator]
def _decoupled_decay(weight: Any, grad: Any, keep: Any) -> tuple[Any, Any]:
    """The weight shrinks by ``lr * weight_decay`` of itself, apart from the gradient (AdamW's decay)."""
    return keep * weight, grad


@register_jitable  # type: ignore[untyped-decorator]
def _penalty_per_touch(weight_decay: Any, touches: Any) -> Any:
    return weight_decay / touches


@register_jitable  # type: ignore[untyped-decorator]
def _keep_per_touch(keep: Any, touches: Any) -> Any:
    one = touches / touches  # 1 in the type of ``touches`` on every target: a literal would be a float64
    return one - (one - keep) / touches


@dataclass(frozen=True)
class WeightDecay:
    """How ``weight_decay`` acts on an element before its update, when it is not 0.

    ``apply(weight, grad, factor) -> (weight, grad)`` is ``register_jitable``; ``factor(lr,
    weight_decay)`` is the number it takes, rounded to float32 once per step.
    ``per_touch(factor, touches) -> factor``, also ``register_jitable``, is the factor of a row
    whose id has been stepped ``touches`` times (this step included), for optimizers configured
    with ``weight_decay_by_frequency``: the decay divided by ``touches``.
    """

    apply: UpdateFunction
    factor: Callable[[float, float], float]
    per_touch: Callable[[Any, Any], Any]


L2_PENALTY = WeightDecay(_l2_penalty, lambda lr, weight_decay: weight_decay, _penalty_per_touch)
"""Weight decay as an L2 penalty added to the gradient: what most optimizers do."""

DECOUPLED = WeightDecay(_decoupled_decay, lambda lr, weight_decay: 1.0 - lr * weight_decay, _keep_per_touch)
"""Weight decay decoupled from the gradient, as ``torch.optim.AdamW`` does it."""


@dataclass(frozen=True)
class OptimizerState:
    """One tensor of state an optimizer keeps for a table, named in its state dict and checkpoints:
    one value per element of the table (``[rows, dim]``), or one per row (``[rows]``)."""

    name: str
    per_row: bool = False
    initial_value: float = 0.0
    """The value of a row that no step has touched yet."""


TOUCHES = OptimizerState("touches", per_row=True)
"""The steps that have touched each row: the state that ``weight_decay_by_frequency`` adds to any
optimizer's, kept and checkpointed with it."""


@dataclass(frozen=True)
class SparseOptimizerSpec:
    """A sparse optimizer as its config makes it: its state, the factors of an update and the update.

    A kernel updates each row a step touches, once its gradient is summed over the row's
    occurrences: it applies ``weight_decay`` to every element (unless the config's is 0), then
    ``update_row`` if there is one, then ``update_element`` to every element. Both update
    functions are ``register_jitable`` and read the step's ``factors`` (a tuple of float32), in
    the order ``factors`` returns them:

    * ``update_row(states, mean_square, factors) -> (states, multiplier)`` takes the values of the
      per-row states (a tuple, in declared order) and the mean of the row's squared gradient, and
      returns their new values and the multiplier that ``update_element`` receives. Per-row
      state needs a row step, which alone updates it.
    * ``update_element(weight, grad, row_multiplier, states, factors) -> (weight, states)`` takes
      one element's weight, gradient and per-element state values (a tuple, in declared order),
      and the row's multiplier (1 without a row step); it returns the element's new weight and
      state values.

    With ``counts_touches`` (the config's ``weight_decay_by_frequency``) the kernel also counts in
    :data:`TOUCHES` the steps that touch each row, and decays the row by ``weight_decay.per_touch``.
    """

    states: tuple[OptimizerState, ...]
    """The optimizer's own state, which its update functions take."""
    factors: Callable[[int, float], tuple[float, ...]]
    """The numbers an update takes, from the step (this one included) and the learning rate."""
    update_element: UpdateFunction
    update_row: UpdateFunction | None = None
    weight_decay: WeightDecay = L2_PENALTY
    counts_touches: bool = False

    def __post_init__(self) -> None:
        names = [state.name for state in self.layout]
        if len(set(names)) != len(names):
            raise ValueError(f"The states of a sparse optimizer must have distinct names, but are {names} instead.")
        if self.row_states and self.update_row is None:
            raise ValueError(
                f"A sparse optimizer with per-row state must have a row step to update it, but has per-row states "
                f"{list(self.row_states)} and no row step instead."
            )

    @property
    def layout(self) -> tuple[OptimizerState, ...]:
        """Every state tensor the optimizer keeps for a table: its own, then the touch counts if it counts them."""
        return (*self.states, TOUCHES) if self.counts_touches else self.states

    @property
    def row_states(self) -> tuple[str, ...]:
        """The names of the per-row states, in the order ``update_row`` takes them."""
        return tuple(state.name for state in self.states if state.per_row)

    @property
    def element_states(self) -> tuple[str, ...]:
        """The names of the per-element states, in the order ``update_element`` takes them."""
        return tuple(state.name for state in self.states if not state.per_row)

    def floats_per_row(self, dim: int) -> int:
        """The floats one row of a ``dim``-wide table takes with its state."""
        return dim + sum(1 if state.per_row else dim for state in self.layout)

    def fresh_state(
        self, num_rows: int, dim: int, dtype: torch.dtype, device: torch.device | str
    ) -> dict[str, torch.Tensor]:
        """The state of ``num_rows`` rows that no step has touched yet, by state name."""
        return {
            state.name: torch.full(
                (num_rows,) if state.per_row else (num_rows, dim), state.initial_value, dtype=dtype, device=device
            )
            for state in self.layout
        }
