"""Units: what a batch means for training (``TrainUnit``) and validation (``EvalUnit``), and their metrics."""

from units.metric_bag import MetricBag
from units.metrics import BinaryAUC, Mean, Sum, Throughput
from units.unit import BatchT, EvalUnit, TrainUnit

__all__ = ["BatchT", "BinaryAUC", "EvalUnit", "Mean", "MetricBag", "Sum", "Throughput", "TrainUnit"]
