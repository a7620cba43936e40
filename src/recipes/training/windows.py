"""Data in windows, as the Trainer meets it (online training): finding the reader of windows, saying what its data
holds, and moving on to the next window.

A ``WindowedReader`` (``recipes.training.protocols``) says whether its next window is there, and which it is; every rank
asks its own and the ranks agree in one collective per look, so that all start the same window together, or all
stop. ``OnlineWindows`` is what the Trainer drives: when the reader runs out, the window it read has ended; the
next is waited for, scored by the current model, then trained on (predict, then train), up to the window limit.
What a window's end means to the model and its checkpoints stays the Trainer's (it is told, ``window_ended``).
The lines that say what the data holds name the windows that wait for their done-file, at start-up, while the run
waits, and when the data ends: such a window is trained once it is complete, and the user must know it is not yet.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Generic, Literal, TypeVar

import torch

from gang import Gang, ReduceOperation
from recipes.training.data_reader import DataReader
from recipes.training.pipeline import PipelinedReader
from recipes.training.protocols import WindowedReader
from recipes.training.validator import Validator

log = logging.getLogger(__name__)

NextWindow = Literal["started", "end", "stop"]

BatchT = TypeVar("BatchT")

DISAGREEMENT_LIMIT_S = 300.0
"""How long the ranks may keep finding different windows before the run stops: a window that lands is seen by
every rank within a look or a few (a network filesystem's cached listing: a minute); ranks that still differ after
this see different files, and would wait for ever."""


def windows_of(reader: DataReader[Any]) -> WindowedReader | None:
    """The reader of data in windows behind ``reader`` (the pipeline's, which has no step read ahead when a
    window ends), or ``None``."""
    inner = reader.wrapped if isinstance(reader, PipelinedReader) else reader
    return inner if isinstance(inner, WindowedReader) else None


@dataclass(frozen=True)
class OnlineWindows(Generic[BatchT]):
    """The Trainer's data in windows: the step that starts the next window, once the one read has ended.

    ``reader`` is the Trainer's reader (``windows``, or the pipeline around it), ``validator`` scores each window
    before it is trained on, and ``max_num_windows`` (``trainer.max_num_windows``) ends training.
    """

    windows: WindowedReader
    reader: DataReader[BatchT]
    root: Gang
    validator: Validator
    max_num_windows: int | None

    @classmethod
    def of(
        cls, reader: DataReader[BatchT], root: Gang, validator: Validator, max_num_windows: int | None
    ) -> OnlineWindows[BatchT] | None:
        """The windows of ``reader``'s data, or ``None`` for data that is not in windows."""
        windows = windows_of(reader)
        return None if windows is None else cls(windows, reader, root, validator, max_num_windows)

    def announce(self) -> None:
        """At start-up, the line that says what the data in windows holds: the windows that wait for their
        done-file (on the console too, where any do)."""
        _say(f"Data in windows: {self.windows.waiting_for()}", self.windows, self.root)

    def next_step(
        self, step_nr: int, stop_requested: Callable[[], bool], window_ended: Callable[[int], None]
    ) -> tuple[list[BatchT] | None, bool]:
        """The first step of the next window, after the reader ran out at ``step_nr``; ``None`` when training ends,
        with whether the ranks agreed to stop while waiting (a stop request, which saves a checkpoint as any stop
        does).

        The window just read ends first: at the window limit training ends (whose end saves the last checkpoint);
        else ``window_ended`` is told how many windows are done (before the next is waited for, so that a
        checkpoint it saves loses nothing to a kill while waiting). A window that fills no step is scored and
        passed over.
        """
        windows = self.windows
        while True:
            if windows.window_index >= 0 and not self._goes_on_after_window(step_nr, window_ended):
                return None, False
            moved = next_window(windows, self.root, stop_requested)
            if moved != "started":
                return None, moved == "stop"
            log.info("Window %d (%s) starts at step %d.", windows.window_index, windows.window_name, step_nr)
            scoring_reader = windows.window_scoring_reader()
            self.validator.score_window(step_nr + 1, windows.window_index, windows.window_name, scoring_reader)
            try:
                return next(self.reader), False
            except StopIteration:
                log.warning("The window %s fills no training step; it is passed over.", windows.window_name)

    def _goes_on_after_window(self, step_nr: int, window_ended: Callable[[int], None]) -> bool:
        """Whether training goes on after the window just read; tells ``window_ended`` if so."""
        num_done = self.windows.window_index + 1
        log.info("Window %s is done (%d windows so far) at step %d.", self.windows.window_name, num_done, step_nr)
        if self.max_num_windows is not None and num_done >= self.max_num_windows:
            return False
        window_ended(num_done)
        return True


def next_window(windows: WindowedReader, root: Gang, stop_requested: Callable[[], bool]) -> NextWindow:
    """``started`` once every rank found the same window to train next, and started it; ``end`` at the end of
    the data; ``stop`` when a rank was asked to stop (a signal) meanwhile. While the reader follows the data and
    no window is there, it says once what it waits for and asks again every ``poll_interval_s``; so it does
    while the ranks found different windows (one is landing: a rank saw it complete, another not yet), for at
    most ``DISAGREEMENT_LIMIT_S``."""
    announced = False
    disagreeing_looks = 0
    while True:
        ready = windows.next_window_ready()
        start = windows.next_window_start() if ready else 0.0
        # Any rank's end, wait or stop; the latest and the earliest window the ranks found.
        looks = [float(ready is None), float(ready is False), float(stop_requested()), start, -start]
        if root.size > 1:
            reduced = torch.tensor(looks, dtype=torch.float64, device=root.device)
            root.all_reduce(reduced, ReduceOperation.MAX)
            looks = reduced.tolist()
        end, not_yet, stop, latest, earliest = looks[0] > 0, looks[1] > 0, looks[2] > 0, looks[3], -looks[4]
        after = windows.window_name or "the start"
        if stop:
            return "stop"
        if end:
            _say(f"The data has no more windows to train after {after}: training ends", windows, root)
            return "end"
        if not not_yet and latest == earliest:
            windows.start_next_window()
            return "started"
        if not_yet and not announced:
            _say(f"Waiting for the next window after {after}: {windows.waiting_for()}", windows, root, console=True)
            announced = True
        elif not not_yet:
            disagreeing_looks += 1
            _refuse_ranks_that_keep_disagreeing(disagreeing_looks, windows.poll_interval_s, earliest, latest, root)
        deadline = time.monotonic() + windows.poll_interval_s
        while not stop_requested() and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))


