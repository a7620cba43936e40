"""The distinct ids each table looks up, counted over a reader's batches once and saved for every later start."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from recipes import DataError
from recsys.click.batch import CTRBatch, make_ctr_batch
from recsys.models.embeddings import TableSpec
from recsys.tabular.cardinality import count_table_ids, load_or_count_cardinalities

TABLES = [TableSpec("user", 100, ("user",)), TableSpec("shared", 100, ("city", "home"), pooling="mean")]


def batch(user: list[int], city: list[list[int]], home: list[int]) -> CTRBatch:
    def jagged(bags: list[list[int]]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        return np.array([i for bag in bags for i in bag], np.int64), np.cumsum([0, *map(len, bags)]).astype(np.int64)

    sparse = {"user": jagged([[u] for u in user]), "city": jagged(city), "home": jagged([[h] for h in home])}
    return make_ctr_batch(np.zeros((len(user), 0), np.float32), sparse, np.zeros(len(user), np.float32))


def test_each_table_counts_the_distinct_ids_of_all_its_features_over_every_batch() -> None:
    steps = [
        [batch([1, 2, 2], [[5, 6], [], [5]], [7, 7, 8])],
        [batch([2, 3], [[9], [6]], [5, 1 << 62]), batch([], [], [])],
    ]

    assert count_table_ids(steps, TABLES) == {"user": 3, "shared": 6}


def test_the_counts_are_saved_at_the_first_start_and_loaded_after(tmp_path: Path) -> None:
    path = f"memory://{tmp_path}/cardinalities.json"
    calls = []

    def count() -> dict[str, int]:
        calls.append(1)
        return {"user": 3, "shared": 6}

    assert load_or_count_cardinalities(path, TABLES, count) == {"user": 3, "shared": 6}
    assert load_or_count_cardinalities(path, TABLES, count) == {"user": 3, "shared": 6}
    assert len(calls) == 1


def test_saved_counts_without_a_table_of_the_model_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "cardinalities.json"
    path.write_text(json.dumps({"user": 3}))

    with pytest.raises(DataError, match="those of shared are not; use a new output directory"):
        load_or_count_cardinalities(str(path), TABLES, lambda: {"user": 3, "shared": 6})
