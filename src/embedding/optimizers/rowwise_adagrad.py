"""FBGEMM's row-wise Adagrad: one accumulator per row, fed the row's mean squared gradient.

One float of state per row instead of one per element is what makes it the cheap default for
large tables. Every element of a row steps by the same multiplier, the row's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from numba.extending import register_jitable

from embedding.optimizers.adagrad import AdagradConfig
from embedding.optimizers.optimizer_config import SPARSE_OPTIMIZERS
from embedding.optimizers.optimizer_spec import OptimizerState, SparseOptimizerSpec, sqrt


@dataclass(frozen=True)
class RowwiseAdagradConfig(AdagradConfig):
    """Adagrad's options: the accumulator is the row's, not each element's."""

    name: str = "rowwise_adagrad"


@register_jitable  # type: ignore[untyped-decorator]
def update_row(states: Any, mean_square: Any, factors: Any) -> tuple[Any, Any]:
    """The row's mean squared gradient joins its sum; the row's step size is ``lr`` over its root."""
    (squares,) = states
    lr, eps = factors
    squares = squares + mean_square
    return (squares,), lr / (sqrt(squares) + eps)


@register_jitable  # type: ignore[untyped-decorator]
def update_element(weight: Any, grad: Any, row_multiplier: Any, states: Any, factors: Any) -> tuple[Any, Any]:
    """A step of the row's step size against the gradient."""
    return weight - row_multiplier * grad, states


@SPARSE_OPTIMIZERS.register("rowwise_adagrad", RowwiseAdagradConfig)
def rowwise_adagrad(config: RowwiseAdagradConfig) -> SparseOptimizerSpec:
    return SparseOptimizerSpec(
        states=(OptimizerState("sum", per_row=True, initial_value=config.initial_accumulator_value),),
        factors=lambda step, lr: (lr, config.eps),
        update_element=update_element,
        update_row=update_row,
    )
