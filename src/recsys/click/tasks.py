"""The tasks of a multi-task click model: what each column of a batch's ``labels [B, T]`` is, and how much its
loss counts.

One model serves several objectives at once (a click and a rating, say) from one shared bottom: a task is a
binary label (a click: BCE of a logit, scored by AUC and log loss) or a regression target (a number: squared
error of the raw output, scored by MSE and MAE). The order of the tasks is the order of the columns of the
labels and of the model's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TaskKind = Literal["binary", "regression"]
BINARY: TaskKind = "binary"
REGRESSION: TaskKind = "regression"


@dataclass(frozen=True)
class Task:
    """One objective: its ``name`` (the prefix of its metrics, ``<name>/auc``), its ``kind``, and the ``weight``
    of its loss in the sum over tasks."""

    name: str
    kind: TaskKind = BINARY
    weight: float = 1.0

    @property
    def binary(self) -> bool:
        return self.kind == BINARY
