"""Where published metrics go: one interface, several destinations, each a named component.

The ``metrics.recorders`` section maps recorder names to their options
(``{tensorboard: true, wandb: {enabled: true, project: P}}``); a package adds a recorder by
registering it in ``RECORDERS`` (by decorator, or through the ``recipes.recorders`` entry points).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from components import Registry


class MetricRecorder(ABC):
    """Receives the metrics of a run (``train``, or an eval unit's name) at a step.

    Only rank 0 records, so recorders need no coordination.
    """

    @abstractmethod
    def record(self, run: str, step_nr: int, values: Mapping[str, float]) -> None: ...

    def record_window(self, run: str, step_nr: int, window: str, values: Mapping[str, float]) -> None:
        """The metrics of a window of the data (``window`` is its name, ``2026-11-27``), at the step its training
        starts from. A recorder that can keep a text with the numbers (a JSONL row) overrides it; the others
        record the numbers, which hold the window's index."""
        self.record(run, step_nr, values)

    def record_config(self, config: Mapping[str, Any]) -> None:
        """Told once, before training, the resolved config (hyper-parameters)."""

    def close(self) -> None:
        """Flush and release; called once at the end, also after a failure."""


@dataclass
class RecorderConfig:
    """What every recorder takes: whether the run uses it (``metrics.recorders.console=false``)."""

    name: str = ""
    enabled: bool = True
    """Whether the run records to it (``metrics.recorders.<name>=false`` for short); a recorder whose config
    defaults it to ``False`` is off by default."""


@dataclass(frozen=True)
class RecorderContext:
    """What a recorder may need to know of the run it records."""

    output_dir: str
    resume_step: int | None
    """The step a resumed run continues after (its records of later steps are stale); ``None``: a fresh run."""
    max_num_steps: int | None
    training: bool
    """``False`` for ``eval`` and ``predict``, which print their own results."""


RecorderFactory = Callable[[Any, RecorderContext], "MetricRecorder"]
"""``factory(config, context)``: the recorder, configured by its own config dataclass."""

RECORDERS: Registry[RecorderFactory] = Registry("recorder", "recipes.recorders", RecorderConfig)


def built_in_recorders() -> dict[str, RecorderConfig]:
    """Every recorder of this folder with its default options, the default of ``metrics.recorders``: each
    config's ``enabled`` says whether a run records to it unless told otherwise (``wandb``'s is off). Another
    package's recorders are not in it: a config turns them on by name."""
    return {name: RECORDERS.get(name).default_config() for name in RECORDERS.registered_by(__package__ or "")}


class CompositeRecorder(MetricRecorder):
    """Forwards to several recorders."""

    def __init__(self, recorders: Sequence[MetricRecorder]) -> None:
        self._recorders = list(recorders)

    def record(self, run: str, step_nr: int, values: Mapping[str, float]) -> None:
        for recorder in self._recorders:
            recorder.record(run, step_nr, values)

    def record_window(self, run: str, step_nr: int, window: str, values: Mapping[str, float]) -> None:
        for recorder in self._recorders:
            recorder.record_window(run, step_nr, window, values)

    def record_config(self, config: Mapping[str, Any]) -> None:
        for recorder in self._recorders:
            recorder.record_config(config)

    def close(self) -> None:
        for recorder in self._recorders:
            recorder.close()


def build_recorder(configs: Mapping[str, RecorderConfig], context: RecorderContext) -> MetricRecorder:
    """The enabled recorders of ``metrics.recorders``, as one."""
    return CompositeRecorder(
        [RECORDERS.get(name).value(config, context) for name, config in configs.items() if config.enabled]
    )


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{'a': {'b': 1}}`` as ``{'a.b': 1}``; lists become their string form."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
    return flat
