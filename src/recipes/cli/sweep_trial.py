"""One trial of a sweep, in a process of its own: ``train`` with the trial's values, its validations reported to the
study, which may prune it.

The sweep starts this process (the hidden ``sweep-trial`` command) once per trial, so that a trial is an ordinary
``train`` of an ordinary run directory, with the process's threads and memory its own, and a crash or a kill ends
the trial and nothing else. The process reports each validation score to its Optuna trial; when the study's pruner
says the trial falls behind the trials before it, the run stops as early stopping stops it (a final checkpoint,
resumable by ``train``), and the outcome written to the run directory says ``pruned``.
"""

from __future__ import annotations

import logging

import optuna

from recipes.cli.job_spec import JobSpec
from recipes.cli.sweep_study import MedianOfEarlier, TrialResult, write_result
from recipes.cli.train import train

log = logging.getLogger(__name__)


class PruningWatch:
    """Reports every validation score to the trial (as the study maximises it) and keeps the best; stops the run
    when the pruner says so."""

    def __init__(self, trial: optuna.Trial) -> None:
        self._trial = trial
        self.best: tuple[float, int] | None = None
        self.lower_better: bool | None = None
        self.pruned = False

    def should_stop(self, step_nr: int, score: float, lower_better: bool) -> bool:
        self.lower_better = lower_better
        value = -score if lower_better else score
        if self.best is None or value > (-self.best[0] if lower_better else self.best[0]):
            self.best = (score, step_nr)
        self._trial.report(value, step_nr)
        if self._trial.should_prune():
            log.info(
                "Trial %d pruned at step %d: its score falls below the median of earlier trials.",
                self._trial.number,
                step_nr,
            )
            self.pruned = True
        return self.pruned


def run_trial(spec: JobSpec, storage: str, study_name: str, trial_id: int, prune_after: int) -> TrialResult:
    """Train the trial's run (``spec``: the preset with the trial's values, in its run directory) and write its
    outcome there."""
    study = optuna.load_study(study_name=study_name, storage=storage, pruner=MedianOfEarlier(prune_after))
    watch = PruningWatch(optuna.Trial(study, trial_id))
    output_dir = train(spec, watch)
    score, step = watch.best if watch.best is not None else (None, None)
    result = TrialResult("pruned" if watch.pruned else "complete", score, step, watch.lower_better)
    write_result(output_dir, result)
    return result