def _refuse_ranks_that_keep_disagreeing(
    looks: int, poll_interval_s: float, earliest: float, latest: float, root: Gang
) -> None:
    """Say on the first look that the ranks found different windows (from ``earliest`` to ``latest``); stop the run
    once they did for ``DISAGREEMENT_LIMIT_S``, as the same look on every rank agreed."""
    found = f"windows starting from {_utc(earliest)} to {_utc(latest)}"
    if looks == 1:
        line = f"The ranks found different windows to train next ({found}; one is landing): they look again."
        log.info(line)
        if root.rank == 0:
            print(line, file=sys.stderr, flush=True)
    if looks >= max(1, math.ceil(DISAGREEMENT_LIMIT_S / poll_interval_s)):
        raise RuntimeError(
            f"The ranks still found different windows to train next after {DISAGREEMENT_LIMIT_S:g} s ({found}): "
            "every rank must see the same files of the data (a filesystem that all the nodes share)."
        )


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def _say(line: str, windows: WindowedReader, root: Gang, console: bool = False) -> None:
    """``line`` and the windows that wait for their done-file in the log, and on rank 0's console too where any
    wait or with ``console`` (a run that waits must say so)."""
    not_done = windows.windows_not_done()
    if not_done:
        line = f"{line}; {not_done}"
    log.info(line)
    if (console or not_done) and root.rank == 0:
        print(line, file=sys.stderr, flush=True)
