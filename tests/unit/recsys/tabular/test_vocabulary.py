"""Vocabularies: frequent values get ids of their own, the rest share the out-of-vocabulary id; saved and reloaded."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from recipes.training.data_reader import DataError
from recsys.tabular.formats.delimited_text import TabularReader
from recsys.tabular.hashing import text_keys
from recsys.tabular.labels import LabelColumn
from recsys.tabular.schema import CategoricalColumns, DenseColumns, DerivedColumn, TabularDataSection
from recsys.tabular.vocabulary import Encodings, KeyCounter, Vocabulary, load_or_build_encodings


def schema(min_count: int = 2, num_buckets: int = 100) -> TabularDataSection:
    return TabularDataSection(
        label=LabelColumn(column="click"),
        categorical=[
            CategoricalColumns(columns=["city"], vocabulary=True, min_count=min_count, num_buckets=num_buckets),
            CategoricalColumns(columns=["tags"], vocabulary=True, min_count=min_count, separator="|"),
        ],
    )


def write_rows(path: Path) -> None:
    rows = ["Paris,a|b", "Paris,a", "Rome,a", "Paris,", "Oslo,b|c", "Rome,a", ",a"]
    path.write_text("click,city,tags\n" + "".join(f"{i % 2},{row}\n" for i, row in enumerate(rows)))


def read_ids(path: Path, data: TabularDataSection, encodings: Encodings) -> tuple[list[int], list[int]]:
    reader = TabularReader(str(path), data, encodings=encodings, batch_size=100, shuffle=False, drop_last=False)
    (batch,) = next(iter(reader))
    return batch.sparse["city"].ids.tolist(), batch.sparse["tags"].ids.tolist()


def test_frequent_values_get_their_own_ids_by_falling_count(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    write_rows(path)
    data = schema(min_count=2)
    encodings = load_or_build_encodings(
        str(tmp_path / "vocabularies.npz"), data, TabularReader(str(path), data, batch_size=1).count_values
    )

    cities, tags = read_ids(path, data, encodings)

    # Paris (3 times) -> 2, Rome (2) -> 3, Oslo (once) -> out of vocabulary 1, empty -> 0.
    assert cities == [2, 2, 3, 2, 1, 3, 0]
    # a (5 times) -> 2, b (2) -> 3, c (once) -> 1; the empty field of row 4 -> 0.
    assert tags == [2, 3, 2, 2, 0, 3, 1, 2, 2]


def test_the_vocabulary_is_capped_at_the_table_size(tmp_path: Path) -> None:
    vocabulary = Vocabulary.from_counts(
        np.array([5, 6, 7, 0], np.uint64), np.array([1, 9, 4, 50], np.int64), min_count=1, num_buckets=4
    )

    assert vocabulary.lookup(np.array([6, 7, 5, 0, 8], np.uint64)).tolist() == [2, 3, 1, 0, 1]


def test_a_saved_vocabulary_is_reused_and_must_match_the_config(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    write_rows(path)
    saved = str(tmp_path / "vocabularies.npz")
    data = schema()
    first = load_or_build_encodings(saved, data, TabularReader(str(path), data, batch_size=1).count_values)

    def must_not_count() -> dict[str, tuple[np.ndarray, np.ndarray]]:  # type: ignore[type-arg]
        raise AssertionError("a saved vocabulary must be loaded, not counted again")

    again = load_or_build_encodings(saved, data, must_not_count)
    assert {n: v.keys.tolist() for n, v in again.vocabularies.items()} == {
        n: v.keys.tolist() for n, v in first.vocabularies.items()
    }

    with pytest.raises(DataError, match=r"vocabulary of `city` saved in .* must have been built with min_count=3"):
        load_or_build_encodings(saved, schema(min_count=3), must_not_count)


def test_counts_merge_over_chunks() -> None:
    counter = KeyCounter()
    for keys in ([3, 1, 3], [1, 2], [3]):
        counter.add(np.array(keys, np.uint64))

    totals = counter.totals()

    assert dict(zip(totals.keys.tolist(), totals.counts.tolist())) == {1: 2, 2: 1, 3: 3}


def test_ordered_counts_count_the_rows_before_each_row() -> None:
    counter = KeyCounter(ordered=True)
    counter.add(np.array([3, 1, 3], np.uint64), np.array([30.0, 5.0, 10.0]))
    counter.add(np.array([3, 2], np.uint64), np.array([20.0, 7.0]))

    totals = counter.totals()
    keys = np.array([3, 3, 3, 3, 1, 9, 0], np.uint64)
    orders = np.array([10.0, 10.5, 30.0, 99.0, 5.0, 1.0, 1.0])

    assert totals.orders is not None and totals.orders.tolist() == [5.0, 7.0, 10.0, 20.0, 30.0]
    # Key 3 at 10, 20 and 30: none before 10 (itself), one before 10.5, two before 30, all three before 99.
    assert np.array_equal(totals.lookup(keys, orders), [0, 1, 2, 3, 0, 0, np.nan], equal_nan=True)
    assert np.array_equal(totals.lookup(keys), [3, 3, 3, 3, 1, 0, np.nan], equal_nan=True)


def test_min_count_without_a_vocabulary_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"`min_count` applies with `vocabulary: true` only"):
        CategoricalColumns(columns=["city"], min_count=2)


def test_saved_value_counts_are_reused_and_must_cover_every_count_column(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    write_rows(path)
    saved = str(tmp_path / "vocabularies.npz")
    popularity = DerivedColumn(name="city_rows", source="city", transform="count")
    data = dataclasses.replace(schema(), derived=[popularity], dense=[DenseColumns(columns=["city_rows"])])
    first = load_or_build_encodings(saved, data, TabularReader(str(path), data, batch_size=1).count_values)

    def must_not_count() -> dict[str, tuple[np.ndarray, np.ndarray]]:  # type: ignore[type-arg]
        raise AssertionError("saved counts must be loaded, not counted again")

    again = load_or_build_encodings(saved, data, must_not_count)
    keys = text_keys(pa.array(["Paris", "Rome", "Oslo", ""]), "city")
    for encodings in (first, again):
        assert np.array_equal(encodings.counts["city_rows"].lookup(keys), [3, 2, 1, np.nan], equal_nan=True)

    other = DerivedColumn(name="tag_rows", source="city", transform="count")
    with pytest.raises(DataError, match=r"The counts of `tag_rows` must be saved in .*vocabularies.npz"):
        load_or_build_encodings(saved, dataclasses.replace(data, derived=[popularity, other]), must_not_count)
