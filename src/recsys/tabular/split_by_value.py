"""The ``split`` of a tabular recipe's ``dataset``: which rows of the files train, validate and test; by a range of a
column's values (a time split), or leave-one-out by key (``recsys.tabular.leave_one_out``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Annotated

from recipes import ConfigError, Range


@dataclass
class SplitByValue:
    """Training, validation and test rows told apart by the value of a numeric column, such as a timestamp:
    the latest rows validate, as a recommender is used (trained on the past, asked about the future). Or, with
    ``last_of``, leave-one-out: each key's (user's) latest row tests and the one before it validates, as next-item
    models are measured (SASRec's and HSTU's published figures)."""

    column: str | None = None
    """The numeric column; ``null``: every row of a split's files belongs to it."""
    valid_from: Annotated[float, Range()] | None = None
    """Rows whose value is at least this are validation rows (up to ``test_from``); smaller values train. Where the
    files are read whole at start-up (a ``history`` column), a cut that leaves training, validation or a scored test
    split no row stops the run there, in one line."""
    test_from: Annotated[float, Range()] | None = None
    """Rows whose value is at least this are test rows (optional)."""
    last_of: str | None = None
    """Leave-one-out: the key column (the user) whose rows are split by their order in ``column``: each key's last
    row is a test row, the one before it a validation row, the earlier ones train; a key of one row has a test row
    only, of two rows a validation and a test row. Rows of a key are ordered by ``column``, then by ``tie_break``;
    rows equal in both are one event and share their split. The order is gathered at each start in one pass over
    every configured file (train, valid and test paths, each once: they may all be one file; 16 bytes a row), so a
    row's split never depends on the order rows are read in (shuffling, threads, a resume). Needs ``column``;
    ``valid_from`` and ``test_from`` stay unset. A side table is then read whole, as no time separates training
    from validation."""
    tie_break: str | None = None
    """With ``last_of``: the column whose value orders a key's rows of one moment (the item, ``movieId``), by its
    64-bit key, the same in every format and run. ``null``: rows of one moment share their split (a user who rated
    two movies in their last second tests on both). With it, a ``history`` orders a key's rows of one moment the
    same way, so that a test row's history holds its validation row."""

    def __post_init__(self) -> None:
        if self.last_of is not None:
            self._check_leave_one_out()
        elif self.tie_break is not None:
            raise ValueError("`split.tie_break` orders the rows of a `last_of` key, which must be set, but is not.")
        if self.column is not None and self.valid_from is None and self.last_of is None:
            raise ValueError(f"`split.valid_from` must be set to split by `{self.column}`, but is not.")
        if self.column is None and (self.valid_from is not None or self.test_from is not None):
            raise ValueError("`split.column` must name the column that `valid_from`/`test_from` cut, but is not set.")
        if self.test_from is not None and self.valid_from is not None and self.test_from < self.valid_from:
            raise ValueError(
                f"`split.test_from` must be at least `valid_from` ({self.valid_from}), but is {self.test_from} instead."
            )

    def _check_leave_one_out(self) -> None:
        if self.column is None:
            raise ValueError(
                f"`split.column` must name the column that orders the rows of each `last_of` key ('{self.last_of}'), "
                "but is not set."
            )
        cuts = {"valid_from": self.valid_from, "test_from": self.test_from}
        cut = next((key for key, value in cuts.items() if value is not None), None)
        if cut is not None:
            raise ValueError(
                f"`split.{cut}` must be unset with `last_of` (each key's last rows test and validate), but is "
                f"{cuts[cut]:g} instead."
            )
        if self.last_of in (self.column, self.tie_break):
            raise ValueError(
                f"`split.last_of` must name a key column other than `column` and `tie_break`, but is "
                f"'{self.last_of}' like one of them."
            )

    def refuse_empty_splits(self, values: tuple[float, float] | None, scores_test: bool) -> None:
        """A cut that leaves training, validation or (``scores_test``: ``test_path`` is set) the test split no row,
        given the least and greatest value of ``column`` in every configured file (``RowOrders.split_values``), is a
        ``ConfigError``: found at the first validation, it would end a run after its training (MovieLens-1M's
        ratings, of 2000-2003, cut where ml-latest-small's are, in 2012)."""
        if values is None or self.valid_from is None or self.last_of is not None:
            return
        low, high = values
        test_from = float("inf") if self.test_from is None or not scores_test else self.test_from
        for empty, key, cut, rows in (
            (low >= self.valid_from, "valid_from", self.valid_from, "train on"),
            (high < self.valid_from, "valid_from", self.valid_from, "validate"),
            (high < test_from < float("inf"), "test_from", test_from, "test"),
        ):
            if empty:
                raise ConfigError(
                    f"`dataset.split.{key}` must leave rows to {rows}, but is {_value(cut)} while the files' "
                    f"`{self.column}` runs from {_value(low)} to {_value(high)}."
                )

    def bounds(self, split: str) -> tuple[float, float] | None:
        """The ``[low, high)`` range of the column's values that ``split`` keeps; ``None``: every row (so for
        ``all``: the rows of every split, which a ``history`` gathers; with ``last_of``, a row's rank in its key
        decides instead)."""
        if self.column is None or split == "all" or self.last_of is not None:
            return None
        assert self.valid_from is not None
        test_from = float("inf") if self.test_from is None else self.test_from
        return {"train": (-float("inf"), self.valid_from), "valid": (self.valid_from, test_from)}.get(
            split, (test_from, float("inf"))
        )


def _value(value: float) -> str:
    """A value of the split column, with its date where it may be seconds since 1970 (years 1973 to 2100)."""
    text = str(int(value)) if value.is_integer() else f"{value:g}"
    if 1e8 <= value < 4.1e9:
        return f"{text} ({datetime.fromtimestamp(value, timezone.utc):%Y-%m-%d})"
    return text
