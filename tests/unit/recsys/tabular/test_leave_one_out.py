"""Leave-one-out (``split.last_of``): each user's last row tests, the one before it validates, the earlier ones
train, in CSV and Parquet alike and however the rows are read; no history or count holds a later row."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recipes import DataError
from recsys.tabular.formats.arrow import ArrowFormatConfig
from recsys.tabular.formats.delimited_text import CsvConfig, TabularReader
from recsys.tabular.formats.parquet import ParquetReader
from recsys.tabular.hashing import hash_value
from recsys.tabular.labels import LabelColumn
from recsys.tabular.schema import (
    CategoricalColumns,
    DenseColumns,
    DerivedColumn,
    SplitByValue,
    TabularDataSection,
    WindowsSection,
)
from recsys.tabular.vocabulary import Encodings, load_or_build_encodings

# u1 rated three movies in one second (300), u2 two in its last second (500), u3 once, u4 twice.
RATINGS = [
    ("u1", "10", "5", "100"),
    ("u2", "20", "3", "150"),
    ("u1", "30", "4", "300"),
    ("u1", "40", "2", "300"),
    ("u4", "50", "4", "320"),
    ("u3", "10", "1", "350"),
    ("u1", "50", "4", "300"),
    ("u2", "60", "5", "500"),
    ("u1", "20", "3", "200"),
    ("u2", "70", "4", "500"),
    ("u4", "60", "2", "330"),
    ("u2", "10", "1", "400"),
]
MOVIE_IDS = {hash_value(movie, "movie", 0): movie for movie in {row[1] for row in RATINGS}}
USER_IDS = {hash_value(user, "user", 0): user for user in {row[0] for row in RATINGS}}


def write_ratings(directory: Path, file_format: str, rows: list[tuple[str, ...]] = RATINGS) -> str:
    columns = ["user", "movie", "rating", "time"]
    if file_format == "parquet":
        table = pa.table(
            {
                "user": pa.array([row[0] for row in rows]),
                "movie": pa.array([int(row[1]) for row in rows]),
                "rating": pa.array([float(row[2]) for row in rows]),
                "time": pa.array([int(row[3]) for row in rows], pa.int64()),
            }
        )
        pq.write_table(table, directory / "ratings.parquet", row_group_size=5)
        return str(directory / "ratings.parquet")
    with open(directory / "ratings.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(columns)
        writer.writerows(rows)
    return str(directory / "ratings.csv")


def schema(file_format: str, tie_break: str | None = "movie", **overrides: Any) -> TabularDataSection:
    values: dict[str, Any] = {
        "format": ArrowFormatConfig() if file_format == "parquet" else CsvConfig(),
        "label": LabelColumn(column="rating", threshold=4.0),
        "derived": [DerivedColumn(name="seen", source="movie", transform="history", key="user", length=10)],
        "categorical": [
            CategoricalColumns(columns=["user", "movie"], num_buckets=0),
            CategoricalColumns(columns=["seen"], multi_hot=True, num_buckets=0, same_ids_as="movie"),
        ],
        "split": SplitByValue(column="time", last_of="user", tie_break=tie_break),
    }
    values.update(overrides)
    return TabularDataSection(**values)


def reader_class(data: TabularDataSection) -> Any:
    return ParquetReader if data.format.name == "parquet" else TabularReader


def gathered(path: str, data: TabularDataSection) -> Encodings:
    """The histories and the users' events, from one pass over the file (as the recipe gathers them)."""
    orders = reader_class(data)(path, data, split="all", batch_size=1).row_orders()
    return Encodings({}, {}, orders.histories, orders.ranks)


def prepared(
    directory: Path, file_format: str, tie_break: str | None = "movie"
) -> tuple[str, TabularDataSection, Encodings]:
    """The ratings file, its schema, and what the pass over it gathers."""
    path = write_ratings(directory, file_format)
    data = schema(file_format, tie_break)
    return path, data, gathered(path, data)


def split_rows(
    path: str, data: TabularDataSection, split: str, encodings: Encodings, **options: Any
) -> list[tuple[str, str, list[str]]]:
    """The ``(user, movie, history's movies)`` of each row ``split`` keeps, in the order read."""
    settings = {"batch_size": 1, "shuffle": False, "drop_last": False, "max_malformed_rows": 0, **options}
    reader = reader_class(data)(path, data, split=split, encodings=encodings, **settings)
    found = []
    for step in reader:
        for batch in step:
            users, movies = batch.sparse["user"].ids.tolist(), batch.sparse["movie"].ids.tolist()
            seen, offsets = batch.sparse["seen"].ids.tolist(), batch.sparse["seen"].offsets.tolist()
            for row, (user, movie) in enumerate(zip(users, movies)):
                history = [MOVIE_IDS[key] for key in seen[offsets[row] : offsets[row + 1]] if key]
                found.append((USER_IDS[user], MOVIE_IDS[movie], history))
    return found


