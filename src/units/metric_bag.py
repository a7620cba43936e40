"""A named set of metrics, computed together and reduced over one gang."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torchmetrics import Metric

from gang import Gang, ReduceOperation
from units.metrics import gang_gather_fn


class MetricBag:
    """The metrics of a unit, by name.

    ``compute()`` reduces every metric over ``gang`` (every rank must call it) and returns
    plain floats for recorders. A metric that computes several values (GAUC and the number of
    its groups, NE per slice) returns a mapping from a suffix to each, reported as
    ``name + suffix``: ``gauc`` and ``gauc_groups``, ``ne/`` and ``ne/mobile``. ``state_dict()``
    holds the metrics' accumulated state, so a resumed run publishes the same values as an
    uninterrupted one.
    """

    def __init__(self, gang: Gang) -> None:
        self._gang = gang
        self._metrics: dict[str, Metric] = {}

    @property
    def gang(self) -> Gang:
        return self._gang

    def register(self, name: str, metric: Metric) -> Metric:
        """Add ``metric`` under ``name``, reduced over this bag's gang; returns it.

        The metric moves to the gang's device, where the model computes: a metric left on the
        CPU fails at its first update from a GPU model's outputs.
        """
        if name in self._metrics:
            raise ValueError(f"`name` must be unique in the metric bag, but '{name}' is already registered.")
        metric.to(self._gang.device)
        metric.dist_sync_fn = gang_gather_fn(self._gang)
        metric.persistent(True)
        self._metrics[name] = metric
        return metric

    def __getitem__(self, name: str) -> Metric:
        try:
            return self._metrics[name]
        except KeyError:
            raise KeyError(f"`name` must be one of {sorted(self._metrics)}, but is '{name}' instead.") from None

    def __contains__(self, name: object) -> bool:
        return name in self._metrics

    def __iter__(self) -> Iterator[str]:
        return iter(self._metrics)

    def compute(self) -> dict[str, float]:
        """The value of every metric that has seen data, reduced over the gang."""
        values: dict[str, float] = {}
        for name, metric in self._metrics.items():
            # An unseen metric (no update since reset) has nothing to report, but must still
            # take part in the collective on every rank: ranks may differ in what they saw.
            seen = torch.tensor(1.0 if metric.update_called else 0.0, device=self._gang.device)
            self._gang.all_reduce(seen, ReduceOperation.MIN)
            if not bool(seen):
                continue
            value = metric.compute()
            if isinstance(value, Mapping):
                values.update({name + suffix: _float(part) for suffix, part in value.items()})
            else:
                values[name] = _float(value)
        return values

    def reset(self) -> None:
        for metric in self._metrics.values():
            metric.reset()

    def state_dict(self) -> dict[str, Any]:
        return {name: _metric_state(metric) for name, metric in self._metrics.items()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        for name, state in state_dict.items():
            metric = self[name]
            for key, value in state["states"].items():
                setattr(metric, key, _on(value, self._gang.device))
            metric._update_count = state["update_count"]
            metric._computed = None  # torchmetrics caches the last compute(); it no longer holds.


def _float(value: Any) -> float:
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def _on(value: Any, device: torch.device) -> Any:
    """A loaded metric state (a tensor or a list of them, as saved) on ``device``."""
    if isinstance(value, list):
        return [tensor.to(device) for tensor in value]
    return value.to(device)


def _metric_state(metric: Metric) -> dict[str, Any]:
    states = {}
    for key in metric._defaults:
        value = getattr(metric, key)
        states[key] = [t.clone() for t in value] if isinstance(value, list) else value.clone()
    return {"states": states, "update_count": metric._update_count}
