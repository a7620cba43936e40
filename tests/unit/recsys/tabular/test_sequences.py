"""Sequence columns in the schema: id lists and histories kept to their latest ``max_len`` ids, one table with the
candidate by ``same_ids_as``, jagged rows for the model, and the declarations refused in one line."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gang import FakeGang
from recipes import ConfigError, DataError
from recsys.click.batch import CTRBatch
from recsys.models.embeddings import TableSpec
from recsys.tabular.formats.arrow import ArrowFormatConfig
from recsys.tabular.formats.data_format import data_format
from recsys.tabular.formats.delimited_text import CsvConfig, TabularReader
from recsys.tabular.formats.parquet import ParquetReader
from recsys.tabular.hashing import hash_value
from recsys.tabular.labels import LabelColumn
from recsys.tabular.schema import CategoricalColumns, DerivedColumn, SplitByValue, TabularDataSection, with_full_keys
from recsys.tabular.vocabulary import Encodings
from recsys.zoo import ZOO_MODELS, build_zoo_model

ROWS = {
    "user": ["u1", "u2", "u1", "u1"],
    "movie": ["10", "20", "30", "40"],
    "recent": ["1|2|3|4|5", "", "7", "10|20|30|40"],
    "click": ["1", "0", "1", "0"],
    "time": ["100", "200", "300", "400"],
}
BUCKETS = 1000


def write(directory: Path, file_format: str) -> str:
    """The rows as a CSV file (``recent`` separated by ``|``) or as Parquet (``recent`` a list column)."""
    if file_format == "parquet":
        columns = {name: pa.array(values) for name, values in ROWS.items() if name != "recent"}
        columns["recent"] = pa.array(
            [text.split("|") if text else [] for text in ROWS["recent"]], pa.list_(pa.string())
        )
        columns["time"] = pa.array([int(t) for t in ROWS["time"]], pa.int64())
        pq.write_table(pa.table(columns), directory / "rows.parquet")
        return str(directory / "rows.parquet")
    with open(directory / "rows.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(ROWS)
        writer.writerows(zip(*ROWS.values()))
    return str(directory / "rows.csv")


def schema(file_format: str, *groups: CategoricalColumns, **overrides: Any) -> TabularDataSection:
    values: dict[str, Any] = {
        "format": ArrowFormatConfig() if file_format == "parquet" else CsvConfig(),
        "label": LabelColumn(column="click"),
        "categorical": [CategoricalColumns(columns=["user", "movie"], num_buckets=BUCKETS), *groups],
        "split": SplitByValue(column="time", valid_from=1000.0),
    }
    values.update(overrides)
    return TabularDataSection(**values)


def recent(**options: Any) -> CategoricalColumns:
    defaults: dict[str, Any] = {"columns": ["recent"], "separator": "|", "sequence": True, "max_len": 3}
    return CategoricalColumns(**{**defaults, **options})


def read(path: str, data: TabularDataSection, encodings: Encodings | None = None) -> list[CTRBatch]:
    reader_class = ParquetReader if data.format.name == "parquet" else TabularReader
    reader = reader_class(path, data, split="train", encodings=encodings, batch_size=4, shuffle=False, drop_last=False)
    return [batch for step in reader for batch in step]


def jagged(batch: CTRBatch, name: str) -> list[list[int]]:
    ids, offsets = batch.sparse[name].ids.tolist(), batch.sparse[name].offsets.tolist()
    return [ids[offsets[row] : offsets[row + 1]] for row in range(len(offsets) - 1)]


def movie_id(value: str) -> int:
    return hash_value(value, "movie", BUCKETS)


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
def test_a_sequence_keeps_its_latest_ids_as_the_candidates_ids_in_one_unpooled_table(
    tmp_path: Path, file_format: str
) -> None:
    data = schema(file_format, recent(same_ids_as="movie"))

    (batch,) = read(write(tmp_path, file_format), data)

    # The latest 3 of 1..5; an empty field is the missing id 0; "10" in the sequence is movie 10's id.
    assert jagged(batch, "recent") == [
        [movie_id("3"), movie_id("4"), movie_id("5")],
        [0],
        [movie_id("7")],
        [movie_id("20"), movie_id("30"), movie_id("40")],
    ]
    assert jagged(batch, "movie")[0] == [movie_id("10")]
    format_ = data_format(data)
    assert format_.tables() == [
        TableSpec("user", BUCKETS, ("user",)),
        TableSpec("movie", BUCKETS, ("movie", "recent"), "none"),
    ]
    assert format_.sequence_lengths() == {"recent": 3}


def test_a_sequence_of_its_own_hashes_apart_and_takes_the_candidates_table_size(tmp_path: Path) -> None:
    own = schema("csv", recent(num_buckets=50))
    shared = schema("csv", recent(same_ids_as="movie"))

    assert data_format(own).tables()[-1] == TableSpec("recent", 50, ("recent",), "none")
    assert jagged(read(write(tmp_path, "csv"), own)[0], "recent")[2] == [hash_value("7", "recent", 50)]
    assert shared.categorical[-1].num_buckets == BUCKETS


def test_hash_tables_see_one_full_key_for_a_value_of_both_columns(tmp_path: Path) -> None:
    data = with_full_keys(schema("csv", recent(same_ids_as="movie")))

    (batch,) = read(write(tmp_path, "csv"), data)

    assert jagged(batch, "recent")[3][0] == jagged(batch, "movie")[1][0]  # "20" in both
    assert jagged(batch, "recent")[3][0] > BUCKETS  # a full 64-bit key, not a row


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
def test_a_history_declared_as_a_sequence_holds_the_latest_earlier_movies(tmp_path: Path, file_format: str) -> None:
    path = write(tmp_path, file_format)
    history = DerivedColumn(name="watched", source="movie", transform="history", key="user", length=10)
    group = CategoricalColumns(columns=["watched"], sequence=True, max_len=2, same_ids_as="movie")
    data = schema(file_format, group, derived=[history])
    reader_class = ParquetReader if file_format == "parquet" else TabularReader
    histories = reader_class(path, data, split="all", batch_size=1).histories()

    (batch,) = read(path, data, Encodings({}, {}, histories))

    # u1 watched 10 at 100, 30 at 300: at 400 the latest two; u2 had watched nothing.
    assert jagged(batch, "watched") == [[0], [0], [movie_id("10")], [movie_id("10"), movie_id("30")]]


SEQUENCE = {"columns": ["recent"], "separator": "|", "sequence": True, "max_len": 3}


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([{"columns": ["recent"], "sequence": True}], r"`max_len` must be set for the sequence group"),
        ([{"columns": ["recent"], "multi_hot": True, "max_len": 5}], r"`max_len` applies to a group with"),
        ([{**SEQUENCE, "same_ids_as": "film"}], r"`same_ids_as` must name a categorical column of another group"),
        ([{**SEQUENCE, "same_ids_as": "recent"}], r"`same_ids_as` must name a categorical column of another group"),
        ([{**SEQUENCE, "same_ids_as": "movie", "num_buckets": 7}], r"`num_buckets` of \['recent'\] must be left out"),
        ([{**SEQUENCE, "same_ids_as": "movie", "vocabulary": True}], r"`vocabulary` and `shared_table` must not be"),
        (
            [{**SEQUENCE, "same_ids_as": "movie"}, {"columns": ["tags"], "separator": "|", "same_ids_as": "movie"}],
            r"A table is pooled one way, but the table of 'movie' is looked up by a sequence",
        ),
    ],
)
def test_a_sequence_the_schema_cannot_take_is_refused_in_one_line(groups: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        schema("csv", *(CategoricalColumns(**group) for group in groups))


def test_a_history_must_keep_the_kind_of_its_source() -> None:
    history = DerivedColumn(name="watched", source="user", transform="history", key="user")
    group = CategoricalColumns(columns=["watched"], sequence=True, max_len=2, same_ids_as="movie")
    with pytest.raises(ValueError, match=r"history 'watched' keeps the keys of its source 'user', so its"):
        schema("csv", group, derived=[history])


def test_a_model_that_pools_refuses_a_sequence_and_a_sequence_model_needs_one() -> None:
    tables = [TableSpec("user", 10, ("user",)), TableSpec("movie", 10, ("movie", "recent"), "none")]
    features = ["user", "movie", "recent"]
    pooled, din = ZOO_MODELS.get("mlp").default_config(), ZOO_MODELS.get("din").default_config()

    with pytest.raises(ConfigError, match=r"The model 'mlp' pools every feature, so it cannot read the sequence"):
        build_zoo_model(pooled, tables, features, 0, FakeGang(), 0, sequence_lengths={"recent": 3})
    with pytest.raises(ConfigError, match=r"The model 'din' reads behaviour sequences, so a categorical group must"):
        build_zoo_model(din, tables[:1], ["user"], 0, FakeGang(), 0)


def test_a_sequence_column_that_is_not_a_list_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"A sequence column of a csv file must hold its values split by `separator`"):
        schema("csv", recent(separator=None))
    pq.write_table(
        pa.table({"user": ["u1"], "movie": ["10"], "recent": ["1 2"], "click": ["1"], "time": [1]}),
        tmp_path / "flat.parquet",
    )
    with pytest.raises(
        DataError, match=r"The column 'recent' of .* must be a list of strings or integers \(a sequence\)"
    ):
        read(str(tmp_path / "flat.parquet"), schema("parquet", recent(separator=None)))