def events_by_user(tie_break: bool) -> dict[str, list[list[str]]]:
    """Each user's movies in time order, those of one moment together (one event each with ``tie_break``,
    ordered by the movie's 64-bit key, as the split orders them)."""
    by_user: dict[str, dict[tuple[int, int], list[str]]] = {}
    for user, movie, _, time in RATINGS:
        tie = hash_value(movie, "movie", 0) % (1 << 64) if tie_break else 0  # The key, as unsigned.
        by_user.setdefault(user, {}).setdefault((int(time), tie), []).append(movie)
    return {user: [events[moment] for moment in sorted(events)] for user, events in by_user.items()}


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
def test_each_users_last_row_tests_the_one_before_validates_the_rest_trains(tmp_path: Path, file_format: str) -> None:
    path, data, encodings = prepared(tmp_path, file_format)

    found = {split: split_rows(path, data, split, encodings) for split in ("train", "valid", "test")}

    events = events_by_user(tie_break=True)
    assert all(len(event) == 1 for user_events in events.values() for event in user_events)
    expected = {
        "test": {(user, e[-1][0]) for user, e in events.items()},
        "valid": {(user, e[-2][0]) for user, e in events.items() if len(e) >= 2},
        "train": {(user, movie[0]) for user, e in events.items() for movie in e[:-2]},
    }
    assert {split: {(user, movie) for user, movie, _ in rows} for split, rows in found.items()} == expected
    assert sorted(user for user, _, _ in found["test"]) == ["u1", "u2", "u3", "u4"]  # One row each.
    assert sorted(user for user, _, _ in found["valid"]) == ["u1", "u2", "u4"]  # u3 has one row: a test row only.
    assert sum(len(rows) for rows in found.values()) == len(RATINGS)


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
def test_a_history_holds_the_rows_before_in_the_splits_order_and_nothing_later(
    tmp_path: Path, file_format: str
) -> None:
    path, data, encodings = prepared(tmp_path, file_format)

    rows = [row for split in ("train", "valid", "test") for row in split_rows(path, data, split, encodings)]

    for user, user_events in events_by_user(tie_break=True).items():
        movies = [event[0] for event in user_events]
        for index, movie in enumerate(movies):
            (history,) = [seen for u, m, seen in rows if (u, m) == (user, movie)]
            assert history == movies[:index], (user, movie)
    valid = {user: movie for user, movie, _ in split_rows(path, data, "valid", encodings)}
    for user, _, history in split_rows(path, data, "test", encodings):
        assert user not in valid or history[-1] == valid[user]  # The test row's history ends with the valid row.


def test_without_tie_break_the_rows_of_a_moment_share_their_split_and_see_none_of_each_other(tmp_path: Path) -> None:
    path, data, encodings = prepared(tmp_path, "csv", tie_break=None)

    found = {split: split_rows(path, data, split, encodings) for split in ("train", "valid", "test")}

    events = events_by_user(tie_break=False)
    for split, rank in (("test", -1), ("valid", -2)):
        expected = {(user, movie) for user, e in events.items() if len(e) >= -rank for movie in e[rank]}
        assert {(user, movie) for user, movie, _ in found[split]} == expected
    # u1's last moment (300) holds three rows, all test rows, whose histories hold the earlier moments alone.
    assert sorted((movie, seen) for user, movie, seen in found["test"] if user == "u1") == [
        ("30", ["10", "20"]),
        ("40", ["10", "20"]),
        ("50", ["10", "20"]),
    ]


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
def test_the_splits_rows_are_the_same_whatever_the_batch_size_shuffle_and_parse_threads(
    tmp_path: Path, file_format: str
) -> None:
    path, data, encodings = prepared(tmp_path, file_format)
    small_chunks = {"read_chunk_bytes": 40} if file_format == "csv" else {}

    for split in ("train", "valid", "test"):
        plain = split_rows(path, data, split, encodings)
        other = split_rows(
            path,
            data,
            split,
            encodings,
            batch_size=2,
            shuffle=True,
            shuffle_buffer_size=4,
            seed=7,
            parse_threads=2,
            **small_chunks,
        )
        assert sorted(map(str, other)) == sorted(map(str, plain))


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
def test_count_before_counts_only_earlier_training_rows_of_every_user(tmp_path: Path, file_format: str) -> None:
    path = write_ratings(tmp_path, file_format)
    data = schema(
        file_format,
        derived=[DerivedColumn(name="movie_before", source="movie", transform="count_before")],
        dense=[DenseColumns(columns=["movie_before"])],
        categorical=[CategoricalColumns(columns=["user", "movie"], num_buckets=0)],
    )
    ranked = gathered(path, data)
    counting = reader_class(data)(path, data, split="train", encodings=ranked, batch_size=1)
    encodings = load_or_build_encodings(str(tmp_path / "counts.npz"), data, counting.count_values)
    encodings = Encodings(encodings.vocabularies, encodings.counts, ranks=ranked.ranks)
    reader = reader_class(data)(path, data, split="test", encodings=encodings, batch_size=1, shuffle=False)

    counts = {
        (USER_IDS[b.sparse["user"].ids.item()], MOVIE_IDS[b.sparse["movie"].ids.item()]): b.dense.item()
        for step in reader
        for b in step
    }

    # A test row counts the training rows of its movie strictly before it in time, of every user: never a
    # training row of another user that comes later (under leave-one-out, training rows are not all earlier).
    events = events_by_user(tie_break=True)
    training = [
        (movie[0], time)
        for user, e in events.items()
        for movie in e[:-2]
        for u, m, _, time in RATINGS
        if (u, m) == (user, movie[0])
    ]
    times = {(user, movie): int(time) for user, movie, _, time in RATINGS}
    assert counts[("u3", "10")] == 1.0  # u1's movie 10 @100 trains before it; u2's @400 trains too, but later.
    for (user, movie), count in counts.items():
        assert count == sum(m == movie and int(t) < times[(user, movie)] for m, t in training), (user, movie)


