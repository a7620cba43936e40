"""The score that ranks checkpoints: which validation metric (``trainer.score_metric``), and which way is better.

A metric knows its own direction (torchmetrics' ``higher_is_better``: an AUC higher, a loss lower), so the score
takes it from the metric: ``trainer.lower_better`` is needed only for a metric that does not say (a ``Mean`` of
anything), and refused where it contradicts the metric. Everything that ranks checkpoints (keep-best, early
stopping, the best checkpoint of ``eval``/``predict``) then agrees, through the resolved ``trainer.lower_better``
that the run's ``config.yaml`` records.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torchmetrics import Metric

from recipes.errors import ConfigError
from recipes.training.protocols import Validation
from units.grouped_metrics import BySlice
from units.metrics import Undefinable, WithoutBetterSide


@dataclass(frozen=True)
class ScoreMetric:
    """The validation metric that scores a checkpoint: ``metric`` (of the first eval unit) or ``unit/metric``, and
    whether a lower score is better (``None``: as the metric says)."""

    name: str
    lower_better: bool | None = None


@dataclass(frozen=True)
class Score:
    """A ``ScoreMetric`` resolved: the metric's key, ``unit/metric``, and whether a lower score is better."""

    key: str
    lower_better: bool


def resolve_score(score: ScoreMetric, validations: Sequence[Validation[Any]]) -> Score:
    """``score`` as ``unit/metric`` with its direction decided; a name that is no validation metric, a metric with
    no better side, a direction that contradicts the metric's, or none for a metric that does not say: one line."""
    key = score_key(score.name, validations)
    return Score(key, _lower_better(key, score_metric_of(key, validations), score.lower_better))


def score_key(name: str, validations: Sequence[Validation[Any]]) -> str:
    """``name`` as ``unit/metric``: a bare metric is the first eval unit's."""
    key = name if "/" in name or not validations else f"{validations[0].unit.name}/{name}"
    known = [f"{v.unit.name}/{metric}" for v in validations for metric in v.unit.metric_bag]
    if key not in known:
        raise ConfigError(
            f"`trainer.score_metric` must name a validation metric (one of {', '.join(known) or 'none'}), "
            f"but is '{name}' instead.{_suggestion(key, known)}"
        )
    return key


def score_metric_of(key: str, validations: Sequence[Validation[Any]]) -> Metric:
    """The metric that ``key`` (``unit/metric``, known) names."""
    return next(
        v.unit.metric_bag[key[len(v.unit.name) + 1 :]]
        for v in validations
        if key.startswith(f"{v.unit.name}/") and key[len(v.unit.name) + 1 :] in v.unit.metric_bag
    )


def refuse_unreported(key: str, step_nr: int, values: Mapping[str, float]) -> None:
    """Refuse a validation that reported no value under the score's ``key``: a metric of several values (a mapping
    from a suffix to each) with none under its own name, which start-up cannot know of a metric that does not say so
    (``BySlice``), or one the eval unit never updated. Unrefused, no checkpoint would ever be the best and early
    stopping would never stop, without a word."""
    if key in values:
        return
    reported = [name for name in values if name.startswith(key)]
    why = f"its metric reported {', '.join(reported)} instead" if reported else "the eval unit never updated its metric"
    raise ConfigError(
        f"`trainer.score_metric` must name a value the validation reports, but the validation of step {step_nr} "
        f"reported none under {key}: {why}."
    )


def why_undefined(key: str, value: float, validations: Sequence[Validation[Any]]) -> str | None:
    """Why the score ``value`` of ``key`` is no number, as its metric says after computing it; ``None`` for a
    number."""
    if not math.isnan(value):
        return None
    metric = score_metric_of(key, validations)
    reason = metric.undefined_because if isinstance(metric, Undefinable) else None
    return reason or "its metric computed no number from the validation data"


def _lower_better(key: str, metric: Metric, configured: bool | None) -> bool:
    kind = type(metric).__name__
    if isinstance(metric, BySlice):
        raise ConfigError(
            f"`trainer.score_metric` must name a metric of one value, but {key} ({kind}) reports one per slice "
            f"({key}<slice>) and none under its own name; score by a metric of all rows, such as an AUC or a loss."
        )
    if isinstance(metric, WithoutBetterSide):
        raise ConfigError(
            f"`trainer.score_metric` must name a metric of which a higher or a lower value is better, but {key} "
            f"({kind}) has no better side; score by a metric such as an AUC or a loss."
        )
    higher_is_better = metric.higher_is_better
    if higher_is_better is None:
        if configured is None:
            raise ConfigError(
                f"`trainer.lower_better` must be set for `trainer.score_metric: {key}`: its metric ({kind}) does "
                "not say whether a higher or a lower value is better."
            )
        return configured
    if configured is not None and configured == higher_is_better:
        raise ConfigError(
            f"`trainer.lower_better` must be {str(not higher_is_better).lower()} for `trainer.score_metric: {key}` "
            f"({kind}: {'higher' if higher_is_better else 'lower'} is better), but is {str(configured).lower()} "
            "instead; leave it unset to take the metric's own direction."
        )
    return not higher_is_better


def _suggestion(key: str, known: Sequence[str]) -> str:
    """A ' Did you mean ...?' for what fits ``key`` best: the same metric of another eval unit (``test/auc`` for
    ``valid/auc``), the same name spelt otherwise (``AUC``, ``logloss``), or a typo (``scor``); never another metric
    that only ends like it (``gauc``, ``pr_auc`` for ``auc``), which measures something else; for a metric of a
    group that is not one (``valid/<group>/auc``), the same metric of a group that is (the first)."""
    metric = key.split("/", 1)[-1]
    metrics = {k.split("/", 1)[1]: k for k in reversed(known)}  # The first unit's key of each metric name.

    def spelling(text: str) -> str:
        return "".join(c for c in text.lower() if c not in "_- ")

    same = [k for other, k in metrics.items() if spelling(other) == spelling(metric)]
    if not same and "/" in metric:  # A metric of a group that is not one (a task's: `valid/<task>/auc`).
        same = [
            k for other, k in metrics.items() if "/" in other and other.rsplit("/", 1)[1] == metric.rsplit("/", 1)[1]
        ]
    typos = difflib.get_close_matches(metric, [other for other in metrics if not other.endswith(metric)], n=1)
    suggestion = same[0] if same else metrics[typos[0]] if typos else None
    return "" if suggestion is None else f" Did you mean '{suggestion}'?"
