"""Adam, and AdamW (Adam with decoupled weight decay), as ``torch.optim.SparseAdam`` computes them.

``eps`` is added to the square root of the uncorrected second moment, and both bias corrections
fold into the step size, which is therefore one number per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from numba.extending import register_jitable

from components import PositiveFloat, Range
from embedding.optimizers.optimizer_config import SPARSE_OPTIMIZERS, SparseOptimizerConfig
from embedding.optimizers.optimizer_spec import (
    DECOUPLED,
    L2_PENALTY,
    OptimizerState,
    SparseOptimizerSpec,
    WeightDecay,
    sqrt,
)

Beta = Annotated[float, Range(ge=0, lt=1)]


@dataclass(frozen=True)
class AdamConfig(SparseOptimizerConfig):
    name: str = "adam"
    beta1: Beta = 0.9
    """The decay of the gradient's running mean."""
    beta2: Beta = 0.999
    """The decay of the squared gradient's running mean."""
    eps: PositiveFloat = 1e-8
    """Added to the denominator, for numerical stability."""


@dataclass(frozen=True)
class AdamWConfig(AdamConfig):
    """Adam's options: AdamW differs only in how it decays weights."""

    name: str = "adamw"


@register_jitable  # type: ignore[untyped-decorator]
def update_element(weight: Any, grad: Any, row_multiplier: Any, states: Any, factors: Any) -> tuple[Any, Any]:
    """Both moments move towards the gradient's; the step is the first over the root of the second."""
    exp_avg, exp_avg_sq = states
    one_minus_beta1, one_minus_beta2, eps, step_size = factors
    exp_avg = exp_avg + one_minus_beta1 * (grad - exp_avg)
    exp_avg_sq = exp_avg_sq + one_minus_beta2 * (grad * grad - exp_avg_sq)
    return weight - step_size * (exp_avg / (sqrt(exp_avg_sq) + eps)), (exp_avg, exp_avg_sq)


def _adam_spec(config: AdamConfig, weight_decay: WeightDecay) -> SparseOptimizerSpec:
    def factors(step: int, lr: float) -> tuple[float, ...]:
        bias_correction1 = 1.0 - config.beta1**step
        bias_correction2 = 1.0 - config.beta2**step
        step_size = lr * math.sqrt(bias_correction2) / bias_correction1
        return 1.0 - config.beta1, 1.0 - config.beta2, config.eps, step_size

    return SparseOptimizerSpec(
        states=(OptimizerState("exp_avg"), OptimizerState("exp_avg_sq")),
        factors=factors,
        update_element=update_element,
        weight_decay=weight_decay,
    )


@SPARSE_OPTIMIZERS.register("adam", AdamConfig)
def adam(config: AdamConfig) -> SparseOptimizerSpec:
    return _adam_spec(config, L2_PENALTY)


@SPARSE_OPTIMIZERS.register("adamw", AdamWConfig)
def adamw(config: AdamWConfig) -> SparseOptimizerSpec:
    return _adam_spec(config, DECOUPLED)