def test_a_reader_of_a_leave_one_out_split_needs_the_gathered_events(tmp_path: Path) -> None:
    path = write_ratings(tmp_path, "csv")
    with pytest.raises(ValueError, match=r"leave-one-out split needs the keys' `ranks`"):
        TabularReader(path, schema("csv"), split="valid", batch_size=1)


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
@pytest.mark.parametrize(
    ("split", "message"),
    [
        (
            SplitByValue(column="time", last_of="person"),
            r"The key column of the leave-one-out split, `split.last_of`, must be a column of .* 'person' is neither",
        ),
        (
            SplitByValue(column="time", last_of="user", tie_break="item"),
            r"The column `split.tie_break` must be a column of .* 'item' is neither",
        ),
    ],
)
def test_a_split_naming_no_column_stops_in_one_line(
    tmp_path: Path, file_format: str, split: SplitByValue, message: str
) -> None:
    path = write_ratings(tmp_path, file_format)
    with pytest.raises(DataError, match=message) as error:
        reader_class(schema(file_format))(path, schema(file_format, split=split), split="all", batch_size=1)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"last_of": "user"}, r"`split.column` must name the column that orders the rows of each `last_of` key"),
        (
            {"column": "time", "last_of": "user", "valid_from": 300.0},
            r"`split.valid_from` must be unset with `last_of` .* but is 300 instead",
        ),
        (
            {"column": "time", "last_of": "user", "test_from": 300.0},
            r"`split.test_from` must be unset with `last_of`",
        ),
        ({"column": "time", "tie_break": "movie", "valid_from": 1.0}, r"`split.tie_break` orders the rows of a"),
        ({"column": "time", "last_of": "time"}, r"`split.last_of` must name a key column other than `column`"),
    ],
)
def test_a_misused_leave_one_out_split_stops_in_one_line(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        SplitByValue(**values)
    assert "\n" not in str(error.value)


def test_leave_one_out_refuses_windows_of_time() -> None:
    with pytest.raises(ValueError, match=r"Leave-one-out .* so `windows.by` must be `none`, but is `column`"):
        schema("csv", windows=WindowsSection(by="column", every="1h"))


def test_an_empty_user_under_leave_one_out_is_a_malformed_row(tmp_path: Path) -> None:
    path = write_ratings(tmp_path, "csv", [*RATINGS[:3], ("", "99", "4", "120")])
    data = schema("csv")
    encodings = gathered(path, data)

    with pytest.raises(DataError, match=r"Line 5 of .*ratings.csv is malformed: `user`, the key of the leave-one-out"):
        split_rows(path, data, "train", encodings)
    assert np.isin(["u1"], [u for u, _, _ in split_rows(path, data, "test", encodings, max_malformed_rows=1)])


def test_a_row_the_pass_at_start_up_did_not_order_is_a_malformed_row(tmp_path: Path) -> None:
    _, data, encodings = prepared(tmp_path, "csv")
    (tmp_path / "later").mkdir()
    grown = write_ratings(tmp_path / "later", "csv", [*RATINGS, ("u1", "99", "4", "900")])  # Appended since.

    with pytest.raises(DataError, match=r"Line 14 of .*ratings.csv is malformed: it was not in the files when the"):
        split_rows(grown, data, "test", encodings)


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
def test_a_malformed_row_is_named_by_its_own_fault_and_its_user_tests_on_the_row_before(
    tmp_path: Path, file_format: str
) -> None:
    columns = {"user": ["u1"] * 3, "movie": [10, 20, 30], "rating": [5.0, 3.0, 4.0], "time": [100, 200, 300]}
    ages = [30.0, 31.0, float("nan")]  # The last row's dense value is not a finite number.
    path = str(tmp_path / f"ratings.{file_format}")
    if file_format == "parquet":
        pq.write_table(pa.table({**columns, "age": ages}), path)
    else:
        with open(path, "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow([*columns, "age"])
            writer.writerows(zip(*columns.values(), ["30", "31", "x"]))
    data = schema(file_format, dense=[DenseColumns(columns=["age"])])
    encodings = gathered(path, data)

    with pytest.raises(DataError, match=r"(Line 4|Row 3) of .*ratings.* is malformed: `age` must be a finite number"):
        split_rows(path, data, "test", encodings)
    test = split_rows(path, data, "test", encodings, max_malformed_rows=1)
    assert [(user, movie) for user, movie, _ in test] == [("u1", "20")]  # The malformed row is no event.
