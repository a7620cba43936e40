"""Columns a schema adds (joined side tables, derived columns) and the split of one file's rows by value,
the same through the CSV and the Parquet reader."""

from __future__ import annotations

import csv
import datetime
import gzip
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recipes.training.data_reader import DataError
from recsys.tabular.added_columns import TIME_RANGE_S, time_part, times_out_of_range
from recsys.tabular.formats.arrow import ArrowFormatConfig
from recsys.tabular.formats.delimited_text import CsvConfig, TabularReader
from recsys.tabular.formats.parquet import ParquetReader
from recsys.tabular.hashing import hash_value
from recsys.tabular.labels import LabelColumn
from recsys.tabular.schema import (
    CategoricalColumns,
    DenseColumns,
    DerivedColumn,
    JoinedTable,
    SplitByValue,
    TabularDataSection,
    resolve_path,
)
from recsys.tabular.vocabulary import Encodings, ValueCounts, load_or_build_encodings

RATINGS = {
    "user": ["u1", "u2", "u1", "u3", "u2", "u4"],
    "movie": ["10", "20", "30", "10", "99", "20"],
    "rating": ["5", "3", "4", "2", "4.5", "1"],
    "time": ["100", "200", "300", "400", "500", "600"],
}
MOVIES = {"movie": ["10", "20", "30"], "genres": ["Drama|War", "Comedy", ""], "year": ["1995", "2001", ""]}
TAGS = {"movie": ["10", "10", "30", "20"], "tag": ["dark", "long", "funny", "late"], "time": ["50", "60", "70", "650"]}


