"""Validation during training: run the eval units, record their metrics, score, and say when to stop early.

The Trainer asks its validator at every ``trainer.validate_every_n_steps`` and at the end; what a
validation scores (``trainer.score_metric``) ranks checkpoints and feeds the early stopper. A run
with nothing to validate has the ``NOOP_VALIDATOR``, so the Trainer never checks for one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from recipes.config.sections import MetricsSection
from recipes.errors import ConfigError
from recipes.recorders import MetricRecorder
from recipes.training.data_reader import DataError, DataReader
from recipes.training.early_stopping import NOOP_EARLY_STOPPER, EarlyStopper
from recipes.training.evaluation import evaluate
from recipes.training.precision import Autocast
from recipes.training.protocols import Validation
from recipes.training.score import ScoreMetric, refuse_unreported, resolve_score, why_undefined
from units.grouped_metrics import ByGroup, BySlice

WINDOW_RUN = "window"
"""The run that holds the metrics of each window of the training data, scored before it is trained on."""


@dataclass(frozen=True)
class Validated:
    """What one validation concluded: its score (``None`` without a score metric) and whether to stop."""

    score: float | None
    stop: bool


class Validator(ABC):
    """Validates the model at a step; checkpointed with the Trainer (its early stopper's memory)."""

    @abstractmethod
    def validate(self, step_nr: int) -> Validated: ...

    def score_window(self, step_nr: int, window_index: int, window_name: str, reader: DataReader[Any]) -> None:
        """Score the current model on a window of the training data before it trains on it (predict, then train:
        the online metric), recorded as the run ``window`` at ``step_nr``, the step its training starts from.
        A run without eval units scores nothing."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` captured."""


class NoopValidator(Validator):
    """Validates nothing: the validator of a run without eval units."""

    def validate(self, step_nr: int) -> Validated:
        return Validated(None, stop=False)


NOOP_VALIDATOR = NoopValidator()


class EvalUnitValidator(Validator):
    """Runs every validation (an eval unit over its reader) with the model in eval mode, and records each
    unit's metrics under its name on rank 0.

    ``score`` must name one of the units' metrics, checked now rather than at the first validation (with its
    direction, ``training.score``); ``early_stopper`` is told every score. A score that is no number (an AUC of a
    split of one class) stops the run at that validation, before its checkpoint: it would rank as a number.
    """

    def __init__(
        self,
        validations: Sequence[Validation[Any]],
        model: nn.Module,
        recorder: MetricRecorder,
        rank: int,
        autocast: Autocast,
        score: ScoreMetric | None = None,
        early_stopper: EarlyStopper = NOOP_EARLY_STOPPER,
    ) -> None:
        self._validations = list(validations)
        self._model = model
        self._recorder = recorder
        self._rank = rank
        self._autocast = autocast
        self._early_stopper = early_stopper
        self._score_key = None if score is None else resolve_score(score, validations).key

    def validate(self, step_nr: int) -> Validated:
        self._model.eval()
        scores: dict[str, float] = {}
        try:
            for validation in self._validations:
                values = evaluate(validation, self._autocast)
                if self._rank == 0:
                    self._recorder.record(validation.unit.name, step_nr, values)
                scores.update({f"{validation.unit.name}/{name}": value for name, value in values.items()})
        finally:
            self._model.train()
        score = None
        if self._score_key is not None:
            refuse_unreported(self._score_key, step_nr, scores)
            score = scores[self._score_key]
        self._refuse_undefined(step_nr, score)
        stop = score is not None and self._early_stopper.should_stop(step_nr, score)
        return Validated(score, stop)

    def score_window(self, step_nr: int, window_index: int, window_name: str, reader: DataReader[Any]) -> None:
        """Scored by the first eval unit (the one a score names by default), with the window's index among the
        values so that every recorder can tell the windows apart."""
        if not self._validations:
            return
        self._model.eval()
        try:
            values = evaluate(Validation(self._validations[0].unit, reader), self._autocast)
        finally:
            self._model.train()
        reader.close()
        values["window_index"] = float(window_index)
        if self._rank == 0:
            self._recorder.record_window(WINDOW_RUN, step_nr, window_name, values)

    def _refuse_undefined(self, step_nr: int, score: float | None) -> None:
        if score is None or self._score_key is None:
            return
        why = why_undefined(self._score_key, score, self._validations)
        if why is not None:
            raise DataError(
                f"`trainer.score_metric` {self._score_key} must be a number to rank checkpoints, but is NaN at the "
                f"validation of step {step_nr}: {why}."
            )

    def state_dict(self) -> dict[str, Any]:
        return self._early_stopper.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._early_stopper.load_state_dict(state_dict)


def refuse_ignored_metric_columns(section: MetricsSection, validations: Sequence[Validation[Any]]) -> None:
    """``metrics.group_by`` and ``slice_by`` are the recipe's to honour (only it knows its batches' columns): one
    that no eval unit's metric groups or slices by would be ignored without a word, so it stops the run now. A metric
    says it honours them by its marker (``units.grouped_metrics.ByGroup``, ``BySlice``), which the built-in grouped and
    sliced metrics carry and a user's own can carry too."""
    metrics = [v.unit.metric_bag[name] for v in validations for name in v.unit.metric_bag]
    for key, verb, column, marker, built_in in (
        ("group_by", "groups", section.group_by, ByGroup, "GroupedAUC"),
        ("slice_by", "slices", section.slice_by, BySlice, "SlicedNormalizedEntropy or SlicedCalibration"),
    ):
        if column is not None and not any(isinstance(metric, marker) for metric in metrics):
            raise ConfigError(
                f"`metrics.{key}` is '{column}', but no metric of the recipe's eval units {verb} the rows (one marked "
                f"`units.grouped_metrics.{marker.__name__}`, such as {built_in}): the recipe ignores it. Unset it, or "
                "give the recipe's eval unit such a metric over that column."
            )


def make_validator(
    validations: Sequence[Validation[Any]],
    model: nn.Module,
    recorder: MetricRecorder,
    rank: int,
    autocast: Autocast,
    score: ScoreMetric | None = None,
    early_stopper: EarlyStopper = NOOP_EARLY_STOPPER,
) -> Validator:
    """The validator of ``validations``; ``NOOP_VALIDATOR`` for none, unless a score is asked of them (an error)."""
    if not validations and score is None:
        return NOOP_VALIDATOR
    return EvalUnitValidator(validations, model, recorder, rank, autocast, score, early_stopper)
