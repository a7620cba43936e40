"""Histories: the values a key's earlier rows held, gathered over chunks and looked up per row."""

from __future__ import annotations

import numpy as np

from recsys.tabular.history import HistoryBuilder


def keys(*values: int) -> np.ndarray:
    return np.array(values, np.uint64)


def bags_of(values: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = [len(bag) for bag in values]
    return keys(*(v for bag in values for v in bag)), np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def as_lists(bags: tuple[np.ndarray, np.ndarray]) -> list[list[int]]:
    values, offsets = bags
    return [values[offsets[r] : offsets[r + 1]].tolist() for r in range(len(offsets) - 1)]


def test_a_row_sees_the_latest_rows_of_its_key_strictly_before_it() -> None:
    builder = HistoryBuilder()
    # Two chunks, out of time order: user 7 at times 30, 10, 20, 20; user 8 at 15.
    builder.add(keys(7, 8, 7), np.array([30.0, 15.0, 10.0]), bags_of([[3], [8], [1, 11]]), np.ones(3, bool))
    builder.add(keys(7, 7), np.array([20.0, 20.0]), bags_of([[2], [22]]), np.ones(2, bool))
    history = builder.build()

    looked_up = history.lookup(keys(7, 7, 7, 7, 8, 9, 0), np.array([10.0, 20.0, 25.0, 99.0, 99.0, 99.0, 99.0]), 2)

    assert as_lists(looked_up) == [
        [0],  # nothing before time 10: the missing value
        [1, 11],  # the rows at 20 do not see each other
        [2, 22],  # the latest two rows before 25
        [22, 3],  # ... and before 99: the second row at 20 (files' order breaks the tie) and the row at 30
        [8],
        [0],  # a key without rows
        [0],  # the missing key
    ]


def test_left_out_rows_and_missing_values_are_not_gathered() -> None:
    builder = HistoryBuilder()
    rows = np.array([True, False, True, True])
    builder.add(keys(7, 7, 0, 7), np.array([1.0, 2.0, 3.0, np.nan]), bags_of([[5, 0], [6], [7], [8]]), rows)
    history = builder.build()

    assert as_lists(history.lookup(keys(7), np.array([10.0]), 5)) == [[5]]


def test_an_empty_history_answers_missing() -> None:
    history = HistoryBuilder().build()

    assert as_lists(history.lookup(keys(7, 8), np.array([1.0, 2.0]), 3)) == [[0], [0]]
