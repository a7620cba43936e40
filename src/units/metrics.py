"""Metrics that reduce over a gang: mean, sum, throughput and binary AUC.

They are torchmetrics metrics whose synchronisation goes through a ``Gang`` rather than the
world process group, so that a metric of the data-parallel gang is reduced over that gang
only (and over nothing in a single process).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torchmetrics import Metric
from torchmetrics.aggregation import SumMetric
from torchmetrics.classification import BinaryAUROC

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
