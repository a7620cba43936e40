"""The labels of the ``tabular`` recipe's schema: the one click ``label``, or the tasks of ``labels`` (several label
columns, each binary or a regression, with a loss weight), and what the schema refuses of them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated

from recipes import Range
from recsys.click.tasks import Task, TaskKind


@dataclass
class LabelColumn:
    column: str = "label"
    """The column holding the label."""
    positive: list[str] = field(default_factory=lambda: ["1"])
    """The values (as written in the file) that mean a click; ignored with ``threshold``."""
    negative: list[str] = field(default_factory=lambda: ["0"])
    """The values that mean no click; any other value is a malformed row (e.g. ``[-1]`` for -1/1 labels)."""
    threshold: Annotated[float, Range()] | None = None
    """Instead of values: a number >= ``threshold`` is a click (e.g. ``rating >= 4``)."""

    def __post_init__(self) -> None:
        overlap = set(self.positive) & set(self.negative)
        if self.threshold is None and overlap:
            raise ValueError(f"`positive` and `negative` must not share values, but share {sorted(overlap)}.")


@dataclass
class LabelTask(LabelColumn):
    """One task of ``labels``: a label column read as ``label`` reads its one (``positive``/``negative`` or
    ``threshold``) for ``kind: binary``, or as a number for ``kind: regression``."""

    name: str | None = None
    """The task's name, the prefix of its metrics (``valid/<name>/auc``) and of its ``predict`` columns
    (``<name>_score``); ``null``: the column's name."""
    kind: TaskKind = "binary"
    """``binary`` (a click: BCE, AUC, log loss, GAUC) or ``regression`` (the column's number: squared error,
    MSE and MAE; the model's output is the prediction itself, no sigmoid)."""
    weight: Annotated[float, Range(gt=0)] = 1.0
    """The weight of the task's per-sample loss in the sum over tasks that training minimises."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.name = self.name or self.column
        if "/" in self.name:
            raise ValueError(f"A task's `name` must not hold '/' (it prefixes metric keys), but is '{self.name}'.")
        if self.kind == "regression" and self.threshold is not None:
            raise ValueError(
                f"`threshold` must be null for the regression task '{self.name}', which reads the number itself, but "
                f"is {self.threshold}."
            )

    @property
    def task(self) -> Task:
        assert self.name is not None
        return Task(self.name, self.kind, self.weight)


def check_label_tasks(labels: list[LabelTask] | None, added_columns: Sequence[str]) -> None:
    """``labels``: at least one task, each named once and read from a column of the files (``added_columns`` are
    the joined and derived ones). ``label`` is then not read: a preset based on one with a ``label`` (or an override
    of ``labels``) names its tasks without unsetting it."""
    if labels is None:
        return
    if not labels:
        raise ValueError("`dataset.labels` must name at least one task, but is an empty list; or leave it unset.")
    names = [task.name for task in labels]
    twice = sorted({name for name in names if name is not None and names.count(name) > 1})
    if twice:
        raise ValueError(f"Each task of `labels` must have a name of its own, but {twice} are named twice.")
    added = set(added_columns)
    derived = sorted({task.column for task in labels if task.column in added})
    if derived:
        raise ValueError(f"A label must be a column of the files, but {derived} are joined or derived columns.")
