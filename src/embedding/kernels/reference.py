"""The fused sparse-optimizer step in plain torch: the oracle the fast kernels are tested against.

It favours being obviously right over being fast. It expects inputs already checked by
:func:`embedding.kernels.fused_step`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from embedding.kernels.common import concatenated
from embedding.optim_config import SparseOptimizerConfig


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
) -> None:
    """Update, in place, the rows of ``weight`` and ``state`` that ``ids`` touches.

    Occurrence ``k`` contributes ``grad_scale[k] * grad_rows[grad_index[k]]`` (``grad_rows`` read
    as the concatenation of its pieces) to the gradient of row ``ids[k]``; rows that no id
    touches are left exactly as they are.
    """
    if ids.numel() == 0:
        return
    lr = config.lr if lr is None else lr

    rows, occurrence_row = torch.unique(ids, return_inverse=True)
    occurrence_grads = concatenated(grad_rows)[grad_index]
    if grad_scale is not None:
        occurrence_grads = occurrence_grads * grad_scale.unsqueeze(1)
    grad = torch.zeros((rows.numel(), weight.size(1)), dtype=weight.dtype, device=weight.device)
    grad.index_add_(0, occurrence_row, occurrence_grads)

    w = weight[rows]
    if config.name == "adamw":
        w.mul_(1.0 - lr * config.weight_decay)
    elif config.weight_decay != 0.0:
        grad.add_(w, alpha=config.weight_decay)

    if config.name == "sgd":
        w.sub_(lr * grad)
    elif config.name == "rowwise_adagrad":
        row_sum = state["sum"][rows] + grad.square().mean(dim=1)
        multiplier = lr / (row_sum.sqrt() + config.eps)
        w.sub_(multiplier.unsqueeze(1) * grad)
        state["sum"][rows] = row_sum
    elif config.name == "adagrad":
        elem_sum = state["sum"][rows] + grad.square()
        w.sub_(lr * (grad / (elem_sum.sqrt() + config.eps)))
        state["sum"][rows] = elem_sum
    else:
        _adam_update(config, w, state, rows, grad, step, lr)

    weight[rows] = w


def _adam_update(
    config: SparseOptimizerConfig,
    w: torch.Tensor,
    state: dict[str, torch.Tensor],
    rows: torch.Tensor,
    grad: torch.Tensor,
    step: int,
    lr: float,
) -> None:
    """Adam exactly as ``torch.optim.SparseAdam`` computes it: ``eps`` is added to the square
    root of the uncorrected second moment, and both bias corrections fold into the step size."""
    exp_avg = state["exp_avg"][rows]
    exp_avg_sq = state["exp_avg_sq"][rows]
    exp_avg += (1.0 - config.beta1) * (grad - exp_avg)
    exp_avg_sq += (1.0 - config.beta2) * (grad.square() - exp_avg_sq)

    bias_correction1 = 1.0 - config.beta1**step
    bias_correction2 = 1.0 - config.beta2**step
    step_size = lr * math.sqrt(bias_correction2) / bias_correction1
    w.sub_(step_size * (exp_avg / (exp_avg_sq.sqrt() + config.eps)))

    state["exp_avg"][rows] = exp_avg
    state["exp_avg_sq"][rows] = exp_avg_sq
