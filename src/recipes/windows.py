"""Data in windows, as the Trainer meets it: finding the reader of windows, and waiting for the next window.

A ``WindowedReader`` (``recipes.protocols``) says whether its next window is there; every rank asks its own
and the ranks agree in one collective per poll, so that all start the window together, or all stop. The
Trainer does the rest (predict, then train; checkpoints every N windows; the window limit).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import Any, Literal

import torch

from gang import Gang, ReduceOperation
from recipes.data_reader import DataReader
from recipes.pipeline import PipelinedReader
from recipes.protocols import WindowedReader

log = logging.getLogger(__name__)

NextWindow = Literal["ready", "end", "stop"]


def windows_of(reader: DataReader[Any]) -> WindowedReader | None:
    """The reader of data in windows behind ``reader`` (the pipeline's, which has no step read ahead when a
    window ends), or ``None``."""
    inner = reader.wrapped if isinstance(reader, PipelinedReader) else reader
    return inner if isinstance(inner, WindowedReader) else None


def wait_for_next_window(windows: WindowedReader, root: Gang, stop_requested: Callable[[], bool]) -> NextWindow:
    """``ready`` once the next window is there on every rank; ``end`` at the end of the data; ``stop`` when a
    rank was asked to stop (a signal) meanwhile. While the reader follows the data and no window is there, it
    says once what it waits for and asks again every ``poll_interval_s``."""
    announced = False
    while True:
        ready = windows.next_window_ready()
        stats = [float(ready is None), float(ready is False), float(stop_requested())]
        if root.size > 1:
            reduced = torch.tensor(stats, dtype=torch.float64, device=root.device)
            root.all_reduce(reduced, ReduceOperation.SUM)
            stats = reduced.tolist()
        if stats[2] > 0:
            return "stop"
        if stats[0] > 0:
            log.info("The data has no window after %s: training ends.", windows.window_name or "the start")
            return "end"
        if stats[1] == 0:
            return "ready"
        if not announced:
            line = f"Waiting for the next window after {windows.window_name or 'the start'}: {windows.waiting_for()}"
            log.info(line)
            if root.rank == 0:
                print(line, file=sys.stderr, flush=True)  # On the console too: a run that waits must say so.
            announced = True
        deadline = time.monotonic() + windows.poll_interval_s
        while not stop_requested() and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.1))
