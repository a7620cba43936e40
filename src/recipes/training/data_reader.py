"""The data reader contract: lists of batches, one list per optimizer step, resumable."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

from recipes.errors import UserError

BatchT_co = TypeVar("BatchT_co", covariant=True)


class DataReader(ABC, Generic[BatchT_co]):
    """Reads the batches of one data-parallel rank.

    ``next()`` returns the micro-batches of one optimizer step (their number is the
    gradient accumulation) and raises ``StopIteration`` at the end of a data epoch;
    ``reset()`` starts the next epoch. Every rank of the DP gang must see the same number
    of steps per epoch, or the ranks would disagree on when the epoch ends.

    ``state_dict()`` captures the position so that, after ``load_state_dict()``, the next
    ``next()`` returns exactly the batches an uninterrupted run would have read.

    A reader of a scored split (validation, ``eval``, ``predict``) yields every row once and
    deals the rows of each step to the ranks round-robin (row ``i`` to rank ``i % dp_size``;
    a rank with none left yields empty batches), so that metrics are exact and predictions go
    back into input order.
    """

    def __iter__(self) -> Iterator[list[BatchT_co]]:
        return self

    @abstractmethod
    def __next__(self) -> list[BatchT_co]:
        """The micro-batches of the next step."""

    @abstractmethod
    def reset(self) -> None:
        """Start the next data epoch."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]: ...

    @abstractmethod
    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None: ...

    def describe(self) -> str:
        """What the reader has read this epoch and what a step takes, for a message about data that fills no
        step (``train.csv: 100 rows read, 3 malformed ones skipped; a step takes 256 rows``); '' if it cannot say."""
        return ""

    def close(self, wait: bool = True) -> None:
        """Release what the reader holds (threads, files) at the end of a run; ``wait=False`` when the run failed."""


class DataError(UserError):
    """The data is malformed: a bad row, a missing file, an id out of range. A user error."""
