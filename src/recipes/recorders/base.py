"""Where published metrics go: one interface, several destinations."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any


class MetricRecorder(ABC):
    """Receives the metrics of a run (``train``, or an eval unit's name) at a step.

    Only rank 0 records, so recorders need no coordination.
    """

    @abstractmethod
    def record(self, run: str, step_nr: int, values: Mapping[str, float]) -> None: ...

    def record_config(self, config: Mapping[str, Any]) -> None:
        """Told once, before training, the resolved config (hyper-parameters)."""

    def close(self) -> None:
        """Flush and release; called once at the end, also after a failure."""


class CompositeRecorder(MetricRecorder):
    """Forwards to several recorders."""

    def __init__(self, recorders: Sequence[MetricRecorder]) -> None:
        self._recorders = list(recorders)

    def record(self, run: str, step_nr: int, values: Mapping[str, float]) -> None:
        for recorder in self._recorders:
            recorder.record(run, step_nr, values)

    def record_config(self, config: Mapping[str, Any]) -> None:
        for recorder in self._recorders:
            recorder.record_config(config)

    def close(self) -> None:
        for recorder in self._recorders:
            recorder.close()


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
