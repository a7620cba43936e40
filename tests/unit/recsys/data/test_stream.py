"""The streaming readers' base: a line reader's raw chunks, and resuming from the state of older checkpoints."""

from __future__ import annotations

import threading
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from recipes.training.data_reader import DataError
from recsys.data import stream
from recsys.data.stream import START, ParsedLines, Position, StreamingLineReader


class NumberLines(StreamingLineReader[list[int]]):
    """One integer per line; a batch is the list of its rows' integers."""

    def parse(self, buffer: bytes, file_index: int, at_file_start: bool) -> ParsedLines:
        lines = buffer.splitlines()
        line_ends = np.cumsum([len(line) + 1 for line in lines]).astype(np.int64)
        numbers = np.array([int(line) for line in lines], dtype=np.int64)
        return ParsedLines(line_ends, np.ones(len(lines), np.bool_), (numbers,), {})

    def make_batch(self, columns: tuple[npt.NDArray[Any], ...]) -> list[int]:
        return [int(n) for n in columns[0]]

    def empty_columns(self) -> tuple[npt.NDArray[Any], ...]:
        return (np.zeros(0, np.int64),)


def write_numbers(path: Path, numbers: range) -> str:
    path.write_text("".join(f"{n}\n" for n in numbers))
    return str(path)


def test_line_chunks_are_the_raw_chunks_of_whole_lines_with_their_positions(tmp_path: Path) -> None:
    paths = [write_numbers(tmp_path / "a", range(0, 12)), write_numbers(tmp_path / "b", range(12, 15))]
    reader = NumberLines(paths, batch_size=2, read_chunk_bytes=10)

    chunks = list(reader.line_chunks(START))

    assert b"".join(chunk for _, chunk in chunks) == b"".join(Path(p).read_bytes() for p in paths)
    assert all(chunk.endswith(b"\n") for _, chunk in chunks)
    assert [position.file_index for position, _ in chunks] == [0] * (len(chunks) - 1) + [1]
    for (position, chunk), (following, _) in pairwise(chunks):
        if following.file_index == position.file_index:
            assert following == Position(0, position.offset + len(chunk), position.record_number + chunk.count(b"\n"))


def test_a_state_dict_that_names_byte_offset_and_line_number_still_resumes(tmp_path: Path) -> None:
    path = write_numbers(tmp_path / "numbers", range(40))

    def reader() -> NumberLines:
        return NumberLines(path, batch_size=2, shuffle_buffer_size=8, seed=1, read_chunk_bytes=7)

    interrupted = reader()
    head = [next(interrupted) for _ in range(5)]
    state = interrupted.state_dict()
    older = {**state, "byte_offset": state.pop("offset"), "line_number": state.pop("record_number")}

    resumed = reader()
    resumed.load_state_dict(older)

    assert head + list(resumed) == list(reader())


# Parsing ahead on threads: the same steps, resumes and errors as one thread. ----------------------------


