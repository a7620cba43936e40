"""The texts behind a column's ids, collected from the files as the readers read them: each value's id is the one the
readers give it (``hash_value``), whatever the quoting, whitespace, separator or column type."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from recsys.tabular.formats.arrow import ArrowFormatConfig
from recsys.tabular.formats.delimited_text import CsvConfig, TabularReader
from recsys.tabular.formats.parquet import ParquetReader
from recsys.tabular.hashing import hash_value
from recsys.tabular.labels import LabelColumn
from recsys.tabular.schema import CategoricalColumns, TabularDataSection
from recsys.tabular.value_texts import feature_value_texts

BUCKETS = 1000


def texts_of(table: pa.Table) -> dict[str, int]:
    return dict(zip(table.column("value").to_pylist(), table.column("id").to_pylist()))


def test_a_csv_files_quoted_spaced_and_split_values_get_the_readers_ids(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text('click,city,tags\n1," Lyon ","a|b"\n0,"Rome, ""old""",b| c |\n1,,\n0,Lyon,a\n')
    schema = TabularDataSection(
        format=CsvConfig(),
        label=LabelColumn(column="click"),
        categorical=[
            CategoricalColumns(columns=["city"], num_buckets=BUCKETS),
            CategoricalColumns(columns=["tags"], separator="|", num_buckets=BUCKETS),
        ],
    )
    reader = TabularReader(str(path), schema, batch_size=1, shuffle=False, drop_last=False)

    texts = feature_value_texts(schema, reader, None)

    assert texts_of(texts["city"]) == {v: hash_value(v, "city", BUCKETS) for v in ["Lyon", 'Rome, "old"']}
    assert texts_of(texts["tags"]) == {v: hash_value(v, "tags", BUCKETS) for v in ["a", "b", "c"]}
    assert texts["city"].column("id").to_pylist() == sorted(texts["city"].column("id").to_pylist())
    read = [batch.sparse["city"].ids.tolist() for step in reader for batch in step]  # the reader's own ids
    assert read == [[texts_of(texts["city"])["Lyon"]], [texts_of(texts["city"])['Rome, "old"']], [0], [read[0][0]]]


def test_a_parquet_files_integers_and_lists_get_the_readers_ids(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    columns = {"click": [1, 0, 1], "zip": [69001, None, 7], "tags": [["x", "y"], [], None]}
    pq.write_table(pa.table(columns), path)
    schema = TabularDataSection(
        format=ArrowFormatConfig(),
        label=LabelColumn(column="click"),
        categorical=[
            CategoricalColumns(columns=["zip"], num_buckets=BUCKETS),
            CategoricalColumns(columns=["tags"], multi_hot=True, num_buckets=0),  # a hash table's: the full key
        ],
    )
    reader = ParquetReader(str(path), schema, batch_size=1, shuffle=False, drop_last=False)

    texts = feature_value_texts(schema, reader, None)

    assert texts_of(texts["zip"]) == {
        "69001": hash_value("69001", "zip", BUCKETS),
        "7": hash_value("7", "zip", BUCKETS),
    }
    assert texts_of(texts["tags"]) == {v: hash_value(v, "tags", 0) for v in ["x", "y"]}