def write_table(path: Path, columns: dict[str, list[str]]) -> str:
    """``columns`` as a CSV file with a header, or as Parquet (strings) when ``path`` ends in .parquet."""
    if path.suffix == ".parquet":
        pq.write_table(pa.table({name: pa.array(values, pa.string()) for name, values in columns.items()}), path)
        return str(path)
    with open(path, "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(columns)
        writer.writerows(zip(*columns.values()))
    return str(path)


def write_ratings(directory: Path, file_format: str, ratings: dict[str, list[str]] = RATINGS) -> str:
    if file_format == "csv":
        return write_table(directory / "ratings.csv", ratings)
    typed = {
        "user": pa.array(ratings["user"]),
        "movie": pa.array([int(m) for m in ratings["movie"]]),
        "rating": pa.array([float(r) for r in ratings["rating"]]),
        "time": pa.array([int(t) if t else None for t in ratings["time"]], pa.int64()),
    }
    pq.write_table(pa.table(typed), directory / "ratings.parquet")
    return str(directory / "ratings.parquet")


def movie_schema(directory: Path, file_format: str, **overrides: Any) -> TabularDataSection:
    values: dict[str, Any] = {
        "format": ArrowFormatConfig() if file_format == "parquet" else CsvConfig(),
        "label": LabelColumn(column="rating", threshold=4.0),
        "joins": [
            JoinedTable(path=write_table(directory / "movies.csv", MOVIES), key="movie", columns=["genres", "year"]),
            JoinedTable(path=write_table(directory / "tags.parquet", TAGS), key="movie", columns=["tag"]),
        ],
        "derived": [
            DerivedColumn(name="popularity", source="movie", transform="count"),
            DerivedColumn(name="hour", source="time", transform="hour"),
        ],
        "dense": [DenseColumns(columns=["year"], fill=-1.0), DenseColumns(columns=["popularity"])],
        "categorical": [
            CategoricalColumns(columns=["user", "movie", "hour"], num_buckets=1000),
            CategoricalColumns(columns=["genres"], separator="|", num_buckets=1000),
            CategoricalColumns(columns=["tag"], multi_hot=True, num_buckets=1000),
        ],
        "split": SplitByValue(column="time", valid_from=450.0),
    }
    values.update(overrides)
    return TabularDataSection(**values)


def rows(path: str, data: TabularDataSection, split: str, encodings: Encodings | None = None) -> list[Any]:
    reader_class = ParquetReader if data.format.name == "parquet" else TabularReader
    reader = reader_class(
        path, data, split=split, encodings=encodings, batch_size=1, shuffle=False, drop_last=False, max_malformed_rows=0
    )
    return [batch for step in reader for batch in step]


def train_and_valid_rows(tmp_path: Path, path: str, data: TabularDataSection) -> tuple[list[Any], list[Any]]:
    """The rows of both splits, with the counts of a first pass over the training rows."""
    reader_class = ParquetReader if data.format.name == "parquet" else TabularReader
    encodings = load_or_build_encodings(
        str(tmp_path / "encodings.npz"), data, reader_class(path, data, split="train", batch_size=1).count_values
    )
    return rows(path, data, "train", encodings), rows(path, data, "valid", encodings)


def bag(batch: Any, name: str) -> list[int]:
    return batch.sparse[name].ids.tolist()  # type: ignore[no-any-return]


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
def test_joined_and_derived_columns_of_each_split(tmp_path: Path, file_format: str) -> None:
    path = write_ratings(tmp_path, file_format)
    data = movie_schema(tmp_path, file_format)
    train, valid = train_and_valid_rows(tmp_path, path, data)

    # time < 450 trains, the rest validates.
    assert [b.labels.item() for b in train] == [1.0, 0.0, 1.0, 0.0]
    assert [b.labels.item() for b in valid] == [1.0, 0.0]
    genre_ids = {g: hash_value(g, "genres", 1000) for g in ("Drama", "War", "Comedy")}
    assert [bag(b, "genres") for b in train] == [
        [genre_ids["Drama"], genre_ids["War"]],
        [genre_ids["Comedy"]],
        [0],  # movie 30's empty genres: the missing value
        [genre_ids["Drama"], genre_ids["War"]],
    ]
    assert [bag(b, "genres") for b in valid] == [[0], [genre_ids["Comedy"]]]  # movie 99 is not in movies.csv
    # Tags before the split only (movie 20's tag is from time 650): a movie's rows form its bag.
    tag_ids = {t: hash_value(t, "tag", 1000) for t in ("dark", "long", "funny")}
    assert [bag(b, "tag") for b in train] == [
        [tag_ids["dark"], tag_ids["long"]],
        [0],
        [tag_ids["funny"]],
        [
            tag_ids["dark"],
            tag_ids["long"],
        ],
    ]
    # Dense: year (missing: fill -1), then the training rows of the movie (movie 10 twice, 20 once, 99 never).
    assert [b.dense.tolist()[0] for b in train] == [[1995.0, 2.0], [2001.0, 1.0], [-1.0, 1.0], [1995.0, 2.0]]
    assert [b.dense.tolist()[0] for b in valid] == [[-1.0, 0.0], [2001.0, 1.0]]
    assert [bag(b, "hour") for b in train] == [[hash_value("0", "hour", 1000)]] * 4
    assert [bag(b, "movie") for b in valid] == [[hash_value("99", "movie", 1000)], [hash_value("20", "movie", 1000)]]


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
def test_test_rows_from_test_from_on(tmp_path: Path, file_format: str) -> None:
    path = write_ratings(tmp_path, file_format)
    data = movie_schema(tmp_path, file_format, split=SplitByValue(column="time", valid_from=250, test_from=450))
    counts = Encodings({}, {"popularity": ValueCounts(np.zeros(0, np.uint64), np.zeros(0, np.int64))})

    sizes = [len(rows(path, data, split, counts)) for split in ("train", "valid", "test")]

    assert sizes == [2, 2, 2]


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
def test_count_before_counts_the_training_rows_before_each_row(tmp_path: Path, file_format: str) -> None:
    path = write_ratings(tmp_path, file_format)
    data = movie_schema(
        tmp_path,
        file_format,
        joins=[],
        derived=[DerivedColumn(name="user_before", source="user", transform="count_before")],
        dense=[DenseColumns(columns=["user_before"])],
        categorical=[CategoricalColumns(columns=["movie"])],
    )
    train, valid = train_and_valid_rows(tmp_path, path, data)

    # Training rows u1@100, u2@200, u1@300, u3@400: what each user did before; validation rows u2@500, u4@600: all
    # of the user's training rows, as the model will know them when it serves.
    assert [b.dense.item() for b in train] == [0.0, 0.0, 1.0, 0.0]
    assert [b.dense.item() for b in valid] == [1.0, 0.0]


def test_count_before_needs_a_split_column() -> None:
    with pytest.raises(ValueError, match=r"`count_before` and `history` take the rows before a row in the order of"):
        TabularDataSection(
            label=LabelColumn(column="rating", threshold=4.0),
            derived=[DerivedColumn(name="user_before", source="user", transform="count_before")],
        )


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
def test_a_history_holds_what_the_key_did_before_in_every_split(tmp_path: Path, file_format: str) -> None:
    path = write_ratings(tmp_path, file_format, {**RATINGS, "user": ["u1", "u2", "u1", "u3", "u2", "u2"]})
    data = movie_schema(
        tmp_path,
        file_format,
        joins=movie_schema(tmp_path, "csv").joins[:1],
        derived=[
            DerivedColumn(name="genre_history", source="genres", transform="history", key="user", length=5),
            DerivedColumn(name="last_movie", source="movie", transform="history", key="user", length=1),
        ],
        dense=[],
        categorical=[
            CategoricalColumns(columns=["genres"], separator="|", num_buckets=1000),
            CategoricalColumns(columns=["genre_history", "last_movie"], multi_hot=True, num_buckets=1000),
        ],
    )
    reader_class = ParquetReader if file_format == "parquet" else TabularReader
    histories = reader_class(path, data, split="all", batch_size=1).histories()
    encodings = Encodings({}, {}, histories)

    train, valid = rows(path, data, "train", encodings), rows(path, data, "valid", encodings)

    # u1@100 m10, u2@200 m20, u1@300 m30, u3@400 m10 train; u2@500 m99, u2@600 m20 validate. A history keeps its
    # source's values (the genres' keys, hashed into its own table); missing values (m30's, m99's genres) are left out.
    genre = {g: hash_value(g, "genres", 1000) for g in ("Drama", "War", "Comedy")}
    assert [bag(b, "genre_history") for b in train] == [[0], [0], [genre["Drama"], genre["War"]], [0]]
    assert [bag(b, "genre_history") for b in valid] == [[genre["Comedy"]], [genre["Comedy"]]]
    movie = {m: hash_value(m, "movie", 1000) for m in ("10", "20", "99")}
    assert [bag(b, "last_movie") for b in train] == [[0], [0], [movie["10"]], [0]]
    # A validation row's history holds the earlier validation rows too: the user's latest movie is 99.
    assert [bag(b, "last_movie") for b in valid] == [[movie["20"]], [movie["99"]]]


def test_a_history_sharing_its_sources_table_gives_a_value_the_same_row(tmp_path: Path) -> None:
    path = write_ratings(tmp_path, "csv")
    shared = CategoricalColumns(columns=["genres", "seen"], separator="|", shared_table="genre_rows", num_buckets=50)
    data = movie_schema(
        tmp_path,
        "csv",
        joins=movie_schema(tmp_path, "csv").joins[:1],
        derived=[DerivedColumn(name="seen", source="genres", transform="history", key="user")],
        dense=[],
        categorical=[shared],
    )
    histories = TabularReader(path, data, split="all", batch_size=1).histories()

    train = rows(path, data, "train", Encodings({}, {}, histories))

    # u1 rated movie 10 (Drama|War) at 100: at 300, u1's history holds the rows movie 10's genres have.
    assert bag(train[2], "seen") == bag(train[0], "genres") == [hash_value(g, "genres", 50) for g in ("Drama", "War")]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"dense": [DenseColumns(columns=["h"])], "categorical": []},
            r"history 'h' is a bag of values: a categorical group with `multi_hot: true` must take it",
        ),
        ({"categorical": [CategoricalColumns(columns=["h"])]}, r"history 'h' is a bag of values"),
        (
            {"categorical": [CategoricalColumns(columns=["h"], multi_hot=True, vocabulary=True)]},
            r"history 'h' keeps its source's keys, which a `vocabulary` cannot count",
        ),
        ({"split": SplitByValue()}, r"`count_before` and `history` take the rows before a row in the order of"),
    ],
)
def test_a_history_the_schema_cannot_take_is_refused(change: dict[str, Any], message: str) -> None:
    history = DerivedColumn(name="h", source="movie", transform="history", key="user")
    values: dict[str, Any] = {
        "label": LabelColumn(column="rating", threshold=4.0),
        "derived": [history],
        "categorical": [CategoricalColumns(columns=["h"], multi_hot=True)],
        "split": SplitByValue(column="time", valid_from=450.0),
    }
    with pytest.raises(ValueError, match=message):
        TabularDataSection(**{**values, **change})


