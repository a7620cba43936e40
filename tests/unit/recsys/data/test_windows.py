"""``WindowSequence``: windows in time order, one reader each; the next one found by time (a late one too); the
state holds the window's name and the position in it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from recipes import DataError
from recsys.data.memory import InMemoryReader
from recsys.data.windows import Window, WindowSequence


class Windows:
    def __init__(self, windows: list[Window]) -> None:
        self.list = windows

    def windows(self) -> Sequence[Window]:
        return sorted(self.list, key=lambda window: window.start)

    def describe(self) -> str:
        return "test windows"


def window(name: str, start: float, rows: int) -> Window:
    return Window(name, start, (str(rows),))


def rows_reader(window: Window) -> InMemoryReader[torch.Tensor]:
    """Batches of 2 rows numbered by the window's start: window 10's rows are 1000, 1001, ..."""
    first = int(window.start) * 100
    return InMemoryReader(lambda rows: rows + first, int(window.paths[0]), 2, shuffle=False)


def sequence(source: Windows, follow: bool = False) -> WindowSequence[torch.Tensor]:
    return WindowSequence(source, rows_reader, rows_reader, follow=follow, poll_interval_s=0.5)


def read_window(reader: WindowSequence[torch.Tensor]) -> list[list[int]]:
    return [batches[0].tolist() for batches in reader]


def test_windows_are_read_in_time_order_one_reader_each() -> None:
    reader = sequence(Windows([window("b", 20, 4), window("a", 10, 2)]))
    assert (reader.window_index, reader.window_name, read_window(reader)) == (-1, "", [])

    assert reader.next_window_ready() is True
    reader.start_next_window()
    assert (reader.window_index, reader.window_name, read_window(reader)) == (0, "a", [[1000, 1001]])
    assert [batches[0].tolist() for batches in reader.window_scoring_reader()] == [[1000, 1001]]

    assert reader.next_window_ready() is True
    reader.start_next_window()
    assert (reader.window_index, reader.window_name, read_window(reader)) == (1, "b", [[2000, 2001], [2002, 2003]])
    assert reader.next_window_ready() is None  # The end of the data.


def test_a_following_reader_waits_and_then_takes_the_next_window_by_time() -> None:
    source = Windows([window("a", 10, 2)])
    reader = sequence(source, follow=True)
    reader.next_window_ready()
    reader.start_next_window()
    read_window(reader)
    assert reader.next_window_ready() is False  # Not yet.
    assert reader.poll_interval_s == 0.5
    assert reader.waiting_for() == "test windows"

    source.list += [window("c", 30, 2), window("b", 20, 2), window("early", 5, 2)]
    assert reader.next_window_ready() is True
    reader.start_next_window()
    assert reader.window_name == "b"  # The first after the current one; one earlier is not taken.


def test_the_state_resumes_in_the_same_window_at_the_same_row() -> None:
    source = Windows([window("a", 10, 2), window("b", 20, 6)])
    reader = sequence(source)
    for _ in range(2):
        reader.next_window_ready()
        reader.start_next_window()
    next(reader)
    state = reader.state_dict()
    assert (state["window"], state["window_index"]) == ("b", 1)

    resumed = sequence(source)
    resumed.load_state_dict(state)
    assert (resumed.window_index, resumed.window_name) == (1, "b")
    assert read_window(resumed) == read_window(reader) == [[2002, 2003], [2004, 2005]]


def test_a_fresh_state_resumes_before_the_first_window_and_a_gone_window_is_an_error() -> None:
    reader = sequence(Windows([window("a", 10, 2)]))
    reader.load_state_dict(sequence(Windows([])).state_dict())
    assert reader.window_index == -1

    with pytest.raises(DataError, match="The window z of the checkpoint must still be in the data to resume in it"):
        reader.load_state_dict({"window": "z", "window_index": 3, "reader": {}})


def test_starting_a_window_that_is_not_ready_is_a_programming_error() -> None:
    reader = sequence(Windows([]))
    with pytest.raises(RuntimeError, match="must follow a `next_window_ready` that is True"):
        reader.start_next_window()
    with pytest.raises(RuntimeError, match="must follow `start_next_window`"):
        reader.window_scoring_reader()
