"""Metric recorders: TensorBoard, JSONL, WandB and the console."""

from recipes.recorders.base import CompositeRecorder, MetricRecorder
from recipes.recorders.console import ConsoleRecorder
from recipes.recorders.jsonl import JsonlRecorder
from recipes.recorders.tensorboard import TensorBoardRecorder
from recipes.recorders.wandb import WandbRecorder

__all__ = [
    "CompositeRecorder",
    "ConsoleRecorder",
    "JsonlRecorder",
    "MetricRecorder",
    "TensorBoardRecorder",
    "WandbRecorder",
]
