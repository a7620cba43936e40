"""Adagrad: each element steps by the learning rate over the root of its summed squared gradients."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from numba.extending import register_jitable

from components import NonNegativeFloat, PositiveFloat
from embedding.optimizers.optimizer_config import SPARSE_OPTIMIZERS, SparseOptimizerConfig
from embedding.optimizers.optimizer_spec import OptimizerState, SparseOptimizerSpec, sqrt


@dataclass(frozen=True)
class AdagradConfig(SparseOptimizerConfig):
    name: str = "adagrad"
    eps: PositiveFloat = 1e-8
    """Added to the denominator, for numerical stability."""
    initial_accumulator_value: NonNegativeFloat = 0.0
    """The sum of squared gradients a row starts from."""


@register_jitable  # type: ignore[untyped-decorator]
def update_element(weight: Any, grad: Any, row_multiplier: Any, states: Any, factors: Any) -> tuple[Any, Any]:
    """The element's squared gradient joins its sum, whose root divides its step."""
    (squares,) = states
    lr, eps = factors
    squares = squares + grad * grad
    return weight - lr * (grad / (sqrt(squares) + eps)), (squares,)


@SPARSE_OPTIMIZERS.register("adagrad", AdagradConfig)
def adagrad(config: AdagradConfig) -> SparseOptimizerSpec:
    return SparseOptimizerSpec(
        states=(OptimizerState("sum", initial_value=config.initial_accumulator_value),),
        factors=lambda step, lr: (lr, config.eps),
        update_element=update_element,
    )
