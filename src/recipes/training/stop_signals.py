"""Signals that stop a training run: finish the step, commit a checkpoint, then end.

SIGTERM (a scheduler's preemption notice) and SIGUSR1 end the run as a success, exit 0: the
scheduler asked for it and the run resumes where it stopped. SIGINT is Ctrl-C: the same save,
then exit 130 as a shell expects of an interrupted command. A second Ctrl-C is someone who will
not wait for the save: the process exits 130 at once. That loses nothing committed: a checkpoint
becomes visible by a rename once whole, so a save cut short stays a temporary directory, and the
last committed checkpoint loads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterator
from typing import Any

from recipes.errors import TrainingInterrupted
from recipes.training.trainer import Trainer

log = logging.getLogger(__name__)

EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command ended by Ctrl-C.


class StopOnSignals:
    """Turns the stop signals into a stop request to the trainer while ``stopping`` is entered.

    ``before_exit_now`` runs before a second Ctrl-C ends the process without unwinding: it
    releases the output directory's lock, so that the next run finds it free rather than left
    by a crashed holder.
    """

    SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)

    def __init__(self, before_exit_now: Callable[[], None]) -> None:
        self._before_exit_now = before_exit_now
        self._trainer: Trainer[Any] | None = None
        self.interrupted = False

    @contextlib.contextmanager
    def stopping(self, trainer: Trainer[Any]) -> Iterator[None]:
        self._trainer = trainer
        previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            if self.interrupted:
                self._exit_now()
            self.interrupted = True
            log.warning("Received signal %d; stopping after this step. Ctrl-C again exits at once, unsaved.", signum)
        else:
            log.warning("Received signal %d; stopping after this step.", signum)
        assert self._trainer is not None
        self._trainer.request_stop()

    def _exit_now(self) -> None:
        log.warning(
            "Received signal %d again; exiting at once. The last committed checkpoint is intact.", signal.SIGINT
        )
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        with contextlib.suppress(Exception):
            self._before_exit_now()
        os._exit(EXIT_INTERRUPTED)


__all__ = ["EXIT_INTERRUPTED", "StopOnSignals", "TrainingInterrupted"]
