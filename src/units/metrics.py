"""Metrics that reduce over a gang: mean, sum, throughput, and the metrics of click prediction.

They are torchmetrics metrics whose synchronisation goes through a ``Gang`` rather than the
world process group, so that a metric of the data-parallel gang is reduced over that gang
only (and over nothing in a single process).

The click-prediction metrics (log loss, normalized entropy, calibration, positive rate) keep
float64 sums, which add up over any number of ranks to the value of one process that saw all
the data; the curve metrics (``BinaryAUC``, ``BinaryAveragePrecision``) keep every prediction
and gather them, so they are exact too. Every one accepts an empty batch and is unchanged by
it, since the last batch of a data-parallel rank may have no rows.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torchmetrics import Metric
from torchmetrics.aggregation import SumMetric
from torchmetrics.classification import BinaryAUROC
from torchmetrics.classification import BinaryAveragePrecision as _TorchmetricsAveragePrecision
from torchmetrics.utilities.data import dim_zero_cat

from gang import Gang


def gang_gather_fn(gang: Gang) -> Callable[..., list[torch.Tensor]]:
    """A torchmetrics ``dist_sync_fn`` that gathers a tensor from every rank of ``gang``.

    Tensors may differ in their first dimension across ranks (a list state such as the
    predictions of an AUC), so sizes are exchanged first and the tensors padded to the
    largest.
    """

    def gather(tensor: torch.Tensor, group: Any = None) -> list[torch.Tensor]:
        if gang.size == 1:
            return [tensor]
        tensor = tensor.contiguous()
        local_shape = torch.tensor(tensor.shape, dtype=torch.int64, device=gang.device)
        shapes = torch.empty((gang.size, *local_shape.shape), dtype=torch.int64, device=gang.device)
        gang.all_gather(shapes, local_shape)
        if tensor.dim() == 0:
            output = torch.empty((gang.size,), dtype=tensor.dtype, device=tensor.device)
            gang.all_gather(output, tensor)
            return list(output.unbind(0))
        max_rows = int(shapes[:, 0].max())
        padded = torch.zeros((max_rows, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        padded[: tensor.shape[0]] = tensor
        output = torch.empty((gang.size, *padded.shape), dtype=tensor.dtype, device=tensor.device)
        gang.all_gather(output, padded)
        return [output[rank, : int(shapes[rank, 0])] for rank in range(gang.size)]

    return gather


class Mean(Metric):
    """A weighted mean: ``update(value, weight)``.

    The Trainer updates several means every step, so this one does only the arithmetic:
    torchmetrics' ``MeanMetric`` casts and NaN-checks its inputs first, which cost three
    times as much per call and buy nothing where values are finite by construction.
    """

    full_state_update = False
    total: torch.Tensor
    weight: torch.Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, value: float | torch.Tensor, weight: float | torch.Tensor = 1.0) -> None:
        if isinstance(value, torch.Tensor) and value.numel() > 1:
            weights = torch.as_tensor(weight, dtype=torch.float64).expand(value.shape)
            self.total += (value.detach().to(torch.float64) * weights).sum()
            self.weight += weights.sum()
        else:
            self.total += float(value) * float(weight)
            self.weight += float(weight)

    def compute(self) -> torch.Tensor:
        return self.total / self.weight


class Sum(SumMetric):
    """A running sum: ``update(value)``."""


class BinaryAUC(BinaryAUROC):
    """The exact ROC AUC of binary targets: ``update(probabilities, targets)``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(thresholds=None, **kwargs)


