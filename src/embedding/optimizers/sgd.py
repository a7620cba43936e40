"""Plain stochastic gradient descent: no state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from numba.extending import register_jitable

from embedding.optimizers.optimizer_config import SPARSE_OPTIMIZERS, SparseOptimizerConfig
from embedding.optimizers.optimizer_spec import SparseOptimizerSpec


@dataclass(frozen=True)
class SGDConfig(SparseOptimizerConfig):
    name: str = "sgd"


@register_jitable  # type: ignore[untyped-decorator]
def update_element(weight: Any, grad: Any, row_multiplier: Any, states: Any, factors: Any) -> tuple[Any, Any]:
    """A step of ``lr`` against the gradient."""
    (lr,) = factors
    return weight - lr * grad, states


@SPARSE_OPTIMIZERS.register("sgd", SGDConfig)
def sgd(config: SGDConfig) -> SparseOptimizerSpec:
    return SparseOptimizerSpec(states=(), factors=lambda step, lr: (lr,), update_element=update_element)
