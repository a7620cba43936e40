"""The columns a schema adds to a file's own, and which rows a split keeps: the same for every file format.

A reader hands over, per chunk of rows, the keys (``recsys.tabular.hashing``) and the numbers of the file
columns that joins, derived columns and the split read (``file_keys``, ``file_numbers``); this class returns
which rows the reader's split keeps, and the added columns' values in the form their roles take: a key per row
(a categorical value), a number per row (a dense value), or a bag of keys per row (multi-hot). Side tables are
joined first, in the schema's order (a join may key on a column an earlier join added), then the derived
columns are computed from file or joined columns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from recipes import ConfigError
from recsys.tabular.hashing import integer_keys
from recsys.tabular.history import History, HistoryBuilder
from recsys.tabular.joins import Bags, ColumnUse, SideTable, gather_bags
from recsys.tabular.leave_one_out import UNKNOWN, EventRanks, EventRanksBuilder, keeps
from recsys.tabular.schema import COUNTS, HISTORY, TIME_PARTS, DerivedColumn, TabularDataSection
from recsys.tabular.vocabulary import KeyCounter, ValueCounts

_SECONDS_PER_DAY = 86_400
_EPOCH_WEEKDAY = 3  # 1970-01-01 was a Thursday; Monday is 0.

TIME_RANGE_S = (-62_135_596_800, 253_402_300_800)
"""The unix times in seconds a time part reads, from 0001-01-01 to before 10000-01-01 (UTC): the years of
Python's ``datetime``, which names the windows of a time column too. A float beyond int64's seconds (1e20) was
cast to garbage and trained, with a warning from numpy only."""


@dataclass
class AddedValues:
    """What ``AddedColumns.apply`` gives a chunk: the rows the split keeps (``None``: all), and per added column
    used by a role its keys, numbers or bags."""

    keep: npt.NDArray[np.bool_] | None = None
    problems: dict[int, str] = field(default_factory=dict)
    """Rows no split can keep (an empty split value), by index: malformed rows, never dropped silently."""
    keys: dict[str, npt.NDArray[np.uint64]] = field(default_factory=dict)
    numbers: dict[str, npt.NDArray[np.float64]] = field(default_factory=dict)
    bags: dict[str, Bags] = field(default_factory=dict)


@dataclass(frozen=True)
class RowOrders:
    """What one pass over every configured file gathers: the rows of each ``history`` column, and with
    ``split.last_of`` the events of every key (``None`` without)."""

    histories: dict[str, History]
    ranks: EventRanks | None = None
    split_values: tuple[float, float] | None = None
    """The least and the greatest value of ``split.column`` in the well-formed rows (``None``: no such value), by
    which a split by value that leaves training or validation no row stops at start-up."""


class AddedColumns:
    """The joined and derived columns of ``schema`` and its split, for a reader of split ``split``
    (``train``, ``valid`` or ``test``) over files with the columns ``file_columns``.

    ``counts`` holds, per ``count`` or ``count_before`` column, the value counts of its source over the training
    rows; without them (the pass that counts them) such a column is missing in every row. ``histories`` holds
    the rows of each ``history`` column (``gather_orders``), without which it is missing in every row; ``ranks``
    the events of every key of ``split.last_of`` (``gather_orders``), without which a leave-one-out split (not
    ``all``) cannot be read.
    """

    def __init__(
        self,
        schema: TabularDataSection,
        file_columns: list[str],
        split: str,
        counts: Mapping[str, ValueCounts] | None = None,
        *,
        histories: Mapping[str, History] | None = None,
        ranks: EventRanks | None = None,
        file_name: str = "the files",
    ) -> None:
        self._schema = schema
        self._bounds = schema.split.bounds(split)
        self._split = split
        self._leave_one_out = schema.split.last_of is not None and split != "all"
        self._ranks = ranks
        self._counts = dict(counts or {})
        self._histories = dict(histories or {})
        self._history_columns = [d for d in schema.derived if d.transform == HISTORY]
        self._check_names(file_columns, file_name)
        if self._leave_one_out and ranks is None:
            raise ValueError(f"A reader of the `{split}` rows of a leave-one-out split needs the keys' `ranks`.")
        groups = {name: group for group in schema.categorical for name in group.columns}
        dense = set(schema.dense_columns)
        joined_bags = {
            name for join in schema.joins for name in join.columns if name in groups and groups[name].multi_hot
        }
        keyed = {join.on for join in schema.joins} | {d.source for d in schema.derived if d.transform in COUNTS}
        keyed |= {d.key for d in self._history_columns if d.key is not None}
        keyed |= {d.source for d in self._history_columns if d.source not in joined_bags}
        keyed |= {name for name in (schema.split.last_of, schema.split.tie_break) if name is not None}
        numbered = {d.source for d in schema.derived if d.transform in TIME_PARTS}
        if schema.split.column is not None:
            numbered.add(schema.split.column)

        self.tables = []
        for join in schema.joins:
            uses = {
                name: ColumnUse(
                    keys=name in keyed or (name in groups and not groups[name].multi_hot),
                    numbers=name in dense or name in numbered,
                    bags=name in groups and groups[name].multi_hot,
                    separator=groups[name].separator if name in groups else None,
                    kind=schema.id_kind(name),
                )
                for name in join.columns
            }
            assert join.on is not None
            self.tables.append(SideTable(join, uses, schema.split, schema.id_kind(join.on)))
        self.file_keys = sorted(name for name in keyed if name in file_columns)
        """The file columns whose keys ``apply`` needs."""
        self.file_numbers = sorted(name for name in numbered if name in file_columns)
        """The file columns whose numbers ``apply`` needs."""
        clash = sorted(set(self.file_keys) & set(self.file_numbers))
        if clash:
            raise ConfigError(
                f"A column must be read as a number or as a value, but '{clash[0]}' is both a number (the source of a "
                "time part, or the split column) and a value (a join key, the source of a count, or `split.last_of` or "
                "`tie_break`)."
            )
        self._categorical = {name for name in schema.categorical_columns if name not in file_columns}
        self._dense = {name for name in schema.dense_columns if name not in file_columns}
        for history in self._history_columns:
            if history.source in file_columns and history.source in groups and groups[history.source].multi_hot:
                raise ConfigError(
                    f"The source of the history '{history.name}' must be a single-valued or a joined column, but "
                    f"'{history.source}' is a multi-hot column of {file_name}."
                )

    @property
    def empty(self) -> bool:
        """Whether the schema adds nothing and keeps every row: the reader's fast path."""
        return not self.tables and not self._schema.derived and self._bounds is None and not self._leave_one_out

    def apply(
        self, keys: Mapping[str, npt.NDArray[np.uint64]], numbers: Mapping[str, npt.NDArray[np.float64]]
    ) -> AddedValues:
        """The split's rows and the added columns' values, from the ``file_keys`` and ``file_numbers`` of a chunk."""
        keys, numbers, bags = self._join(keys, numbers)
        values = AddedValues(bags=bags)
        if self._bounds is not None or self._leave_one_out:
            self._keep_split(keys, numbers, values)
        for derived in self._schema.derived:
            if derived.transform == HISTORY:
                if derived.name in self._categorical:
                    values.bags[derived.name] = self._history(derived, keys, numbers)
            elif derived.transform in COUNTS:
                counts = self._counts.get(derived.name)
                source = keys[derived.source]
                orders = numbers[self._schema.split.column] if derived.transform == "count_before" else None  # type: ignore[index]
                numbers[derived.name] = counts.lookup(source, orders) if counts else np.full(len(source), np.nan)
            else:
                self._mark_times_out_of_range(derived, numbers[derived.source], values)
                numbers[derived.name] = time_part(numbers[derived.source], derived.transform)
        for name in self._dense:
            values.numbers[name] = numbers[name]
        for name in self._categorical - set(values.bags):
            values.keys[name] = keys[name] if name in keys else integer_keys(numbers[name], self._schema.id_kind(name))
        return values

    def _keep_split(
        self,
        keys: Mapping[str, npt.NDArray[np.uint64]],
        numbers: Mapping[str, npt.NDArray[np.float64]],
        values: AddedValues,
    ) -> None:
        """Which rows the split keeps: by the split column's range, or (leave-one-out) by the row's rank among its
        key's events; a row without a split value (or key) is malformed."""
        split = self._schema.split
        assert split.column is not None
        split_values = numbers[split.column]
        for row in np.flatnonzero(np.isnan(split_values)):
            values.problems[int(row)] = f"the split column `{split.column}` must hold a number, but is empty"
        if self._bounds is not None:
            values.keep = (split_values >= self._bounds[0]) & (split_values < self._bounds[1])
            return
        assert split.last_of is not None and self._ranks is not None
        owners = keys[split.last_of]
        for row in np.flatnonzero(owners == 0):
            values.problems.setdefault(
                int(row), f"`{split.last_of}`, the key of the leave-one-out split (`split.last_of`), must hold a value"
            )
        ranks = self._ranks.lookup(owners, split_values, self._ties(keys, len(owners)))
        unseen = (ranks == UNKNOWN) & (owners != 0) & ~np.isnan(split_values)
        for row in np.flatnonzero(unseen):  # A file that changed after the pass at start-up, say.
            values.problems.setdefault(
                int(row), "it was not in the files when the pass at start-up ordered each key's rows (`split.last_of`)"
            )
        values.keep = keeps(self._split, ranks)

    def _ties(self, keys: Mapping[str, npt.NDArray[np.uint64]], num_rows: int) -> npt.NDArray[np.uint64]:
        """The rows' ties under leave-one-out: the keys of ``split.tie_break``'s values, or 0."""
        tie_break = self._schema.split.tie_break
        return keys[tie_break] if tie_break is not None else np.zeros(num_rows, np.uint64)

    @staticmethod
    def _mark_times_out_of_range(derived: DerivedColumn, seconds: npt.NDArray[np.float64], values: AddedValues) -> None:
        """Rows whose time, the source of a time part, lies outside ``TIME_RANGE_S`` are malformed: kept by no
        split, each with its problem (the reader names the file and the row, and counts it against
        ``dataset.max_malformed_rows``)."""
        bad = times_out_of_range(seconds)
        if not bad.any():
            return
        values.keep = ~bad if values.keep is None else values.keep & ~bad
        for row in np.flatnonzero(bad):
            values.problems.setdefault(
                int(row),
                f"`{derived.source}`, the time of the derived column '{derived.name}', must be seconds since 1970 "
                f"in years 1 to 9999 (UTC), but is {seconds[row]:g} instead",
            )

    def _join(
        self, keys: Mapping[str, npt.NDArray[np.uint64]], numbers: Mapping[str, npt.NDArray[np.float64]]
    ) -> tuple[dict[str, npt.NDArray[np.uint64]], dict[str, npt.NDArray[np.float64]], dict[str, Bags]]:
        """The keys and numbers of a chunk with the joined columns' added, and the joined bags."""
        keys, numbers, bags = dict(keys), dict(numbers), {}
        for table in self.tables:
            positions = table.join_keys(keys)
            found = positions >= 0
            for name, side_numbers in table.numbers.items():
                numbers[name] = np.where(found, side_numbers[np.maximum(positions, 0)], np.nan)
            for name, side_bags in table.bags.items():
                bags[name] = gather_bags(side_bags, positions)
        return keys, numbers, bags

    def _history(
        self,
        derived: DerivedColumn,
        keys: Mapping[str, npt.NDArray[np.uint64]],
        numbers: Mapping[str, npt.NDArray[np.float64]],
    ) -> Bags:
        assert derived.key is not None and self._schema.split.column is not None
        owners = keys[derived.key]
        history = self._histories.get(derived.name)
        if history is None:  # The pass that gathers the histories: every row's is missing.
            return np.zeros(len(owners), np.uint64), np.arange(len(owners) + 1, dtype=np.int64)
        ties = self._ties(keys, len(owners)) if self._tied_histories else None
        return history.lookup(owners, numbers[self._schema.split.column], derived.length, ties)

    @property
    def _tied_histories(self) -> bool:
        """Whether histories order a key's rows of one moment by ``split.tie_break``, as leave-one-out does."""
        split = self._schema.split
        return split.last_of is not None and split.tie_break is not None

    def gather_orders(
        self,
        chunks: Iterable[
            tuple[Mapping[str, npt.NDArray[np.uint64]], Mapping[str, npt.NDArray[np.float64]], npt.NDArray[np.bool_]]
        ],
    ) -> RowOrders:
        """The rows of each ``history`` column and the events of each key of ``split.last_of``, from the
        ``file_keys``, ``file_numbers`` and well-formed rows of every chunk of the files (a reader of the split
        ``all``), in one pass."""
        builders = {d.name: HistoryBuilder(self._tied_histories) for d in self._history_columns}
        split = self._schema.split
        events = EventRanksBuilder(split.tie_break is not None) if split.last_of is not None else None
        low, high = np.inf, -np.inf
        for file_keys, file_numbers, valid in chunks:
            keys, numbers, bags = self._join(file_keys, file_numbers)
            if split.column is None:
                continue  # Nothing to order (a schema without histories or leave-one-out).
            times, ties = numbers[split.column], self._ties(keys, len(valid))
            known = times[valid & ~np.isnan(times)]
            if len(known):
                low, high = min(low, float(known.min())), max(high, float(known.max()))
            if events is not None:
                assert split.last_of is not None
                events.add(keys[split.last_of], times, ties, valid)
            for derived in self._history_columns:
                assert derived.key is not None
                source = bags.get(derived.source)
                if source is None:
                    source = keys[derived.source], np.arange(len(valid) + 1, dtype=np.int64)
                builders[derived.name].add(keys[derived.key], times, source, valid, ties)
        histories = {name: builder.build() for name, builder in builders.items()}
        return RowOrders(histories, None if events is None else events.build(), (low, high) if low <= high else None)

    def counters(self) -> dict[str, KeyCounter]:
        """An empty counter per ``count`` and ``count_before`` column, for the pass that counts them."""
        return {
            d.name: KeyCounter(ordered=d.transform == "count_before")
            for d in self._schema.derived
            if d.transform in COUNTS
        }

    def count_sources(
        self, keys: Mapping[str, npt.NDArray[np.uint64]], numbers: Mapping[str, npt.NDArray[np.float64]]
    ) -> dict[str, tuple[npt.NDArray[np.uint64], npt.NDArray[np.float64] | None]]:
        """Per ``count`` and ``count_before`` column, the keys of its source in a chunk (from ``file_keys`` and the
        joins), and for ``count_before`` the rows' values of the split column (their order in time)."""
        keys = dict(keys)
        for table in self.tables:
            table.join_keys(keys)
        split_column = self._schema.split.column
        return {
            d.name: (keys[d.source], numbers[split_column] if d.transform == "count_before" and split_column else None)
            for d in self._schema.derived
            if d.transform in COUNTS
        }

    def _check_names(self, file_columns: list[str], file_name: str) -> None:
        """Every name a role reads is a file column or one the schema adds before it is read."""
        schema = self._schema
        known = set(file_columns)
        for name in schema.added_columns:
            if name in known:
                raise ConfigError(f"An added column must have a new name, but '{name}' is a column of {file_name}.")

        def require(name: str, subject: str) -> None:
            if name not in known:
                raise ConfigError(
                    f"{subject} must be a column of {file_name} or one the schema adds before it, but '{name}' is "
                    f"neither (the file's columns are {file_columns})."
                )

        if schema.split.column is not None:
            require(schema.split.column, "The split column")
        if schema.split.last_of is not None:
            require(schema.split.last_of, "The key column of the leave-one-out split, `split.last_of`,")
        if schema.split.tie_break is not None:
            require(schema.split.tie_break, "The column `split.tie_break`")
        for join in schema.joins:
            assert join.on is not None
            require(join.on, f"The key column `on` of the join of {join.path}")
            known.update(join.columns)
        for derived in schema.derived:
            require(derived.source, f"The source of the derived column '{derived.name}'")
            if derived.key is not None:
                require(derived.key, f"The key of the history '{derived.name}'")
        known.update(derived.name for derived in schema.derived)
        for name in [*schema.dense_columns, *schema.categorical_columns]:
            require(name, "A column of the schema")


