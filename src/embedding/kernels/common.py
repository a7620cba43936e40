"""What the kernels share: the optimizer codes they branch on, which state each optimizer keeps,
the scalar factors of an update (rounded to float32 once, as torch does), and the gradient
rows as one tensor for the backends that take them so."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from embedding.optim_config import SparseOptimizerConfig

SGD, ROWWISE_ADAGRAD, ADAGRAD, ADAM, ADAMW = range(5)

OPTIMIZER_CODES = {"sgd": SGD, "rowwise_adagrad": ROWWISE_ADAGRAD, "adagrad": ADAGRAD, "adam": ADAM, "adamw": ADAMW}


def state_tensors(
    config: SparseOptimizerConfig, state: dict[str, torch.Tensor]
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The per-row state, and the first and second per-element states, of ``config``'s optimizer."""
    if config.name == "rowwise_adagrad":
        return state["sum"], None, None
    if config.name == "adagrad":
        return None, state["sum"], None
    if config.name in ("adam", "adamw"):
        return None, state["exp_avg"], state["exp_avg_sq"]
    return None, None, None


def update_factors(config: SparseOptimizerConfig, step: int, lr: float) -> tuple[np.float32, ...]:
    """``lr``, weight decay, the decoupled decay factor, eps, 1 - beta1, 1 - beta2, Adam's step size."""
    bias_correction1 = 1.0 - config.beta1**step
    bias_correction2 = 1.0 - config.beta2**step
    return (
        np.float32(lr),
        np.float32(config.weight_decay),
        np.float32(1.0 - lr * config.weight_decay),
        np.float32(config.eps),
        np.float32(1.0 - config.beta1),
        np.float32(1.0 - config.beta2),
        np.float32(lr * math.sqrt(bias_correction2) / bias_correction1),
    )


def concatenated(grad_rows: Sequence[torch.Tensor]) -> torch.Tensor:
    """The pieces of ``grad_rows`` as one contiguous tensor (a copy unless there is one piece)."""
    if len(grad_rows) == 1 and grad_rows[0].is_contiguous():
        return grad_rows[0]
    return torch.cat([piece.contiguous() for piece in grad_rows])
