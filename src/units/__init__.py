"""Units: what a batch means for training (``TrainUnit``) and validation (``EvalUnit``), and their metrics."""

from units.grouped_metrics import (
    MAX_SLICES,
    ByGroup,
    BySlice,
    GroupedAUC,
    SlicedCalibration,
    SlicedNormalizedEntropy,
    TooManySlicesError,
)
from units.metric_bag import MetricBag
from units.metrics import (
    Accuracy,
    BinaryAUC,
    BinaryAveragePrecision,
    Calibration,
    LogLoss,
    Mean,
    MeanAbsoluteError,
    MeanSquaredError,
    NormalizedEntropy,
    PositiveRate,
    Sum,
    Throughput,
)
from units.unit import BatchT, EvalUnit, TrainUnit

__all__ = [
    "MAX_SLICES",
    "Accuracy",
    "BatchT",
    "BinaryAUC",
    "BinaryAveragePrecision",
    "ByGroup",
    "BySlice",
    "Calibration",
    "EvalUnit",
    "GroupedAUC",
    "LogLoss",
    "Mean",
    "MeanAbsoluteError",
    "MeanSquaredError",
    "MetricBag",
    "NormalizedEntropy",
    "PositiveRate",
    "SlicedCalibration",
    "SlicedNormalizedEntropy",
    "Sum",
    "Throughput",
    "TooManySlicesError",
    "TrainUnit",
]
