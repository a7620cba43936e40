"""The ``soft_sgd`` sparse optimizer: a step of ``lr * g / (softness + |g|)`` against each gradient element.

Large gradients take steps of about ``lr`` at most, small ones about ``lr * g / softness``: SGD that no rare,
huge gradient throws far. It has no state. The update is one ``register_jitable`` function that the CPU and CUDA
kernels compile and the reference calls on whole tensors, so it uses arithmetic and ``abs`` only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numba.extending import register_jitable

from components import PositiveFloat
from embedding.optimizers import SPARSE_OPTIMIZERS, SparseOptimizerConfig, SparseOptimizerSpec


@dataclass(frozen=True)
class SoftSGDConfig(SparseOptimizerConfig):
    name: str = "soft_sgd"
    softness: PositiveFloat = 0.01


@register_jitable
def update_element(weight: Any, grad: Any, row_multiplier: Any, states: Any, factors: Any) -> tuple[Any, Any]:
    lr, softness = factors
    return weight - lr * grad / (softness + abs(grad)), states


@SPARSE_OPTIMIZERS.register("soft_sgd", SoftSGDConfig)
def soft_sgd(config: SoftSGDConfig) -> SparseOptimizerSpec:
    softness = np.float32(config.softness)
    return SparseOptimizerSpec(states=(), factors=lambda step, lr: (lr, softness), update_element=update_element)
