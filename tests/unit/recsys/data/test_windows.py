"""``WindowSequence``: windows in time order, one reader each; the next one the earliest not trained yet (a late
one too, said in a line); the state holds the windows trained, the current one's name and the position in it."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest
import torch

from recipes import DataError
from recsys.data.memory import InMemoryReader
from recsys.data.window_sequence import Window, WindowSequence


class Windows:
    def __init__(self, windows: list[Window]) -> None:
        self.list = windows

    def windows(self) -> Sequence[Window]:
        return sorted(self.list, key=lambda window: window.start)

    def windows_not_done(self) -> str:
        return "none waits"

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


def start_next(reader: WindowSequence[torch.Tensor]) -> str:
    """The name of the window the reader starts next."""
    assert reader.next_window_ready() is True
    reader.start_next_window()
    return reader.window_name


def test_a_following_reader_waits_then_takes_the_earliest_window_not_trained_a_late_one_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = Windows([window("a", 10, 2)])
    reader = sequence(source, follow=True)
    assert start_next(reader) == "a"
    read_window(reader)
    assert reader.next_window_ready() is False  # Not yet.
    assert reader.poll_interval_s == 0.5
    assert (reader.waiting_for(), reader.windows_not_done()) == ("test windows", "none waits")

    source.list += [window("c", 30, 2), window("b", 20, 2), window("early", 5, 2)]
    assert reader.next_window_ready() is True
    assert reader.next_window_start() == 5  # What the ranks agree on.
    with caplog.at_level(logging.WARNING, logger="recsys.data.window_sequence"):
        names = [reader.window_name, *(start_next(reader) for _ in range(3))]
    assert names == ["a", "early", "b", "c"]  # Each once, the earliest first: none is lost.
    assert [reader.window_index, reader.next_window_ready()] == [3, False]
    assert [record.getMessage() for record in caplog.records if record.name == "recsys.data.window_sequence"] == [
        "Window early is trained late, after a, a later one: it was not complete, or not there, when that one started."
    ]


def test_a_window_complete_after_a_later_one_is_trained_when_it_is_also_after_a_resume() -> None:
    """Days 1 and 3 complete, day 2 not: 1 and 3 are trained, the data ends; day 2 lands, the run resumes from
    its last state and trains day 2, and neither 1 nor 3 again."""
    source = Windows([window("day1", 1, 2), window("day3", 3, 2)])
    reader = sequence(source)
    assert [start_next(reader), start_next(reader)] == ["day1", "day3"]
    read_window(reader)
    assert reader.next_window_ready() is None  # The end of the data, as it is now.
    state = reader.state_dict()
    assert (state["window"], state["window_index"], state["trained"]) == ("day3", 1, ["day1", "day3"])

    source.list.append(window("day2", 2, 2))
    resumed = sequence(source)
    resumed.load_state_dict(state)
    assert read_window(resumed) == []  # Day 3 was read to its end.
    assert (start_next(resumed), resumed.window_index, read_window(resumed)) == ("day2", 2, [[200, 201]])
    assert resumed.next_window_ready() is None
    assert resumed.state_dict()["trained"] == ["day1", "day3", "day2"]


def test_a_state_without_the_windows_trained_means_all_up_to_its_window_were(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A checkpoint written before the reader kept the windows trained: it took them in time order. That reader
    skipped a window not complete when it passed it, so the windows taken as trained are named."""
    source = Windows([window("a", 10, 2), window("b", 20, 2), window("c", 30, 2)])
    reader = sequence(source)
    with caplog.at_level(logging.WARNING):
        reader.load_state_dict({"window": "b", "window_index": 1, "reader": rows_reader(source.list[1]).state_dict()})
    assert reader.state_dict()["trained"] == ["a", "b"]
    assert caplog.messages == [
        "The checkpoint does not record which windows were trained (it is older): the 2 complete windows up to b "
        "(a to b) count as trained; one that was not complete when that run passed it was not trained."
    ]
    read_window(reader)
    assert (start_next(reader), reader.window_index) == ("c", 2)


def test_the_state_resumes_in_the_same_window_at_the_same_row() -> None:
    source = Windows([window("a", 10, 2), window("b", 20, 6)])
    reader = sequence(source)
    for _ in range(2):
        reader.next_window_ready()
        reader.start_next_window()
    next(reader)
    state = reader.state_dict()
    assert (state["window"], state["window_index"], state["trained"]) == ("b", 1, ["a", "b"])

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
    with pytest.raises(RuntimeError, match="must follow a `next_window_ready` that is True"):
        reader.next_window_start()
    with pytest.raises(RuntimeError, match="must follow `start_next_window`"):
        reader.window_scoring_reader()
