"""Several labels (``dataset.labels``): the schema's one-line errors, and the CSV and Parquet readers' ``[B, T]``
labels, one column per task, a regression task's number and a binary task's click alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recipes.training.data_reader import DataError
from recsys.click.batch import CTRBatch
from recsys.click.tasks import Task
from recsys.tabular.formats.arrow import ArrowFormatConfig
from recsys.tabular.formats.delimited_text import TabularReader
from recsys.tabular.formats.libsvm import LibSVMConfig
from recsys.tabular.formats.parquet import ParquetReader
from recsys.tabular.hashing import hash_value
from recsys.tabular.labels import LabelColumn, LabelTask
from recsys.tabular.schema import CategoricalColumns, DenseColumns, DerivedColumn, SplitByValue, TabularDataSection

TASKS = [
    LabelTask(column="rating", kind="regression", weight=0.5),
    LabelTask(column="rating", name="liked", threshold=4.0),
    LabelTask(column="clicked", positive=["yes"], negative=["no"]),
]
ROWS = {"rating": [4.5, 2.0, 4.0, 1.5], "clicked": ["yes", "no", "no", "yes"], "city": ["a", "b", "c", "d"]}
EXPECTED = [[4.5, 1.0, 1.0], [2.0, 0.0, 0.0], [4.0, 1.0, 0.0], [1.5, 0.0, 1.0]]


def schema(**overrides: Any) -> TabularDataSection:
    values: dict[str, Any] = {
        "labels": TASKS,
        "categorical": [CategoricalColumns(columns=["city"], num_buckets=1000)],
    }
    values.update(overrides)
    return TabularDataSection(**values)


def write_csv(path: Path, rows: dict[str, list[Any]]) -> str:
    lines = [",".join(rows)] + [",".join(str(value) for value in row) for row in zip(*rows.values())]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def write_parquet(path: Path, rows: dict[str, list[Any]]) -> str:
    pq.write_table(pa.table(rows), str(path))
    return str(path)


def read(reader_class: Any, path: str, data: TabularDataSection, **kwargs: Any) -> list[CTRBatch]:
    options: dict[str, Any] = {"batch_size": 2, "shuffle": False, "drop_last": False, "max_malformed_rows": 0}
    options.update(kwargs)
    return [batch for step in reader_class(path, data, **options) for batch in step]


# The schema ------------------------------------------------------------------------------------


def test_a_task_is_named_after_its_column_unless_named_and_the_schema_lists_the_tasks_in_order() -> None:
    data = schema()

    assert data.tasks == [Task("rating", "regression", 0.5), Task("liked", "binary"), Task("clicked", "binary")]
    assert [task.column for task in data.label_tasks] == ["rating", "rating", "clicked"]


def test_the_tasks_of_labels_replace_a_label_that_a_preset_it_is_based_on_sets() -> None:
    """``movielens_multitask`` is ``movielens_small``, whose ``label`` it inherits, with ``labels``: they are read."""
    data = schema(label=LabelColumn(column="clicked", threshold=0.5))

    assert [task.name for task in data.tasks or []] == ["rating", "liked", "clicked"]
    assert [(task.column, task.threshold) for task in data.label_tasks] == [
        ("rating", None),
        ("rating", 4.0),
        ("clicked", None),
    ]


def test_the_one_label_is_one_binary_task_whose_metrics_keep_their_bare_names() -> None:
    data = TabularDataSection(label=LabelColumn(column="click", threshold=0.5))

    assert data.tasks is None
    assert [(task.name, task.kind, task.threshold) for task in data.label_tasks] == [("click", "binary", 0.5)]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"labels": []}, r"^`dataset.labels` must name at least one task, but is an empty list"),
        (
            {"labels": [LabelTask(column="a"), LabelTask(column="b", name="a")]},
            r"^Each task of `labels` must have a name of its own, but \['a'\] are named twice\.$",
        ),
        (
            {"dense": [DenseColumns(columns=["rating"])]},
            r"^A label column must not be a feature too, but \['rating'\] are both\.$",
        ),
        (
            {
                "labels": [LabelTask(column="hour")],
                "derived": [DerivedColumn(name="hour", source="time")],
                "split": SplitByValue(column="time", valid_from=1.0),
            },
            r"^A label must be a column of the files, but \['hour'\] are joined or derived columns\.$",
        ),
        ({"format": LibSVMConfig(), "categorical": []}, r"^`format: libsvm` has one label.*names 3 tasks"),
    ],
)
def test_a_wrong_list_of_labels_is_refused_in_one_line(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        schema(**overrides)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("task", "message"),
    [
        ({"column": "a", "name": "a/b"}, r"^A task's `name` must not hold '/' .* but is 'a/b'\.$"),
        (
            {"column": "a", "kind": "regression", "threshold": 1.0},
            r"^`threshold` must be null for the regression task 'a', which reads the number itself, but is 1.0\.$",
        ),
    ],
)
def test_a_wrong_task_is_refused_in_one_line(task: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LabelTask(**task)


# The readers -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("reader_class", "write"), [(TabularReader, write_csv), (ParquetReader, write_parquet)])
def test_each_task_is_a_column_of_the_labels_a_regression_its_number_a_binary_its_click(
    tmp_path: Path, reader_class: Any, write: Any
) -> None:
    data = schema(format=ArrowFormatConfig()) if reader_class is ParquetReader else schema()
    path = write(tmp_path / ("rows.parquet" if reader_class is ParquetReader else "rows.csv"), ROWS)

    batches = read(reader_class, path, data)

    assert [batch.labels.shape for batch in batches] == [(2, 3), (2, 3)]
    assert [row for batch in batches for row in batch.labels.tolist()] == EXPECTED
    cities = [hash_value(city, "city", 1000) for city in ROWS["city"]]
    assert [i for batch in batches for i in batch.sparse["city"].ids.tolist()] == cities


@pytest.mark.parametrize(("reader_class", "write"), [(TabularReader, write_csv), (ParquetReader, write_parquet)])
def test_one_task_of_labels_gives_labels_of_one_dimension_as_label_does(
    tmp_path: Path, reader_class: Any, write: Any
) -> None:
    formats = {"format": ArrowFormatConfig()} if reader_class is ParquetReader else {}
    data = schema(labels=[TASKS[0]], **formats)
    path = write(tmp_path / ("rows.parquet" if reader_class is ParquetReader else "rows.csv"), ROWS)

    batches = read(reader_class, path, data, batch_size=4)

    assert batches[0].labels.tolist() == ROWS["rating"]


def test_shuffled_rows_keep_their_labels_beside_their_features(tmp_path: Path) -> None:
    rows = {"rating": [float(i) for i in range(64)], "clicked": ["yes", "no"] * 32, "city": [str(i) for i in range(64)]}
    path = write_csv(tmp_path / "rows.csv", rows)

    batches = read(TabularReader, path, schema(), batch_size=8, shuffle=True, shuffle_buffer_size=16, seed=1)

    seen = []
    for batch in batches:
        for (rating, liked, clicked), city in zip(batch.labels.tolist(), batch.sparse["city"].ids.tolist()):
            row = int(rating)
            assert city == hash_value(str(row), "city", 1000)
            assert (liked, clicked) == (float(row >= 4), float(row % 2 == 0))
            seen.append(row)
    assert sorted(seen) == list(range(64)) and seen != list(range(64))


@pytest.mark.parametrize(
    ("rating", "clicked", "fragment"),
    [
        ("x", "yes", "the label `rating` must be a finite number, but is 'x' instead"),
        ("", "yes", "the label `rating` must be a finite number, but is '' instead"),
        ("3", "maybe", "the label `clicked` must be one of 'yes', 'no', but is 'maybe' instead"),
    ],
)
def test_a_field_that_is_no_label_of_its_task_names_the_column_and_line(
    tmp_path: Path, rating: str, clicked: str, fragment: str
) -> None:
    path = tmp_path / "rows.csv"
    path.write_text(f"rating,clicked,city\n1,no,a\n{rating},{clicked},b\n")

    with pytest.raises(DataError) as error:
        read(TabularReader, str(path), schema())

    assert f"line 3 of file://{path} is malformed: {fragment}" in str(error.value).replace("Line", "line")


def test_a_parquet_regression_label_must_be_a_number(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "rows.parquet", {**ROWS, "rating": ["4", "2", "4", "1"]})

    with pytest.raises(
        DataError, match=r"column .rating. of .*rows.parquet must be a number \(for `threshold` or `kind: regression`\)"
    ):
        read(ParquetReader, path, schema(format=ArrowFormatConfig()))
