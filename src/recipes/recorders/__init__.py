"""Metric recorders: TensorBoard, JSONL, WandB and the console, and any a package registers."""

from recipes.recorders.base import (
    RECORDERS,
    CompositeRecorder,
    MetricRecorder,
    RecorderConfig,
    RecorderContext,
    build_recorder,
)
from recipes.recorders.console import ConsoleRecorder
from recipes.recorders.jsonl import JsonlRecorder
from recipes.recorders.tensorboard import TensorBoardRecorder
from recipes.recorders.wandb import WandbConfig, WandbRecorder

__all__ = [
    "RECORDERS",
    "CompositeRecorder",
    "ConsoleRecorder",
    "JsonlRecorder",
    "MetricRecorder",
    "RecorderConfig",
    "RecorderContext",
    "TensorBoardRecorder",
    "WandbConfig",
    "WandbRecorder",
    "build_recorder",
]
