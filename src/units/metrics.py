"""Metrics that reduce over a gang: mean, sum, throughput, and the metrics of click prediction and regression.

They are torchmetrics metrics whose synchronisation goes through a ``Gang`` rather than the
world process group, so that a metric of the data-parallel gang is reduced over that gang
only (and over nothing in a single process).

The click-prediction metrics (log loss, normalized entropy, calibration, positive rate) keep
float64 sums, which add up over any number of ranks to the value of one process that saw all
the data; the curve metrics (``BinaryAUC``, ``BinaryAveragePrecision``) keep every prediction
and gather them, so they are exact too. Every one accepts an empty batch and is unchanged by
it, since the last batch of a data-parallel rank may have no rows.

A metric says which way is better, as torchmetrics does, by ``higher_is_better`` (``True``:
an AUC; ``False``: a loss; ``None``: not known, as of a ``Mean`` of anything); one that
describes rather than judges (calibration, the positive rate) is ``WithoutBetterSide``, and
cannot score checkpoints. A metric undefined on its rows (an AUC of one class) is NaN, never
a number that could pass for a score, and says why (``Undefinable.undefined_because``).
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


class WithoutBetterSide:
    """A metric of which neither a higher nor a lower value is better (calibration is best at 1; the positive
    rate describes the data): it cannot rank checkpoints, whatever ``trainer.lower_better`` says."""


class Undefinable:
    """A metric that is undefined (NaN) on some rows, such as those of one class: after ``compute()``,
    ``undefined_because`` says why it was (from the rows of every rank), ``None`` when it was not."""

    undefined_because: str | None = None


def one_class(num_rows: float | torch.Tensor, num_positives: float | torch.Tensor) -> str | None:
    """Why a metric that needs both classes is undefined over rows of which ``num_positives`` are 1 and the rest 0,
    or ``None`` where both classes occur."""
    rows, positives = int(num_rows), int(num_positives)
    if rows == 0:
        return "the data holds no rows"
    if 0 < positives < rows:
        return None
    return f"the data holds only label {0 if positives == 0 else 1} ({rows} rows)"


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


class Accuracy(Mean):
    """The share of correct predictions, as a ``Mean`` of each batch's share weighted by its rows: higher is better,
    so it scores checkpoints without ``trainer.lower_better`` (a plain ``Mean`` does not say which way is)."""

    higher_is_better = True


class Sum(SumMetric):
    """A running sum: ``update(value)``."""


class BinaryAUC(Undefinable, BinaryAUROC):
    """The exact ROC AUC of binary targets: ``update(probabilities, targets)``. Over rows of one class (or none),
    NaN: torchmetrics' 0.0 there would read as the worst model, and its warning would say it once."""

    higher_is_better = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(thresholds=None, **kwargs)

    def compute(self) -> torch.Tensor:  # type: ignore[override]  # As torchmetrics' own subclass does.
        targets = _all_targets(self.target)
        self.undefined_because = one_class(targets.numel(), (targets == 1).sum())
        if self.undefined_because is not None:
            return torch.tensor(float("nan"))
        return super().compute()


def _all_targets(state: list[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """A curve metric's targets of every row seen (after a sync a tensor; before, a list that may be empty)."""
    if isinstance(state, list) and not state:
        return torch.zeros(0)
    return dim_zero_cat(state)


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


def normalized_entropy(
    loss_sum: torch.Tensor, target_sum: torch.Tensor, count: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """NE from its sums (elementwise, so per slice too), and where it is undefined: rows of one class, whose base
    rate's entropy is 0 (NaN there; TorchRec's clamp of the base rate gives about 1e12 times the log loss, a number
    that ranks a checkpoint), or no rows at all."""
    undefined = (target_sum <= 0.0) | (target_sum >= count)
    base_rate = torch.where(undefined, 0.5, target_sum / count)
    # The base rate's log loss summed over the rows, so that the counts cancel in the ratio.
    base_loss_sum = -(target_sum * base_rate.log() + (count - target_sum) * torch.log1p(-base_rate))
    return torch.where(undefined, float("nan"), loss_sum / base_loss_sum), undefined


class NormalizedEntropy(Undefinable, Metric):
    """Log loss relative to always predicting the base rate: ``update(logits, targets)``.

    NE as TorchRec defines it: the mean log loss over the entropy of the base rate
    ``p = mean(targets)``, ``-(p log p + (1 - p) log(1 - p))``. Below 1, the model beats the
    constant predictor; unlike log loss, it compares across data sets of different click rates.

    Where all targets are 0 (or all 1), that entropy is 0 and NE undefined: ``compute()`` is NaN
    (TorchRec clamps the base rate instead, and reports about 1e12 times the log loss, which would
    rank as a dreadful model rather than as no measurement). Over no rows at all, NaN too.
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
        value, undefined = normalized_entropy(self.loss_sum, self.target_sum, self.count)
        self.undefined_because = one_class(self.count, self.target_sum) if bool(undefined) else None
        return value


class Calibration(WithoutBetterSide, Metric):
    """Predicted clicks over actual clicks: ``update(logits, targets)``.

    TorchRec's definition, ``sum(sigmoid(logits)) / sum(targets)``: 1 when the model predicts
    as many clicks as there were, above 1 when it over-predicts. Where no target is positive
    (no rows at all included) the ratio is undefined and ``compute()`` is NaN (TorchRec's 0.0
    there would read as a model that predicts no click).
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
        return torch.where(self.target_sum > 0.0, self.prediction_sum / self.target_sum, float("nan"))


class BinaryAveragePrecision(Undefinable, _TorchmetricsAveragePrecision):
    """The exact average precision (area under the precision-recall curve) of binary targets.

    ``update(probabilities, targets)``, targets as integers, like ``BinaryAUC``. Where clicks
    are rare, ROC AUC is dominated by the many easy negatives; PR-AUC shows how clean the top
    of the ranking is. Where no target is positive, recall is undefined and ``compute()`` is NaN
    (torchmetrics' 0.0 would read as the worst model), as over no rows at all.
    """

    higher_is_better = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(thresholds=None, **kwargs)

    def compute(self) -> torch.Tensor:  # type: ignore[override]  # As torchmetrics' own subclass does.
        targets = _all_targets(self.target)
        num_positives = int((targets == 1).sum())
        self.undefined_because = one_class(targets.numel(), num_positives) if num_positives == 0 else None
        if self.undefined_because is not None:
            return torch.tensor(float("nan"))
        return super().compute()


class PositiveRate(WithoutBetterSide, Metric):
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


# Regression ------------------------------------------------------------------------------------


class _MeanError(Metric):
    """The mean of ``|prediction - target| ** power`` over every row: ``update(predictions, targets)``, float64 sums
    (exact over any number of ranks); NaN over no rows. Lower is better."""

    full_state_update = False
    is_differentiable = False
    higher_is_better = False
    power = 2
    error_sum: torch.Tensor
    count: torch.Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("error_sum", default=_float64_zero(), dist_reduce_fx="sum")
        self.add_state("count", default=_float64_zero(), dist_reduce_fx="sum")

    def update(self, predictions: torch.Tensor, targets: torch.Tensor) -> None:
        predictions, targets = _logits_and_targets(predictions, targets)
        self.error_sum += (predictions - targets).abs().pow(self.power).sum()
        self.count += targets.numel()

    def compute(self) -> torch.Tensor:
        return self.error_sum / self.count


class MeanSquaredError(_MeanError):
    """The mean squared error of a regression task's predictions (its model outputs as they are)."""


class MeanAbsoluteError(_MeanError):
    """The mean absolute error of a regression task's predictions, in the target's own unit."""

    power = 1
