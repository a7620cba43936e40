"""From the gradients of a step's summed loss to those of its mean loss over the whole global step, clipped.

Units return their loss unreduced and the Trainer back-propagates its sum, so that micro-batches and ranks of
different sizes weigh each target alike; only once every rank's targets are counted can the gradients be divided.
"""

from __future__ import annotations

import torch
from torch.optim import Optimizer

from recipes.training.parallel import DenseGradients
from recipes.training.protocols import SparseGradientScaling


class MeanGradients:
    """Normalises ``optimizer``'s gradients by the step's targets over the DP gang (``dp_size`` replicas) and clips
    them to ``max_grad_norm`` where set, with ``grad_scaler``'s fp16 loss scale taken out.

    DDP (and FSDP2) average dense gradients over the DP gang, so multiplying by ``dp_size`` over the global number
    of targets gives the mean. Sparse tables sum their gradients over the ranks instead, outside ``param_groups``
    (``SparseGradientScaling``). The fp16 loss scaler unscales (and checks) the dense gradients itself, but not
    the sparse ones, which are unscaled here. Without it, normalisation and clipping take one pass over the
    gradients. Like torchtune, the norm is not taken without clipping: on a small model it cost 1.5% of the step,
    more than the rest of the Trainer's own work.
    """

    def __init__(
        self, optimizer: Optimizer, grad_scaler: torch.amp.GradScaler, dp_size: int, max_grad_norm: float | None
    ) -> None:
        self._optimizer = optimizer
        self._grad_scaler = grad_scaler
        self._dp_size = dp_size
        self._max_grad_norm = max_grad_norm
        self._dense = DenseGradients(optimizer.param_groups)
        self._sparse = optimizer if isinstance(optimizer, SparseGradientScaling) else None
        """Sparse tables' gradients, outside ``param_groups``; found once: a protocol's isinstance takes 50 us."""

    def normalize_and_clip(self, total_targets: float) -> float | None:
        """Divide the gradients by the step's ``total_targets`` (over every rank) and clip them; returns their
        norm before clipping, which only clipping takes (``None`` without it)."""
        total = max(total_targets, 1.0)
        factor = self._dp_size / total
        scaler = self._grad_scaler
        if self._sparse is not None:
            loss_scale = scaler.get_scale() if scaler.is_enabled() else 1.0
            self._sparse.scale_sparse_gradients(1.0 / (total * loss_scale))
        if scaler.is_enabled():
            self._dense.scale_(factor)
            scaler.unscale_(self._optimizer)
            factor = 1.0
        if self._max_grad_norm is not None:
            return self._dense.scale_and_clip_(factor, self._max_grad_norm)
        if factor != 1.0:
            self._dense.scale_(factor)
        return None