def dense_column(numbers: npt.NDArray[np.float64], fill: float, log: bool) -> npt.NDArray[np.float32]:
    """A dense column from exact numbers, as the tokeniser stores a file's: NaN (missing) is ``fill``, then
    ``log(max(x, 0) + 1)`` if ``log``, in float32."""
    values = np.where(np.isnan(numbers), fill, numbers)
    return (np.log1p(np.maximum(values, 0.0)) if log else values).astype(np.float32)


def times_out_of_range(seconds: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
    """Which of the unix times ``seconds`` are known (not NaN) but outside ``TIME_RANGE_S``, infinities included."""
    return ~np.isnan(seconds) & ~((seconds >= TIME_RANGE_S[0]) & (seconds < TIME_RANGE_S[1]))


def time_part(seconds: npt.NDArray[np.float64], part: str) -> npt.NDArray[np.float64]:
    """The ``part`` (one of ``TIME_PARTS``) of unix times in seconds, in UTC; NaN (missing), and a time outside
    ``TIME_RANGE_S``, give NaN."""
    assert part in TIME_PARTS
    known = (seconds >= TIME_RANGE_S[0]) & (seconds < TIME_RANGE_S[1])
    whole = np.floor(np.where(known, seconds, 0.0)).astype(np.int64)
    if part == "hour":
        result = (whole // 3600) % 24
    elif part == "weekday":
        result = (whole // _SECONDS_PER_DAY + _EPOCH_WEEKDAY) % 7
    else:
        moments = whole.astype("datetime64[s]")
        years = moments.astype("datetime64[Y]")
        months = moments.astype("datetime64[M]")
        if part == "year":
            result = years.astype(np.int64) + 1970
        elif part == "month":
            result = (months - years).astype(np.int64) + 1
        else:
            result = (moments.astype("datetime64[D]") - months).astype(np.int64) + 1
    return np.where(known, result.astype(np.float64), np.nan)