class Throughput(Metric):
    """A rate, in units per second: ``update(num_units)`` counts, the clock starts at reset.

    Across a gang, units add up and the elapsed time is the slowest rank's, which is the
    throughput of the whole job.
    """

    full_state_update = False
    count: torch.Tensor
    elapsed: torch.Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("count", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("elapsed", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="max")
        self._start = time.perf_counter()

    def update(self, num_units: float | torch.Tensor) -> None:
        self.count += float(num_units)
        self.elapsed.fill_(time.perf_counter() - self._start)

    def compute(self) -> torch.Tensor:
        if float(self.elapsed) <= 0.0:
            return torch.tensor(0.0, dtype=torch.float64)
        return self.count / self.elapsed

    def reset(self) -> None:
        super().reset()
        self._start = time.perf_counter()


# Click prediction -----------------------------------------------------------------------------

# TorchRec's clamp of the base rate inside the logs of normalized entropy: it keeps the
# denominator of a label set with no positives (or no negatives) above zero, so NE stays finite.
NE_BASE_RATE_EPS = 1e-12


def _flat_float64(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().reshape(-1).to(torch.float64)


def _logits_and_targets(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both flattened to float64, so that a model's ``(N, 1)`` output meets ``(N,)`` labels."""
    flat_logits, flat_targets = _flat_float64(logits), _flat_float64(targets)
    if flat_logits.numel() != flat_targets.numel():
        raise ValueError(
            f"`logits` and `targets` must have as many elements, but have {flat_logits.numel()} "
            f"and {flat_targets.numel()} instead."
        )
    return flat_logits, flat_targets


def _float64_zero() -> torch.Tensor:
    return torch.tensor(0.0, dtype=torch.float64)


class LogLoss(Metric):
    """The mean binary cross-entropy of logits: ``update(logits, targets)``.

    It is computed from logits rather than probabilities, so that a confident wrong prediction
    costs its true (large) loss instead of ``log`` of a probability rounded to 0 or 1. Over no
    rows at all the mean is undefined, and ``compute()`` says so with NaN.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = False
    loss_sum: torch.Tensor
    count: torch.Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("loss_sum", default=_float64_zero(), dist_reduce_fx="sum")
        self.add_state("count", default=_float64_zero(), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        logits, targets = _logits_and_targets(logits, targets)
        self.loss_sum += F.binary_cross_entropy_with_logits(logits, targets, reduction="sum")
        self.count += targets.numel()

    def compute(self) -> torch.Tensor:
        return self.loss_sum / self.count


class NormalizedEntropy(Metric):
    """Log loss relative to always predicting the base rate: ``update(logits, targets)``.

    NE as TorchRec defines it: the mean log loss over the entropy of the base rate
    ``p = mean(targets)``, ``-(p log p + (1 - p) log(1 - p))``. Below 1, the model beats the
    constant predictor; unlike log loss, it compares across data sets of different click rates.

    Where all targets are 0 (or all 1), that entropy is 0. Like TorchRec, the ``p`` inside the
    logs is clamped to ``[NE_BASE_RATE_EPS, 1 - NE_BASE_RATE_EPS]`` (the weights ``p``, ``1 - p``
    are not), so NE is finite but very large, about ``1e12`` times the log loss: a dashboard sees
    an outlier, not an infinity or NaN that breaks its averages. Over no rows at all,
    ``compute()`` is NaN.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = False
    loss_sum: torch.Tensor
    target_sum: torch.Tensor
    count: torch.Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("loss_sum", default=_float64_zero(), dist_reduce_fx="sum")
        self.add_state("target_sum", default=_float64_zero(), dist_reduce_fx="sum")
        self.add_state("count", default=_float64_zero(), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        logits, targets = _logits_and_targets(logits, targets)
        self.loss_sum += F.binary_cross_entropy_with_logits(logits, targets, reduction="sum")
        self.target_sum += targets.sum()
        self.count += targets.numel()

    def compute(self) -> torch.Tensor:
        base_rate = (self.target_sum / self.count).clamp(NE_BASE_RATE_EPS, 1.0 - NE_BASE_RATE_EPS)
        # The base rate's log loss summed over the rows, so that the counts cancel in the ratio.
        base_loss_sum = -(self.target_sum * base_rate.log() + (self.count - self.target_sum) * torch.log1p(-base_rate))
        return self.loss_sum / base_loss_sum


class Calibration(Metric):
    """Predicted clicks over actual clicks: ``update(logits, targets)``.

    TorchRec's definition, ``sum(sigmoid(logits)) / sum(targets)``: 1 when the model predicts
    as many clicks as there were, above 1 when it over-predicts. Where no target is positive
    (no rows at all included) the ratio is undefined and ``compute()`` returns 0.0, as TorchRec
    does, rather than NaN or infinity, which would poison an average over steps.
    """

    full_state_update = False
    is_differentiable = False
    prediction_sum: torch.Tensor
    target_sum: torch.Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("prediction_sum", default=_float64_zero(), dist_reduce_fx="sum")
        self.add_state("target_sum", default=_float64_zero(), dist_reduce_fx="sum")

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        logits, targets = _logits_and_targets(logits, targets)
        self.prediction_sum += torch.sigmoid(logits).sum()
        self.target_sum += targets.sum()

    def compute(self) -> torch.Tensor:
        return torch.where(self.target_sum > 0.0, self.prediction_sum / self.target_sum, 0.0)


class BinaryAveragePrecision(_TorchmetricsAveragePrecision):
    """The exact average precision (area under the precision-recall curve) of binary targets.

    ``update(probabilities, targets)``, targets as integers, like ``BinaryAUC``. Where clicks
    are rare, ROC AUC is dominated by the many easy negatives; PR-AUC shows how clean the top
    of the ranking is. Where no target is positive, recall is undefined and ``compute()``
    returns 0.0 (torchmetrics' value, without its warning); over no rows at all, NaN.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(thresholds=None, **kwargs)

    def compute(self) -> torch.Tensor:  # type: ignore[override]  # As torchmetrics' own subclass does.
        # After a sync the states are tensors; before, lists that may hold nothing at all.
        if isinstance(self.target, list) and not self.target:
            return torch.tensor(float("nan"))
        targets = dim_zero_cat(self.target)
        if targets.numel() == 0:
            return torch.tensor(float("nan"))
        if not bool((targets == 1).any()):
            return torch.tensor(0.0)
        return super().compute()


class PositiveRate(Metric):
    """The mean of the targets, the click-through rate of the data: ``update(targets)``.

    Beside calibration, it tells a shift in the data from a shift in the model. Over no rows
    at all, ``compute()`` is NaN.
    """

    full_state_update = False
    is_differentiable = False
    target_sum: torch.Tensor
    count: torch.Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("target_sum", default=_float64_zero(), dist_reduce_fx="sum")
        self.add_state("count", default=_float64_zero(), dist_reduce_fx="sum")

    def update(self, targets: torch.Tensor) -> None:
        flat = _flat_float64(targets)
        self.target_sum += flat.sum()
        self.count += flat.numel()

    def compute(self) -> torch.Tensor:
        return self.target_sum / self.count
