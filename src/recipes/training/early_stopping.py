"""Deciding, from validation scores, that training has stopped improving."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class EarlyStopper(Protocol):
    """Told every validation score; says when to stop. A user's own stopper implements this.

    It is checkpointed with the trainer, so ``state_dict``/``load_state_dict`` must capture
    whatever it remembers.
    """

    def should_stop(self, step_nr: int, score: float) -> bool: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None: ...


class PatienceEarlyStopper:
    """Stops after ``patience`` validations in a row that fail to beat the best score by ``min_delta``."""

    def __init__(self, patience: int, min_delta: float = 0.0, lower_better: bool = False) -> None:
        if patience < 1:
            raise ValueError(f"`patience` must be >= 1, but is {patience} instead.")
        self._patience = patience
        self._min_delta = min_delta
        self._lower_better = lower_better
        self._best: float | None = None
        self._num_bad = 0

    def should_stop(self, step_nr: int, score: float) -> bool:
        if self._best is None or self._improves(score):
            self._best = score
            self._num_bad = 0
        else:
            self._num_bad += 1
        return self._num_bad >= self._patience

    def _improves(self, score: float) -> bool:
        assert self._best is not None
        if self._lower_better:
            return score < self._best - self._min_delta
        return score > self._best + self._min_delta

    def state_dict(self) -> dict[str, Any]:
        return {"best": self._best, "num_bad": self._num_bad}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._best = state_dict["best"]
        self._num_bad = state_dict["num_bad"]


class NoopEarlyStopper:
    """Never stops: the early stopper of a run without ``trainer.early_stopping.patience``."""

    def should_stop(self, step_nr: int, score: float) -> bool:
        return False

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        pass


NOOP_EARLY_STOPPER = NoopEarlyStopper()


class ScoreWatch(Protocol):
    """Told every validation score of a run beside its early stopper, from outside the run's config (a sweep's
    pruner, which compares the run with other runs); says when to stop. It keeps nothing a checkpoint must hold: the
    run stays an ordinary run, which ``train`` resumes without it."""

    def should_stop(self, step_nr: int, score: float, lower_better: bool) -> bool: ...


class WatchedEarlyStopper:
    """An early stopper that a watch may stop too; both are told every score. Only the stopper's state is
    checkpointed, in its own layout, so that a run resumed without the watch reads it back."""

    def __init__(self, stopper: EarlyStopper, watch: ScoreWatch, lower_better: bool) -> None:
        self._stopper = stopper
        self._watch = watch
        self._lower_better = lower_better

    def should_stop(self, step_nr: int, score: float) -> bool:
        stop = self._stopper.should_stop(step_nr, score)
        return self._watch.should_stop(step_nr, score, self._lower_better) or stop

    def state_dict(self) -> dict[str, Any]:
        return self._stopper.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._stopper.load_state_dict(state_dict)