@pytest.mark.parametrize("transform", ["history", "count"])
def test_key_is_for_a_history_alone(transform: str) -> None:
    key = None if transform == "history" else "user"
    with pytest.raises(ValueError, match=rf"`key` must be set exactly for `transform: history`, .* key {key!r}"):
        DerivedColumn(name="h", source="movie", transform=transform, key=key)  # type: ignore[arg-type]


def test_a_row_without_a_split_value_is_malformed(tmp_path: Path) -> None:
    path = write_ratings(tmp_path, "csv", {**RATINGS, "time": ["100", "", "300", "400", "500", "600"]})
    data = movie_schema(tmp_path, "csv", derived=[], dense=[], categorical=[CategoricalColumns(columns=["user"])])

    with pytest.raises(DataError, match=r"Line 3 of .*ratings.csv is malformed: the split column `time` must hold"):
        rows(path, data, "valid")


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
@pytest.mark.parametrize("part", ["hour", "year"])
def test_a_time_outside_the_calendar_under_a_time_part_is_malformed_naming_file_row_and_value(
    tmp_path: Path, file_format: str, part: str
) -> None:
    """Once cast to garbage and trained, with a warning from numpy only."""
    times = ["100", "200", "1e20", "400", "500", "600"]
    if file_format == "csv":
        path = write_ratings(tmp_path, "csv", {**RATINGS, "time": times})
    else:
        path = str(tmp_path / "ratings.parquet")
        ratings = {**RATINGS, "rating": [float(r) for r in RATINGS["rating"]], "time": [float(t) for t in times]}
        pq.write_table(pa.table(ratings), path)
    data = movie_schema(
        tmp_path,
        file_format,
        joins=[],
        derived=[DerivedColumn(name="when", source="time", transform=part)],  # type: ignore[arg-type]
        dense=[],
        categorical=[CategoricalColumns(columns=["user", "when"])],
        split=SplitByValue(),
    )
    where = "Line 4 of .*ratings.csv" if file_format == "csv" else "Row 3 of .*ratings.parquet"

    with pytest.raises(
        DataError,
        match=rf"{where} is malformed: `time`, the time of the derived column 'when', must be seconds since 1970 in "
        r"years 1 to 9999 \(UTC\), but is 1e\+20 instead",
    ):
        rows(path, data, "train")


