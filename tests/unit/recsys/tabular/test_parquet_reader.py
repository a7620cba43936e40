"""The Parquet reader: the CSV reader's batches from typed columns, streamed, sharded and resumed by row group."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from recipes.training.data_reader import DataError
from recsys.click.batch import CTRBatch
from recsys.tabular.added_columns import AddedColumns
from recsys.tabular.formats.arrow import ArrowFormatConfig
from recsys.tabular.formats.delimited_text import CsvConfig, TabularReader
from recsys.tabular.formats.parquet import ParquetReader
from recsys.tabular.hashing import hash_value
from recsys.tabular.labels import LabelColumn
from recsys.tabular.schema import CategoricalColumns, DenseColumns, TabularDataSection
from recsys.tabular.typed_columns import TypedRows

ROWS = {
    "click": [1, -1, 1, -1, 1],
    "age": [3, None, 7, -2, 0],
    "score": [0.5, 1.25, None, 2.0, -1.0],
    "city": ["Lyon", "Rome", None, "Lyon", "Oslo"],
    "zip": [69001, 12, 69001, None, 7],
}


def schema(**overrides: Any) -> TabularDataSection:
    values: dict[str, Any] = {
        "format": ArrowFormatConfig(),
        "label": LabelColumn(column="click", positive=["1"], negative=["-1"]),
        "dense": [DenseColumns(columns=["age"], log=True), DenseColumns(columns=["score"], fill=-1.0)],
        "categorical": [CategoricalColumns(columns=["city", "zip"], num_buckets=1000)],
    }
    values.update(overrides)
    return TabularDataSection(**values)


def write(path: Path | str, columns: dict[str, Any], **options: Any) -> str:
    with fsspec.open(str(path), "wb") as file:
        pq.write_table(pa.table(columns), file, **options)
    return str(path)


def read(path: str, data: TabularDataSection, **kwargs: Any) -> list[CTRBatch]:
    options: dict[str, Any] = {"batch_size": 1, "shuffle": False, "drop_last": False, "max_malformed_rows": 0}
    options.update(kwargs)
    return [batch for step in ParquetReader(path, data, **options) for batch in step]


def flat(batches: list[CTRBatch]) -> dict[str, list[Any]]:
    """Every row's label, dense values and ids, in reading order."""
    return {
        "labels": [v for b in batches for v in b.labels.tolist()],
        "dense": [v for b in batches for v in b.dense.tolist()],
        **{
            name: [
                b.sparse[name].ids[b.sparse[name].offsets[i] : b.sparse[name].offsets[i + 1]].tolist()
                for b in batches
                for i in range(b.batch_size)
            ]
            for name in batches[0].sparse
        },
    }


def test_roles_and_values_match_the_csv_reader_on_the_same_rows(tmp_path: Path) -> None:
    parquet = write(tmp_path / "rows.parquet", ROWS)
    csv = tmp_path / "rows.csv"
    pa_csv.write_csv(pa.table(ROWS), csv, pa_csv.WriteOptions(quoting_style="none"))
    csv_schema = schema(format=CsvConfig())

    from_parquet = flat(read(parquet, schema()))
    from_csv = flat([b for step in TabularReader(str(csv), csv_schema, batch_size=1, shuffle=False) for b in step])

    assert from_parquet == from_csv
    assert from_parquet["labels"] == [1.0, 0.0, 1.0, 0.0, 1.0]
    assert from_parquet["dense"][1] == [0.0, 1.25] and from_parquet["dense"][2][1] == -1.0  # nulls: `fill`
    assert from_parquet["dense"][0][0] == pytest.approx(np.log(4.0))
    assert from_parquet["city"] == [[hash_value(c, "city", 1000)] if c else [0] for c in ROWS["city"]]
    assert from_parquet["zip"][0] == [hash_value("69001", "zip", 1000)]  # an int's id is its text's
    assert from_parquet["zip"][3] == [0]


