"""Metric recorders: TensorBoard, JSONL, WandB and the console, and any a package registers.

Each built-in recorder is a module of this folder that registers it in ``RECORDERS`` by decorator (see
:mod:`recipes.recorders.base`). Every module here is imported with the package, so a new built-in
recorder is a new module and nothing else; ``metrics.recorders`` lists them all by default, each on or
off as its config's ``enabled`` says. Another package offers its own through the entry-point group
``recipes.recorders``.
"""

from components import import_submodules
from recipes.recorders.base import (
    RECORDERS,
    CompositeRecorder,
    MetricRecorder,
    RecorderConfig,
    RecorderContext,
    build_recorder,
    built_in_recorders,
)

import_submodules(__name__, __path__)

__all__ = [
    "RECORDERS",
    "CompositeRecorder",
    "MetricRecorder",
    "RecorderConfig",
    "RecorderContext",
    "build_recorder",
    "built_in_recorders",
]
