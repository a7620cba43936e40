"""The small interfaces the framework's parts meet at, in a module of their own.

A recipe, a test or a user's own part implements these without importing the Trainer; the
Trainer and the run assembly depend on them, not on each other's classes. Optional parts have a
do-nothing implementation here, so the Trainer never checks for ``None``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import torch

from embedding.features import SparseFeatures
from recipes.training.data_reader import DataReader
from units import EvalUnit

BatchT = TypeVar("BatchT")
BatchT_contra = TypeVar("BatchT_contra", contravariant=True)


@dataclass
class Validation(Generic[BatchT]):
    """An eval unit and the reader of its data; one full pass of the reader per validation."""

    unit: EvalUnit[BatchT]
    reader: DataReader[BatchT]


@runtime_checkable
class Predictor(Protocol[BatchT_contra]):
    """An eval unit that can also say what it predicts, for ``python -m recipes predict``.

    ``predict`` updates the unit's metrics as ``__call__`` does and returns one column per
    output, one row per example of the batch (``label`` where the data has one, and ``score``,
    by convention), so that one forward pass serves both.
    """

    def predict(self, batch: BatchT_contra) -> Mapping[str, torch.Tensor]: ...


@runtime_checkable
class SparseFeatureBatch(Protocol):
    """A batch whose sparse features can be replaced, which ``python -m recipes importance`` needs to move a
    feature's bags to other rows: a dataclass (the copies are made by ``dataclasses.replace``) with its
    ``SparseFeatures`` in a ``sparse`` field. A ``dense`` field of ``[batch, num_dense]`` values, where the
    batch has one, is permuted column by column too."""

    @property
    def sparse(self) -> SparseFeatures: ...


@runtime_checkable
class SparseGradientScaling(Protocol):
    """An optimizer that also steps gradients outside its ``param_groups`` (sparse tables' rows), which the
    Trainer must normalise and unscale itself: DDP averages dense gradients over ranks, sparse ones are summed."""

    def scale_sparse_gradients(self, factor: float) -> None: ...


@runtime_checkable
class WindowedReader(Protocol):
    """A train reader whose data is a sequence of time windows, read one at a time, each once: the next is the
    earliest complete window not trained yet, so one that is complete late (after a later one started, or while
    the run was down) is trained then, not lost.

    Its ``next()`` raises ``StopIteration`` at the end of each window; the Trainer (through
    ``training.windows.OnlineWindows``) then decides what a window's end means (a checkpoint every N windows,
    the window limit) and moves it on. So that every rank
    moves on together, to the same window, moving is two calls: ``next_window_ready`` (asked on every rank,
    and agreed with ``next_window_start``) and ``start_next_window``. ``window_index``, ``window_name`` and
    the windows trained are part of the reader's state, so a resume continues in the same window at the same
    row and trains no window twice.
    """

    @property
    def window_index(self) -> int:
        """How many windows were started before the current one (its index); -1 before the first."""

    @property
    def window_name(self) -> str:
        """The current window's name (its time: ``2026-11-27``, ``2026-11-27T14``); '' before the first."""

    @property
    def poll_interval_s(self) -> float:
        """How long to wait before asking again when the next window is not there yet."""

    def next_window_ready(self) -> bool | None:
        """Whether a window to train next is there (complete, not trained yet); ``None``: there is none and there
        will be none (the end of the data), ``False``: not yet (the reader follows the data as it lands)."""

    def next_window_start(self) -> float:
        """The time of the window that ``next_window_ready`` found (seconds since 1970), which the ranks compare
        so that all start the same one."""

    def start_next_window(self) -> None:
        """Read the next window from now on (its first step is the next ``next()``)."""

    def window_scoring_reader(self) -> DataReader[Any]:
        """A reader of the current window's rows, each once, dealt to the ranks as a scored split's are: what
        the current model is scored on before it trains on the window (predict, then train)."""

    def waiting_for(self) -> str:
        """What the reader waits for when the next window is not there yet, for a line that says so."""

    def windows_not_done(self) -> str:
        """The windows there but not complete yet (a done-file missing), named for the lines that say what the
        data holds: ``2 windows wait for their _SUCCESS file: 2026-11-27, 2026-11-29``; '' when none."""


class ShardedStateful(Protocol):
    """State split over ranks (sparse embedding tables), which can be reloaded on another layout.

    Each rank saves its own pieces; loading gets the pieces of every rank of the saving job
    and keeps what it now owns.
    """

    def sharded_state_dict(self) -> dict[str, Any]: ...

    def load_sharded_state_dict(self, pieces: Sequence[Mapping[str, Any]]) -> None: ...


@runtime_checkable
class TracksChangedRows(Protocol):
    """Sharded state that can save only its rows changed since its last whole save (see
    ``embedding.row_changes``): a checkpoint of it may then be a delta over that one."""

    def delta_state_dict(self, base_step: int) -> dict[str, Any]: ...

    def forget_changes(self) -> None: ...


class Checkpointer(Protocol):
    """Saves the trainer's state when the trainer says so; decides where and what to keep."""

    def save(
        self,
        step_nr: int,
        score: float | None,
        shared_state: dict[str, Any],
        rank_state: dict[str, Any],
        last: bool,
        unchanged_until_staged: Callable[[torch.Tensor], bool],
        interrupted: bool = False,
        base_step: int | None = None,
    ) -> None:
        """Save the states; the tensors for which ``unchanged_until_staged`` holds (parameters and
        optimizer state) may be copied later, until ``wait_until_staged`` returns. ``interrupted``:
        saved because the run was stopped, off its schedule (a resume point only). ``base_step``: the sharded
        state that tracks its changed rows is a delta over the checkpoint of that step (``delta_base``)."""

    def wait_until_staged(self) -> None:
        """Called before every optimizer step: a save in flight must hold its own copy of the state by then."""

    def delta_base(self, step_nr: int) -> int | None:
        """The step of the checkpoint that the save of ``step_nr`` may lie over as a delta of the sharded state
        that ``TracksChangedRows``; ``None``: save it whole."""


class NoopCheckpointer:
    """Saves nothing: for a Trainer that only evaluates, or a test that needs no checkpoints."""

    def save(
        self,
        step_nr: int,
        score: float | None,
        shared_state: dict[str, Any],
        rank_state: dict[str, Any],
        last: bool,
        unchanged_until_staged: Callable[[torch.Tensor], bool],
        interrupted: bool = False,
        base_step: int | None = None,
    ) -> None:
        pass

    def wait_until_staged(self) -> None:
        pass

    def delta_base(self, step_nr: int) -> int | None:
        return None


NOOP_CHECKPOINTER = NoopCheckpointer()
