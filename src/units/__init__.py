"""Units: what a batch means for training (``TrainUnit``) and validation (``EvalUnit``), and their metrics."""

from units.metric_bag import MetricBag
from units.metrics import (
    BinaryAUC,
    BinaryAveragePrecision,
    Calibration,
    LogLoss,
    Mean,
    NormalizedEntropy,
    PositiveRate,
    Sum,
    Throughput,
)
from units.unit import BatchT, EvalUnit, TrainUnit

__all__ = [
    "BatchT",
    "BinaryAUC",
    "BinaryAveragePrecision",
    "Calibration",
    "EvalUnit",
    "LogLoss",
    "Mean",
    "MetricBag",
    "NormalizedEntropy",
    "PositiveRate",
    "Sum",
    "Throughput",
    "TrainUnit",
]
