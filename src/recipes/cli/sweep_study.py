"""A sweep's Optuna study: where it is stored, how trials are sampled and pruned, and a killed sweep's trials recovered.

The study maximises each trial's *value*: its best validation score, negated for a score that is better lower (a
loss), so that one study serves either direction without knowing it before the first trial has built its metrics.
The true score is kept as the trial's ``score`` attribute, which the results table shows.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
import sqlalchemy.exc
from optuna.trial import FrozenTrial, TrialState

from recipes.errors import UserError

RESULT_FILE = "sweep_trial.json"
"""A trial's outcome in its run directory, written by the trial's process (or by the sweep for a trial that failed):
what a resumed sweep tells the study for a trial it had not told yet."""

# The trials' attributes, set when a trial starts: where its run directory is, and whose it is.
HOST, SWEEP_DIR, RUN_DIR, SCORE, KILLED, THREADS_SET = "host", "sweep_dir", "run_dir", "score", "killed", "threads_set"

optuna.logging.set_verbosity(optuna.logging.WARNING)


def default_storage(sweep_dir: str) -> str:
    """The study's database in the sweep's directory: a SQLite file, which Optuna's RDB storage keeps."""
    return f"sqlite:///{os.path.abspath(sweep_dir)}/study.db"


def open_study(storage: str, name: str, prune_after: int) -> optuna.Study:
    """The study ``name`` in ``storage``, created if new; it maximises the trials' values (see the module)."""
    try:
        return optuna.create_study(
            storage=storage,
            study_name=name,
            direction="maximize",
            load_if_exists=True,
            pruner=MedianOfEarlier(prune_after),
        )
    except (ImportError, ValueError, optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError) as ex:
        raise UserError(f"`--storage` must be an Optuna database URL it can open, but {storage} fails: {ex}") from None


def seed_sampler(study: optuna.Study, seed: int) -> None:
    """Give the study a TPE sampler seeded by ``seed`` and the number of the trial it samples next.

    One seeded sampler for the whole sweep would start its random stream anew in a resumed sweep, and sample the
    first trials' values again; seeded per trial, a trial's values depend only on the seed, its number and the
    results the study holds when it is asked, whether the sweep ran in one go or was resumed."""
    number = len(study.get_trials(deepcopy=False))
    study.sampler = optuna.samplers.TPESampler(seed=int(np.random.SeedSequence([seed, number]).generate_state(1)[0]))


class MedianOfEarlier(optuna.pruners.BasePruner):
    """Median pruning against the trials that had finished when this one started.

    A trial whose best value so far is below the median of those trials' values at the same step stops there, once
    ``startup`` trials have finished. Optuna's ``MedianPruner`` compares with every trial finished by now, which in a
    parallel sweep depends on how long each trial took; the trials finished before this one started are fixed by the
    order the sweep asks and tells them in, so a sweep prunes the same trials every time it runs."""

    def __init__(self, startup: int) -> None:
        self._startup = startup

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or trial.datetime_start is None:
            return False
        earlier = [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.datetime_complete is not None and t.datetime_complete < trial.datetime_start
        ]
        values = [t.intermediate_values[step] for t in earlier if step in t.intermediate_values]
        if len(earlier) < self._startup or not values:
            return False
        return max(trial.intermediate_values.values()) < statistics.median(values)


@dataclass(frozen=True)
class TrialResult:
    """What a trial's run concluded: ``complete``, ``pruned`` or ``failed``; its best score and the step of it."""

    state: str
    score: float | None = None
    step: int | None = None
    lower_better: bool | None = None
    error: str | None = None

    @property
    def value(self) -> float | None:
        """The score as the study maximises it."""
        if self.score is None:
            return None
        return -self.score if self.lower_better else self.score


def write_result(run_dir: str, result: TrialResult) -> None:
    path = os.path.join(run_dir, RESULT_FILE)
    os.makedirs(run_dir, exist_ok=True)
    with open(f"{path}.tmp", "w") as f:
        json.dump(result.__dict__, f)
    os.replace(f"{path}.tmp", path)


def read_result(run_dir: str) -> TrialResult | None:
    """The outcome the trial's process wrote, or ``None`` if it wrote none (killed, or still running)."""
    try:
        with open(os.path.join(run_dir, RESULT_FILE)) as f:
            return TrialResult(**json.load(f))
    except (OSError, ValueError, TypeError):
        return None


def live(study: optuna.Study, trial: FrozenTrial) -> optuna.Trial:
    """The running ``trial`` as a ``Trial`` that reports, prunes and takes attributes."""
    return optuna.Trial(study, trial._trial_id)


def tell(study: optuna.Study, trial: optuna.Trial, result: TrialResult) -> None:
    """Tell the study how ``trial`` ended, its true score kept as an attribute."""
    if result.score is not None:
        trial.set_user_attr(SCORE, result.score)
    if result.lower_better is not None and "lower_better" not in study.user_attrs:
        study.set_user_attr("lower_better", result.lower_better)
    if result.state == "complete" and result.value is not None:
        study.tell(trial.number, result.value)
    elif result.state == "pruned":
        study.tell(trial.number, state=TrialState.PRUNED)
    else:
        study.tell(trial.number, state=TrialState.FAIL)


def mine(trial: FrozenTrial, sweep_dir: str) -> bool:
    """Whether ``trial`` was started by a sweep of this directory on this machine."""
    attrs = trial.user_attrs
    return attrs.get(HOST) == socket.gethostname() and attrs.get(SWEEP_DIR) == os.path.abspath(sweep_dir)


def recover(study: optuna.Study, sweep_dir: str) -> list[str]:
    """Settle the trials a killed sweep of this directory left running (the directory's lock says none runs now): a
    trial whose run wrote its outcome is told it; one killed mid-run is marked failed and queued to run again with
    the same values. Returns a line for each."""
    lines = []
    for trial in sorted(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)), key=lambda t: t.number):
        if not mine(trial, sweep_dir):
            continue
        result = read_result(trial.user_attrs[RUN_DIR])
        if result is not None:
            tell(study, live(study, trial), result)
            lines.append(f"Trial {trial.number} had ended ({result.state}) when the sweep stopped: recorded.")
            continue
        live(study, trial).set_user_attr(KILLED, True)
        study.tell(trial.number, state=TrialState.FAIL)
        study.enqueue_trial(dict(trial.params), user_attrs={"rerun_of": trial.number})
        lines.append(f"Trial {trial.number} was stopped mid-run: marked failed, and its values run again.")
    return lines


def counted(trials: Sequence[FrozenTrial]) -> int:
    """The trials that count towards ``--trials``: all but those killed mid-run, whose values run again."""
    return sum(1 for t in trials if not (t.state == TrialState.FAIL and t.user_attrs.get(KILLED)))


def start_attrs(sweep_dir: str, run_dir: str, threads_set: bool) -> Mapping[str, Any]:
    return {
        HOST: socket.gethostname(),
        SWEEP_DIR: os.path.abspath(sweep_dir),
        RUN_DIR: os.path.abspath(run_dir),
        THREADS_SET: threads_set,
    }
