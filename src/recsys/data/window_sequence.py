"""Data in time windows: a train reader that reads one window after another, in time order, and resumes in one.

A production recommender trains on logs as they land, an hour or a day at a time (RecIS' ``window_iter``):
each window is read whole by a reader of its own (any ``DataReader``: shuffled, sharded, resumable as
usual), and the next window is the earliest complete one not trained yet. Where the windows come from is a
``WindowSource``'s: files grouped by the time in their paths, or the value ranges of a time column of one
table (``recsys.tabular.window_sources``). Following the data, the source is asked again until a window is there.

So no window is lost: one that becomes complete late (its done-file written after a later window's), or that
lands while the run is down, is trained when it is there, before any later one not trained yet; as it is
earlier than a window trained already, a line says it is trained late. The other choice, stopping the run,
would leave a following run stuck on a window whose writer failed until someone removed it.

The reader's state is the names of the windows trained (the current one last), the current one's index and
its own reader's state: a resume finds the window by its name and continues at the same row, and trains no
window twice. The Trainer sees it through ``recipes``' ``WindowedReader`` protocol: ``next()`` stops at each
window's end, and the Trainer moves it on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from recipes import DataError, DataReader

logger = logging.getLogger(__name__)

BatchT = TypeVar("BatchT")


@dataclass(frozen=True)
class Window:
    """One window of the data: ``name`` (its time as text, which names it in metrics and checkpoints),
    ``start`` (its time, seconds since 1970, which orders the windows), and its files."""

    name: str
    start: float
    paths: tuple[str, ...]


class WindowSource(Protocol):
    """Where the windows come from."""

    def windows(self) -> Sequence[Window]:
        """The windows there now (complete ones only), in time order."""

    def windows_not_done(self) -> str:
        """The windows whose files are there but not complete yet (a done-file missing), as words for the lines
        that say what the run waits for: ``2 windows wait for their _SUCCESS file: 2026-11-27, 2026-11-29``;
        '' when none."""

    def describe(self) -> str:
        """What a window is made of, for a line saying that the run waits for the next."""


class WindowSequence(DataReader[BatchT], Generic[BatchT]):
    """Reads the windows of ``source``, each once, the earliest not trained yet first, with a reader each:
    ``reader_of(window)`` for training, ``scoring_reader_of(window)`` to score the current model on it first.
    With ``follow``, the end of the windows there is not the end of the data: the next is waited for, asking
    ``source`` every ``poll_interval_s`` seconds. It implements ``recipes.training.protocols.WindowedReader``."""

    def __init__(
        self,
        source: WindowSource,
        reader_of: Callable[[Window], DataReader[BatchT]],
        scoring_reader_of: Callable[[Window], DataReader[Any]],
        *,
        follow: bool = False,
        poll_interval_s: float = 10.0,
    ) -> None:
        self._source = source
        self._reader_of = reader_of
        self._scoring_reader_of = scoring_reader_of
        self._follow = follow
        self._poll_interval_s = poll_interval_s
        self._window: Window | None = None
        self._index = -1
        self._trained: dict[str, float] = {}
        """The windows trained (the current one too), in the order trained: their names and starts."""
        self._reader: DataReader[BatchT] | None = None
        self._next: Window | None = None

    # DataReader ----------------------------------------------------------------------------------

    def __next__(self) -> list[BatchT]:
        if self._reader is None:
            raise StopIteration  # Before the first window: the Trainer starts it.
        return next(self._reader)

    def reset(self) -> None:
        """Windows are read once: there is no next pass over them."""

    def state_dict(self) -> dict[str, Any]:
        return {
            "window": "" if self._window is None else self._window.name,
            "window_index": self._index,
            "trained": list(self._trained),
            "reader": {} if self._reader is None else self._reader.state_dict(),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """The state of ``state_dict()``. One saved before the windows trained were kept (no ``trained``) is read
        as the reader then worked: it took the windows in time order, so every window up to the current one that
        is complete now counts as trained, and a warning names them: one whose done-file landed after that reader
        passed it was never trained, and nothing recorded it (the reader since trains such a window late)."""
        name = str(state_dict["window"])
        self._index = int(state_dict["window_index"])
        self._trained = {}
        if not name:
            return
        there = self._source.windows()
        found = [window for window in there if window.name == name]
        if not found:
            raise DataError(
                f"The window {name} of the checkpoint must still be in the data to resume in it, but is gone "
                f"({self._source.describe()})."
            )
        current = found[0]
        starts = {window.name: window.start for window in there}
        if "trained" in state_dict:
            names = [str(trained) for trained in state_dict["trained"]]
        else:
            names = [window.name for window in there if window.start <= current.start]
            logger.warning(
                "The checkpoint does not record which windows were trained (it is older): the %d complete windows "
                "up to %s (%s to %s) count as trained; one that was not complete when that run passed it was not "
                "trained.",
                len(names),
                name,
                names[0],
                names[-1],
            )
        # A window trained and since gone from the data (kept no longer) has no start here: it makes none late.
        self._trained = {trained: starts.get(trained, -math.inf) for trained in names}
        self._open(current)
        assert self._reader is not None
        self._reader.load_state_dict(state_dict["reader"])

    def describe(self) -> str:
        if self._reader is None:
            return f"no window started yet ({self._source.describe()})"
        return f"window {self._index} ({self.window_name}): {self._reader.describe()}"

    def close(self, wait: bool = True) -> None:
        if self._reader is not None:
            self._reader.close(wait)

    # WindowedReader --------------------------------------------------------------------------------

    @property
    def window_index(self) -> int:
        return self._index

    @property
    def window_name(self) -> str:
        return "" if self._window is None else self._window.name

    @property
    def poll_interval_s(self) -> float:
        return self._poll_interval_s

    def next_window_start(self) -> float:
        if self._next is None:
            raise RuntimeError("`next_window_start` must follow a `next_window_ready` that is True, but does not.")
        return self._next.start

    def next_window_ready(self) -> bool | None:
        """Whether a complete window not trained yet is there; the next is the earliest of them."""
        there = self._source.windows()
        self._next = next((window for window in there if window.name not in self._trained), None)
        if self._next is not None:
            return True
        return False if self._follow else None

    def start_next_window(self) -> None:
        window = self._next
        if window is None:
            raise RuntimeError("`start_next_window` must follow a `next_window_ready` that is True, but does not.")
        if self._reader is not None:
            self._reader.close()
        latest = max(self._trained.items(), key=lambda trained: trained[1], default=None)
        if latest is not None and window.start < latest[1]:
            logger.warning(
                "Window %s is trained late, after %s, a later one: it was not complete, or not there, when that "
                "one started.",
                window.name,
                latest[0],
            )
        self._index += 1
        self._trained[window.name] = window.start
        self._open(window)
        self._next = None

    def window_scoring_reader(self) -> DataReader[Any]:
        if self._window is None:
            raise RuntimeError("`window_scoring_reader` must follow `start_next_window`, but no window is started.")
        return self._scoring_reader_of(self._window)

    def waiting_for(self) -> str:
        return self._source.describe()

    def windows_not_done(self) -> str:
        return self._source.windows_not_done()

    def _open(self, window: Window) -> None:
        self._window = window
        self._reader = self._reader_of(window)