def test_a_side_table_with_several_rows_per_key_needs_multi_hot_for_a_single_value(tmp_path: Path) -> None:
    path = write_ratings(tmp_path, "csv")
    data = movie_schema(tmp_path, "csv", categorical=[CategoricalColumns(columns=["tag"])], dense=[], derived=[])

    with pytest.raises(DataError, match=r"column 'tag' of the joined table .*tags.parquet must have one value per key, "
                       r"but key '10' has several rows: take it as a bag \(`multi_hot: true`"):  # fmt: skip
        rows(path, data, "train")


def test_a_join_may_key_on_a_column_an_earlier_join_added(tmp_path: Path) -> None:
    path = write_ratings(tmp_path, "csv")
    studios = tmp_path / "studios.tsv"
    studios.write_text("studio\tcountry\nA\tFR\n")
    movies = write_table(tmp_path / "studio_of_movie.csv", {"movie": ["10", "20"], "studio": ["A", "B"]})
    data = movie_schema(
        tmp_path,
        "csv",
        joins=[
            JoinedTable(path=movies, key="movie", columns=["studio"]),
            JoinedTable(path=str(studios), key="studio", columns=["country"]),
        ],
        derived=[],
        dense=[],
        categorical=[CategoricalColumns(columns=["country"], num_buckets=100)],
        split=SplitByValue(),
    )

    countries = [bag(b, "country") for b in rows(path, data, "train")]

    fr = hash_value("FR", "country", 100)
    assert countries == [[fr], [0], [0], [fr], [0], [0]]  # movie 20's studio B has no country; 30, 99 no studio


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"joins": [JoinedTable(path="nowhere.csv", key="movie", columns=["genres"])]}, r"nowhere.csv must exist"),
        (
            {"derived": [DerivedColumn(name="user", source="time", transform="hour")]},
            r"added column must have a new name, but 'user' is a column of .*ratings.csv",
        ),
        (
            {"derived": [DerivedColumn(name="h", source="clock", transform="hour")]},
            r"source of the derived column 'h' must be a column of .*ratings.csv or one the schema adds before it, but "
            r"'clock' is neither",
        ),
        (
            {"split": SplitByValue(column="when", valid_from=1)},
            r"split column must be a column of .*ratings.csv .* 'when'",
        ),
        (
            {"derived": [DerivedColumn(name="h", source="movie", transform="history", key="who")]},
            r"key of the history 'h' must be a column of .*ratings.csv or one the schema adds before it",
        ),
        (
            {
                "derived": [DerivedColumn(name="h", source="user", transform="history", key="movie")],
                "categorical": [CategoricalColumns(columns=["user"], separator="|")],
            },
            r"source of the history 'h' must be a single-valued or a joined column, but 'user' is a multi-hot column",
        ),
    ],
)
def test_bad_added_columns_stop_in_one_line(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    path = write_ratings(tmp_path, "csv")
    base = {"dense": [], "categorical": [CategoricalColumns(columns=["user"])], "joins": [], "derived": []}
    data = movie_schema(tmp_path, "csv", **{**base, **change})

    with pytest.raises(DataError, match=message):
        rows(path, data, "train")


def test_a_joined_column_taken_as_a_number_must_hold_numbers(tmp_path: Path) -> None:
    path = write_ratings(tmp_path, "csv")
    movies = write_table(tmp_path / "years.csv", {"movie": ["10"], "year": ["nineteen"]})
    data = movie_schema(
        tmp_path,
        "csv",
        joins=[JoinedTable(path=movies, key="movie", columns=["year"])],
        derived=[],
        dense=[DenseColumns(columns=["year"])],
        categorical=[],
    )

    with pytest.raises(DataError, match=r"'year' of the joined table .*years.csv must hold numbers, but holds 'nin"):
        rows(path, data, "train")


def test_a_gzip_side_table(tmp_path: Path) -> None:
    path = write_ratings(tmp_path, "csv")
    with gzip.open(tmp_path / "movies.csv.gz", "wt") as file:
        file.write("movie,genres\n10,Drama\n")
    data = movie_schema(
        tmp_path,
        "csv",
        joins=[JoinedTable(path=str(tmp_path / "movies.csv.gz"), key="movie", columns=["genres"])],
        derived=[],
        dense=[],
        categorical=[CategoricalColumns(columns=["genres"], num_buckets=50)],
        split=SplitByValue(),
    )

    assert next(bag(b, "genres") for b in rows(path, data, "train")) == [hash_value("Drama", "genres", 50)]


@pytest.mark.parametrize("part", ["hour", "weekday", "day", "month", "year"])
def test_time_parts_agree_with_the_calendar(part: str) -> None:
    first, last = TIME_RANGE_S[0], TIME_RANGE_S[1] - 1  # Python's datetime.min and max, to the second
    seconds = np.array([0.0, 1_339_227_125.0, 951_782_400.0 + 86_399, -1.0, first, last, np.nan])
    expected = []
    for value in seconds[:-1]:
        moment = datetime.datetime.fromtimestamp(value, datetime.timezone.utc)
        expected.append(
            {"hour": moment.hour, "weekday": moment.weekday(), "day": moment.day, "month": moment.month}.get(
                part, moment.year
            )
        )

    parts = time_part(seconds, part)

    assert parts[:-1].tolist() == expected and np.isnan(parts[-1])
    utc = datetime.timezone.utc
    assert datetime.datetime.fromtimestamp(first, utc) == datetime.datetime.min.replace(tzinfo=utc)
    assert datetime.datetime.fromtimestamp(last, utc) == datetime.datetime.max.replace(microsecond=0, tzinfo=utc)


def test_a_time_outside_the_calendar_has_no_time_part_and_no_numpy_warning() -> None:
    seconds = np.array([1e20, -1e20, np.inf, -np.inf, TIME_RANGE_S[1], TIME_RANGE_S[0] - 1, np.nan, 0.0])

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parts = time_part(seconds, "year")

    assert np.isnan(parts[:-1]).all() and parts[-1] == 1970
    assert times_out_of_range(seconds).tolist() == [True] * 6 + [False, False]


def test_a_package_path_names_a_file_of_the_installed_package() -> None:
    path = resolve_path("package://recsys.tabular/schema.py")

    assert Path(path).is_file() and Path(path).parent.name == "tabular"
    assert resolve_path("/data/x.csv") == "/data/x.csv"
    with pytest.raises(ValueError, match="'no_such_package' is not"):
        resolve_path("package://no_such_package/x.csv")
