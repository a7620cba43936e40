"""The fused sparse-optimizer step in plain torch: the oracle the fast kernels are tested against.

It favours being obviously right over being fast: it sums each touched row's gradient with
``index_add_`` and calls the optimizer's own update functions (those the kernels compile) on all
the touched rows at once, as tensors. It expects inputs already checked by
:func:`embedding.kernels.fused_step`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from embedding.kernels.common import concatenated, gather, scatter, state_tensors, step_factors
from embedding.kernels.rounding import RowKeys, random_bits, round_array
from embedding.kernels.sorted_ids import SortedIds
from embedding.optimizers import SparseOptimizerConfig, spec_of
from embedding.optimizers.optimizer_spec import TOUCHES


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
    sorted_ids: SortedIds | None = None,
    row_keys: RowKeys | None = None,
) -> None:
    """Update, in place, the rows of ``weight`` and ``state`` that ``ids`` touches.

    Occurrence ``k`` contributes ``grad_scale[k] * grad_rows[grad_index[k]]`` (``grad_rows`` read
    as the concatenation of its pieces) to the gradient of row ``ids[k]``; rows that no id
    touches are left exactly as they are. ``sorted_ids`` is not read: the oracle needs no sort. A half-precision
    ``weight``'s rows are computed in float32 and rounded stochastically, keyed by ``row_keys``.
    """
    if ids.numel() == 0:
        return
    spec = spec_of(config)
    decays, decay, factors = step_factors(spec, config, step, config.lr if lr is None else lr)

    rows, occurrence_row = torch.unique(ids, return_inverse=True)
    occurrence_grads = concatenated(grad_rows)[grad_index]
    if grad_scale is not None:
        occurrence_grads = occurrence_grads * grad_scale.unsqueeze(1)
    grad = torch.zeros((rows.numel(), weight.size(1)), dtype=torch.float32, device=weight.device)
    grad.index_add_(0, occurrence_row, occurrence_grads)

    row_states, element_states = state_tensors(spec, state)
    row_decay: torch.Tensor | np.float32 = decay
    if spec.counts_touches:
        touches = state[TOUCHES.name]
        touched = touches[rows] + 1
        touches[rows] = touched
        row_decay = spec.weight_decay.per_touch(decay, touched).unsqueeze(1)
    w = weight[rows].float()
    if decays:
        w, grad = spec.weight_decay.apply(w, grad, row_decay)
    multiplier: torch.Tensor | np.float32 = np.float32(1)
    if spec.update_row is not None:
        row_values, row_multiplier = spec.update_row(gather(row_states, rows), grad.square().mean(dim=1), factors)
        scatter(row_states, rows, row_values)
        multiplier = row_multiplier.unsqueeze(1)
    w, element_values = spec.update_element(w, grad, multiplier, gather(element_states, rows), factors)
    if weight.dtype == torch.float32:
        weight[rows] = w
    else:
        assert row_keys is not None, "fused_step gives a half-precision table its keys."
        random = random_bits(row_keys, rows.cpu().numpy(), step, weight.size(1))
        weight[rows] = round_array(w.cpu(), random, weight.dtype).to(weight.device)
    scatter(element_states, rows, element_values)