class RecordingNumberLines(NumberLines):
    """NumberLines that records the threads it parses on, and fails on a line ``bad``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.parse_thread_names: set[str] = set()
        super().__init__(*args, **kwargs)

    def parse(self, buffer: bytes, file_index: int, at_file_start: bool) -> ParsedLines:
        self.parse_thread_names.add(threading.current_thread().name)
        if b"bad" in buffer:
            raise DataError(f"a bad line in file {file_index}")
        return super().parse(buffer, file_index, at_file_start)


def numbers_in(steps: list[list[list[int]]]) -> list[int]:
    return [n for step in steps for batch in step for n in batch]


@pytest.mark.parametrize("parse_threads", [2, 3])
def test_chunks_parsed_on_threads_give_the_same_steps_and_resume_the_same(tmp_path: Path, parse_threads: int) -> None:
    paths = [write_numbers(tmp_path / "a", range(0, 150)), write_numbers(tmp_path / "b", range(150, 230))]

    def reader(threads: int) -> RecordingNumberLines:
        options: dict[str, Any] = {"shuffle_buffer_size": 24, "seed": 4, "read_chunk_bytes": 16}
        return RecordingNumberLines(paths, batch_size=4, num_accumulate=2, parse_threads=threads, **options)

    expected = list(reader(1))
    threaded = reader(parse_threads)
    assert list(threaded) == expected and len(set(numbers_in(expected))) == 224  # 28 whole steps of 8
    assert {name.split("_")[0] for name in threaded.parse_thread_names} == {"parse"}  # parsed off the caller

    interrupted = reader(parse_threads)
    head = [next(interrupted) for _ in range(9)]
    resumed = reader(parse_threads)
    resumed.load_state_dict(interrupted.state_dict())
    assert head + list(resumed) == expected


@pytest.mark.parametrize("where", ["parse", "read"])
def test_an_error_met_ahead_is_raised_where_one_thread_meets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    path = tmp_path / "numbers"
    bad_line = "bad" if where == "parse" else "9" * 40  # a line too long to read, with the limit lowered below
    path.write_text("".join(f"{n}\n" for n in range(60)) + bad_line + "\n" + "".join(f"{n}\n" for n in range(9)))
    monkeypatch.setattr(stream, "MAX_LINE_BYTES", 30)

    def steps_before_the_error(threads: int) -> tuple[list[list[list[int]]], str]:
        reader = RecordingNumberLines(
            str(path), batch_size=2, shuffle=False, shuffle_buffer_size=4, read_chunk_bytes=12, parse_threads=threads
        )
        steps = []
        with pytest.raises(DataError) as error:
            for step in reader:
                steps.append(step)
        return steps, str(error.value)

    one = steps_before_the_error(1)
    assert steps_before_the_error(3) == one
    assert len(one[0]) >= 28  # the steps of the lines before the bad one (chunk boundaries decide the rest)


def test_a_seek_stops_the_thread_that_read_ahead(tmp_path: Path) -> None:
    path = write_numbers(tmp_path / "numbers", range(400))

    def reading_threads() -> int:
        return sum(thread.name == "parse-read" for thread in threading.enumerate())

    before = reading_threads()
    reader = NumberLines(path, batch_size=2, shuffle_buffer_size=8, read_chunk_bytes=8, parse_threads=2)
    for _ in range(5):
        next(reader)
        reader.load_state_dict(reader.state_dict())  # each seek closes the chunks read so far

    assert reading_threads() - before <= 1  # the current read's thread only
    reader.load_state_dict(reader.state_dict())
    list(reader)
    assert reading_threads() == before  # at the end of the files the thread has ended


def test_a_directory_given_as_a_data_file_is_one_line_saying_so(tmp_path: Path) -> None:
    """Once "does not exist", of a directory that does."""
    folder = tmp_path / "day_0"
    folder.mkdir()

    with pytest.raises(DataError) as error:
        stream.open_files(str(folder), "dataset.train_path")

    assert str(error.value) == (
        f"`dataset.train_path` must name files, but file://{folder} is a directory (a glob names its files)."
    )


def test_the_first_records_are_read_from_the_head_of_a_file_not_a_whole_chunk(tmp_path: Path) -> None:
    """The start-up check parses the lines it looks at, not the reading chunk of megabytes around them."""
    path = write_numbers(tmp_path / "long.txt", range(500_000))
    reader = NumberLines([path], batch_size=4)

    first = reader.first_records(0, num_records=100)

    assert first is not None
    assert 100 < len(first.valid) < 20_000
    assert first.columns[0][:3].tolist() == [0, 1, 2]


def test_the_first_records_of_a_short_or_empty_file(tmp_path: Path) -> None:
    (tmp_path / "short.txt").write_text("7\n8")  # The last line without its newline.
    (tmp_path / "empty.txt").write_text("")
    reader = NumberLines([str(tmp_path / "short.txt"), str(tmp_path / "empty.txt")], batch_size=4)

    first = reader.first_records(0, num_records=100)

    assert first is not None and first.columns[0].tolist() == [7, 8]
    assert reader.first_records(1, num_records=100) is None


def test_a_first_line_longer_than_any_line_may_be_is_one_line_saying_so(tmp_path: Path) -> None:
    (tmp_path / "one_line.txt").write_text("1" * 2 * stream.MAX_LINE_BYTES)  # No newline in the first 2 MiB.
    reader = NumberLines([str(tmp_path / "one_line.txt")], batch_size=4)

    with pytest.raises(DataError, match="must be at most 1048576 bytes long"):
        reader.check_first_rows()
