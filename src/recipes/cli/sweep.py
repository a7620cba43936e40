"""``sweep``: a hyper-parameter search over a preset, each trial an ordinary run directory under the sweep's.

The sweep asks its Optuna study for each trial's values, checks them against the config, and trains the trial in a
process of its own (``sweep_trial``), at most ``--parallel`` at a time, the machine's cores split between them. It
tells the study how trials ended in the order it asked them, and asks a new trial only while fewer than
``--parallel`` are untold: every trial is then asked, and pruned, against the same earlier results whichever
trial finished first, so a sweep of a given seed and ``--parallel`` runs the same trials every time. (The first
trials, which TPE samples at random, are the same for any ``--parallel``.) The price is a slot left idle while a
finished trial waits for an earlier, slower one.

The study lives in the sweep's directory (``study.db``) or in ``--storage``; a sweep run again resumes it: the
trials it finished are kept, one killed mid-run is marked failed and its values run again, and ``--trials`` counts
the study's trials, so the sweep runs only what is left.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import IO, Any

import optuna
from optuna.trial import TrialState

from recipes.cli.job import resolve_job
from recipes.cli.job_spec import JobSpec
from recipes.cli.launch import EXIT_USER_ERROR, LAUNCHER_PID_ENV
from recipes.cli.sweep_results import format_table, results_rows, write_best, write_hparams, write_tables
from recipes.cli.sweep_space import Space, check_space, parse_space, read_space_file, refuse_overridden
from recipes.cli.sweep_study import (
    RUN_DIR,
    TrialResult,
    counted,
    default_storage,
    open_study,
    read_result,
    recover,
    seed_sampler,
    start_attrs,
    tell,
    write_result,
)
from recipes.config.presets import find_preset, preset_chain
from recipes.errors import ConfigError, TrainingInterrupted, UserError
from recipes.runtime.threads import threads_per_rank

POLL_S = 0.1


@dataclass(frozen=True)
class SweepRequest:
    """What the user asked of ``sweep``."""

    spec: JobSpec
    trials: int
    parallel: int = 1
    space_file: str | None = None
    storage: str | None = None
    seed: int = 0
    prune_after: int = 5


@dataclass
class _Slot:
    """A trial asked and not yet told: its process while it runs, its outcome once it ended."""

    trial: optuna.Trial
    run_dir: str
    process: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None
    result: TrialResult | None = None
    params: dict[str, Any] = field(default_factory=dict)


def sweep(request: SweepRequest) -> list[str]:
    """Run the sweep to ``request.trials`` trials; returns the lines of its summary (the table, the best trial)."""
    if request.trials < 1:
        raise UserError(f"`--trials` must be >= 1, but is {request.trials} instead.")
    if request.parallel < 1:
        raise UserError(f"`--parallel` must be >= 1, but is {request.parallel} instead.")
    spec = request.spec
    sweep_dir = spec.output_dir or os.path.join("sweeps", os.path.splitext(os.path.basename(spec.preset))[0])
    job = resolve_job(spec)
    space = _space(request)
    refuse_overridden(space, spec.overrides)
    score_name = job.config.trainer.score_metric
    if score_name is None:
        raise ConfigError("`trainer.score_metric` must name the validation metric the sweep optimises, but is unset.")
    check_space(space, lambda layer, source: resolve_job(spec, [(source, layer)]))
    threads = _threads(request.parallel, job.config.gang.threads_per_rank)
    storage = request.storage or default_storage(sweep_dir)
    if request.storage is None:
        os.makedirs(sweep_dir, exist_ok=True)
    study = open_study(storage, job.preset.name, request.prune_after)  # A URL it cannot open: before DIR is made.
    os.makedirs(sweep_dir, exist_ok=True)
    with _sweep_lock(sweep_dir):
        for line in recover(study, sweep_dir):
            print(line)
        runner = _Runner(request, space, sweep_dir, storage, study, threads, str(score_name))
        runner.run()
        return runner.summary()


def _space(request: SweepRequest) -> Space:
    if request.space_file is not None:
        return read_space_file(request.space_file)
    preset = find_preset(request.spec.preset)
    for link in preset_chain(preset):
        if link.sweep is not None:
            return parse_space(link.sweep, f"preset '{link.name}' ({link.source})")
    raise UserError(
        f"The preset '{preset.name}' must declare a `sweep:` space to sweep without `--space FILE`, but none in its "
        "chain does."
    )


def _as_overrides(params: Mapping[str, Any], prefix: str = "") -> list[str]:
    """A layer (or a trial's values by key) as ``key=value`` overrides, each value as JSON, which YAML reads back."""
    overrides = []
    for key, value in params.items():
        if isinstance(value, Mapping):
            overrides += _as_overrides(value, f"{prefix}{key}.")
        else:
            overrides.append(f"{prefix}{key}={json.dumps(value)}")
    return overrides


def _threads(parallel: int, configured: int | None) -> int | None:
    """Each trial's threads: the cores split between the parallel trials, unless the config sets them."""
    if parallel == 1 or configured is not None:
        return None
    return max(1, threads_per_rank(None) // parallel)  # The cores this process may run on, split.


@contextlib.contextmanager
def _sweep_lock(sweep_dir: str) -> Iterator[None]:
    """One sweep at a time in a directory: a second would tell the first's trials."""
    with open(os.path.join(sweep_dir, "sweep.lock"), "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(
                f"The sweep directory {sweep_dir} must be used by one sweep at a time, but another runs."
            ) from None
        yield


class _Runner:
    """The loop of a sweep: ask, start, collect and tell trials, in order."""

    def __init__(
        self,
        request: SweepRequest,
        space: Space,
        sweep_dir: str,
        storage: str,
        study: optuna.Study,
        threads: int | None,
        score_name: str,
    ) -> None:
        self._request = request
        self._space = space
        self._dir = sweep_dir
        self._storage = storage
        self._study = study
        self._threads = threads
        self._score_name = score_name
        self._untold: list[_Slot] = []

    def run(self) -> None:
        """Run trials until the study holds ``--trials``. Ctrl-C or SIGTERM stops the running trials (each saves its
        checkpoint); a trial stopped by a user error (exit code 2: a data path, say, which every trial would meet)
        stops the sweep with its line."""
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            while True:
                for slot in self._untold:
                    if slot.result is None and slot.process is not None and slot.process.poll() is not None:
                        slot.result = self._collect(slot)
                while self._untold and self._untold[0].result is not None:
                    self._tell(self._untold.pop(0))
                while len(self._untold) < self._request.parallel and self._can_ask():
                    self._untold.append(self._start())
                if not self._untold:
                    return
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            self._stop_all()
            raise TrainingInterrupted(
                "the sweep was interrupted; its ended trials are kept, and the same command resumes it."
            ) from None
        except BaseException:
            self._stop_all()
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)

    def _can_ask(self) -> bool:
        trials = self._study.get_trials(deepcopy=False)
        waiting = any(t.state == TrialState.WAITING for t in trials)
        return waiting or counted(trials) < self._request.trials

    def _start(self) -> _Slot:
        seed_sampler(self._study, self._request.seed)
        trial = self._study.ask(self._space.distributions())
        run_dir = os.path.join(self._dir, f"trial_{trial.number:04d}")
        for key, value in start_attrs(self._dir, run_dir, self._threads is not None).items():
            trial.set_user_attr(key, value)
        slot = _Slot(trial, run_dir, params=dict(trial.params))
        spec = self._request.spec
        overrides = [*spec.overrides, *_as_overrides(slot.params)]
        if self._threads is not None:
            overrides.append(f"gang.threads_per_rank={self._threads}")
        try:
            resolve_job(replace(spec, output_dir=run_dir, overrides=overrides))
        except UserError as ex:  # These values together: refused by the config.
            slot.result = TrialResult("failed", error=str(ex))
            return slot
        os.makedirs(run_dir, exist_ok=True)
        command = [sys.executable, "-m", "recipes", "sweep-trial", spec.preset, "-o", run_dir]
        command += ["--storage", self._storage, "--study", self._study.study_name, "--trial-id", str(trial._trial_id)]
        command += ["--prune-after", str(self._request.prune_after)]
        for path in spec.config_files:
            command += ["--config-file", path]
        for override in overrides:
            command += ["--config", override]
        env = dict(os.environ, **{LAUNCHER_PID_ENV: str(os.getpid())})
        if self._threads is not None:
            env["NUMBA_NUM_THREADS"] = str(self._threads)
        slot.log = open(os.path.join(run_dir, "console.log"), "ab")  # noqa: SIM115 - closed when collected
        # A session of its own: a terminal's Ctrl-C reaches the sweep alone, which forwards one SIGINT (a second would
        # stop the trial without its checkpoint).
        slot.process = subprocess.Popen(
            command, stdout=slot.log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        print(f"Trial {trial.number} started: {_shown(slot.params)} -> {run_dir}", flush=True)
        return slot

    def _collect(self, slot: _Slot) -> TrialResult:
        """The outcome of a trial whose process ended: the one it wrote, or a failure with its last line."""
        assert slot.process is not None and slot.log is not None
        slot.log.close()
        result = read_result(slot.run_dir)
        if slot.process.returncode == 0 and result is not None:
            return result
        with open(os.path.join(slot.run_dir, "console.log"), errors="replace") as f:
            lines = [line.strip() for line in f if line.strip()]
        error = lines[-1] if lines else f"exit code {slot.process.returncode}"
        result = TrialResult("failed", error=error)
        write_result(slot.run_dir, result)
        return result

    def _tell(self, slot: _Slot) -> None:
        assert slot.result is not None
        tell(self._study, slot.trial, slot.result)
        result = slot.result
        if result.score is not None:
            outcome = f"{self._score_name}={result.score:.6g} at step {result.step}"
        else:
            outcome = str(result.error)
        print(f"Trial {slot.trial.number} {result.state}: {outcome}", flush=True)
        self._write_results()
        if slot.process is not None and slot.process.returncode == EXIT_USER_ERROR:
            raise UserError(f"Trial {slot.trial.number} stopped on a user error: {outcome.removeprefix('error: ')}")

    def _write_results(self) -> None:
        trials = self._study.get_trials(deepcopy=False)
        keys = [r.key for r in self._space.ranges]
        write_tables(self._dir, results_rows(trials, keys))
        for trial in trials:
            if trial.state in (TrialState.COMPLETE, TrialState.PRUNED) and trial.user_attrs.get(RUN_DIR, "").startswith(
                os.path.abspath(self._dir)
            ):
                write_hparams(self._dir, trial, self._score_name, self._space.distributions())
        write_best(self._dir, self._study, self._score_name)

    def _stop_all(self) -> None:
        """Stop the running trials (a Ctrl-C or a failure of the sweep): each saves its checkpoint and exits, and a
        resumed sweep runs its values again."""
        for slot in self._untold:
            if slot.process is not None and slot.process.poll() is None:
                slot.process.send_signal(signal.SIGINT)
        for slot in self._untold:
            if slot.process is not None:
                slot.process.wait()
            if slot.log is not None:
                slot.log.close()

    def summary(self) -> list[str]:
        trials = self._study.get_trials(deepcopy=False)
        rows = results_rows(trials, [r.key for r in self._space.ranges])
        lines = [format_table(rows, self._score_name), f"Wrote {self._dir}/results.csv and results.parquet."]
        best = write_best(self._dir, self._study, self._score_name)
        if best is not None:
            lines.append(best)
        lines.append(f"Compare the trials with: tensorboard --logdir {self._dir}/hparams")
        return lines


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _shown(params: dict[str, Any]) -> str:
    return " ".join(
        f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}" for key, value in params.items()
    )