def test_dictionary_encoded_and_plain_columns_give_the_same_ids(tmp_path: Path) -> None:
    columns = {**ROWS, "city": pa.array(ROWS["city"]).dictionary_encode()}  # a pandas categorical, say
    plain = write(tmp_path / "plain.parquet", ROWS, use_dictionary=False)
    encoded = write(tmp_path / "encoded.parquet", columns, row_group_size=2)

    assert flat(read(plain, schema())) == flat(read(encoded, schema())) == flat(read(encoded, schema(), batch_size=4))


def test_a_sliced_batch_with_nulls_converts_like_its_values() -> None:
    text = pa.array(["a", None, "b", "a", None, "c", "b"] * 3)
    ages = pa.array([None, 1, 2, None, 4, None] * 3 + [1, 2, 3])
    batch = pa.record_batch({"click": [1] * 21, "age": ages, "city": text.dictionary_encode()}).slice(5, 11)
    data = schema(
        label=LabelColumn(column="click"),
        categorical=[CategoricalColumns(columns=["city"])],
        dense=[DenseColumns(columns=["age"], fill=-1.0)],
    )

    (_, dense, ids), problems, keep = TypedRows(data, AddedColumns(data, batch.schema.names, "train")).convert(batch)

    assert not problems and keep is None
    assert ids.tolist() == [0 if v is None else hash_value(v, "city", 1_000_000) for v in text[5:16].to_pylist()]
    assert dense[:, 0].tolist() == [-1.0 if v is None else v for v in ages[5:16].to_pylist()]


def test_multi_hot_from_a_separated_string_and_from_a_list_column(tmp_path: Path) -> None:
    tags = {"click": [1, 0, 1, 0], "age": [1, 2, 3, 4]}
    text = write(tmp_path / "text.parquet", {**tags, "tags": ["a|b", "", None, "c"]})
    lists = write(tmp_path / "lists.parquet", {**tags, "tags": [["a", "b"], [], None, ["c"]]})
    numbers = write(tmp_path / "numbers.parquet", {**tags, "tags": [[5, 6], [None], None, [7]]})
    data = schema(
        label=LabelColumn(column="click"),
        dense=[DenseColumns(columns=["age"])],
        categorical=[CategoricalColumns(columns=["tags"], separator="|", num_buckets=50)],
    )

    expected = [[hash_value("a", "tags", 50), hash_value("b", "tags", 50)], [0], [0], [hash_value("c", "tags", 50)]]
    assert flat(read(text, data, batch_size=2))["tags"] == expected
    assert flat(read(lists, data, batch_size=2))["tags"] == expected
    assert flat(read(numbers, data))["tags"] == [
        [hash_value("5", "tags", 50), hash_value("6", "tags", 50)],
        [0],
        [0],
        [hash_value("7", "tags", 50)],
    ]


def test_a_memory_filesystem_path_and_a_threshold_label(tmp_path: Path) -> None:
    path = write("memory://parquet-test/ratings.parquet", {"rating": [4.5, 2.0, 4.0], "age": [1, 2, 3]})
    data = schema(
        label=LabelColumn(column="rating", threshold=4.0), dense=[DenseColumns(columns=["age"])], categorical=[]
    )

    assert flat(read(path, data))["labels"] == [1.0, 0.0, 1.0]


def numbered(path: Path, first: int, num_rows: int, **options: Any) -> str:
    """Rows whose dense column ``row`` says which row they are."""
    rows = list(range(first, first + num_rows))
    return write(path, {"click": [r % 2 for r in rows], "row": rows, "city": [f"c{r % 7}" for r in rows]}, **options)


NUMBERED = schema(
    label=LabelColumn(column="click"),
    dense=[DenseColumns(columns=["row"])],
    categorical=[CategoricalColumns(columns=["city"], num_buckets=100)],
)


def row_ids(steps: list[list[CTRBatch]]) -> list[list[list[int]]]:
    return [[[int(v) for v in batch.dense[:, 0].tolist()] for batch in step] for step in steps]


def test_two_ranks_read_disjoint_rows_that_cover_the_files_in_equal_steps(tmp_path: Path) -> None:
    paths = [numbered(tmp_path / "a.parquet", 0, 50, row_group_size=7), numbered(tmp_path / "b.parquet", 50, 30)]

    def rank(dp_rank: int) -> list[list[list[int]]]:
        reader = ParquetReader(
            paths, NUMBERED, batch_size=4, dp_rank=dp_rank, dp_size=2, shuffle_buffer_size=16, read_batch_rows=5, seed=3
        )
        return row_ids(list(reader))

    first, second = rank(0), rank(1)

    assert len(first) == len(second) == 80 // 8
    rows = [[r for step in steps for batch in step for r in batch] for steps in (first, second)]
    assert not set(rows[0]) & set(rows[1]) and sorted(rows[0] + rows[1]) == list(range(80))
    assert rows[0] + rows[1] != sorted(rows[0] + rows[1])  # shuffled


@pytest.fixture
def row_groups_read(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The row groups of every ``iter_batches`` call."""
    calls: list[list[int]] = []
    iter_batches = pq.ParquetFile.iter_batches

    def recording(self: pq.ParquetFile, *args: Any, row_groups: Any = None, **kwargs: Any) -> Iterator[Any]:
        calls.append(list(row_groups) if row_groups is not None else [-1])
        return iter_batches(self, *args, row_groups=row_groups, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", recording)
    return calls


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("stop_after", [0, 1, 4, 6])
def test_resume_reads_exactly_the_rows_an_uninterrupted_read_reads_from_the_right_row_group(
    tmp_path: Path, shuffle: bool, stop_after: int, row_groups_read: list[list[int]]
) -> None:
    day_0 = numbered(tmp_path / "day_0.parquet", 0, 40, row_group_size=6)
    write(
        tmp_path / "day_1.parquet",
        {"click": [1] * 50 + [7], "row": list(range(40, 91)), "city": ["x"] * 51},
        row_group_size=6,
    )

    # Two ranks, accumulation, windows of 24 rows over two files and chunks of 4, a malformed row.
    options = {"batch_size": 3, "num_accumulate": 2, "dp_rank": 1, "dp_size": 2, "shuffle_buffer_size": 20}
    options |= {"seed": 5, "read_batch_rows": 4, "max_malformed_rows": 1}

    def reader() -> ParquetReader:
        return ParquetReader([day_0, str(tmp_path / "day_1.parquet")], NUMBERED, shuffle=shuffle, **options)

    uninterrupted = reader()
    uninterrupted.reset()  # Resume within the second epoch, whose shuffle differs from the first's.
    expected = row_ids(list(uninterrupted))
    assert len(expected) == 90 // 12

    interrupted = reader()
    interrupted.reset()
    head = row_ids([next(interrupted) for _ in range(stop_after)])
    state = interrupted.state_dict()

    resumed = reader()
    del row_groups_read[:]
    resumed.load_state_dict(state)
    assert head + row_ids(list(resumed)) == expected
    if state["offset"] >= 6:  # The window starts past the file's first row group: that one is not read again.
        assert row_groups_read[0] == [state["offset"] // 6] and state["offset"] // 6 > 0
    # One row group per read: pyarrow reads all the groups it is given at once, and memory would grow with a file.
    assert all(len(groups) == 1 for groups in row_groups_read)


def test_malformed_rows_are_skipped_up_to_the_limit_with_their_row_number(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = schema(label=LabelColumn(column="click"), dense=[DenseColumns(columns=["age"])], categorical=[])
    integers = write(tmp_path / "ints.parquet", {"click": [1, 0, 2, 1, 9], "age": [1.0, float("nan"), 3, 4, 5]})
    floats = write(tmp_path / "floats.parquet", {"click": [1.0, 0.0], "age": [1, 2]})

    with caplog.at_level(logging.WARNING, logger="recsys.data.stream"):
        rows = flat(read(integers, data, max_malformed_rows=3))["dense"]
    assert rows == [[1.0], [4.0]]
    assert f"Skipping row 2 of file://{integers}, which is malformed: `age` must be a finite number" in caplog.text
    assert (
        "Skipping row 3" in caplog.text and "the label `click` must be one of '1', '0', but is 2 instead" in caplog.text
    )

    with pytest.raises(DataError, match=rf"^Row 5 of file://{integers} is malformed: .* over the limit"):
        read(integers, data, max_malformed_rows=2)
    with pytest.raises(DataError, match=r"The column 'click' of .*floats.parquet must be a string, integer or boolean"):
        read(floats, data)  # a float label needs `threshold`


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"click": [1], "city": ["a"]}, r"The schema's column 'age' must be a column of file://.*bad.parquet, but"),
        (
            {"click": [1], "age": ["3"], "city": ["a"]},
            r"The column 'age' of .*bad.parquet must be an integer or "
            r"floating-point number, but is string instead",
        ),
        ({"click": [1], "age": [3], "city": [1.5]}, r"The column 'city' of .* must be a string or integer .* double"),
        ({"click": [1], "age": [3], "city": [["a"]]}, r"'city' .* \(a list needs `multi_hot: true`\)"),
    ],
)
def test_a_file_whose_columns_do_not_fit_the_schema_fails_at_construction(
    tmp_path: Path, columns: dict[str, Any], message: str
) -> None:
    good = write(tmp_path / "good.parquet", {"click": [1], "age": [3], "city": ["a"]})
    bad = write(tmp_path / "bad.parquet", columns)
    data = schema(
        dense=[DenseColumns(columns=["age"])],
        categorical=[CategoricalColumns(columns=["city"])],
        label=LabelColumn(column="click"),
    )

    with pytest.raises(DataError, match=message):
        ParquetReader([good, bad], data, batch_size=1)


def test_a_vocabulary_a_missing_file_a_non_parquet_file_and_bad_first_rows_are_refused(tmp_path: Path) -> None:
    data = schema(label=LabelColumn(column="click"), dense=[DenseColumns(columns=["age"])], categorical=[])
    (tmp_path / "text.parquet").write_text("click,age\n1,2\n")
    bad_rows = write(tmp_path / "bad.parquet", {"click": [5, 1, 6], "age": [1, 2, 3]})

    with pytest.raises(ValueError, match=r"`vocabulary` must be false with `format: parquet`.*\['age'\]"):
        replace(data, dense=[], categorical=[CategoricalColumns(["age"], vocabulary=True)])
    with pytest.raises(DataError, match=r"must name existing files, but .*missing.parquet does not exist"):
        ParquetReader(str(tmp_path / "missing.parquet"), data, batch_size=1)
    with pytest.raises(DataError, match=r"text.parquet must be a Parquet file, but is not"):
        ParquetReader(str(tmp_path / "text.parquet"), data, batch_size=1)
    reader = ParquetReader(bad_rows, data, batch_size=1, max_malformed_rows=1)
    with pytest.raises(
        DataError,
        match=r"^Row 3 of .*bad.parquet does not fit the schema: the label `click` must "
        r"be one of '1', '0', but is 6 instead \(found checking the first 100 rows",
    ):
        reader.check_first_rows()


def test_row_groups_converted_on_threads_give_the_same_ids(tmp_path: Path) -> None:
    # Each row group brings its own dictionary: batches converted at once on several threads must each use theirs.
    cities = [f"city{(r // 10) * 10 + r % 3}" for r in range(400)]
    encoded = write(
        tmp_path / "encoded.parquet",
        {"click": [r % 2 for r in range(400)], "row": list(range(400)), "city": pa.array(cities).dictionary_encode()},
        row_group_size=10,
    )

    def flat_read(threads: int) -> dict[str, list[Any]]:
        return flat(read(encoded, NUMBERED, batch_size=16, read_batch_rows=10, parse_threads=threads))

    expected = flat_read(1)
    assert expected["city"] == [[hash_value(city, "city", 100)] for city in cities]
    assert flat_read(4) == expected
