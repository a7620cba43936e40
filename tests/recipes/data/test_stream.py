"""The streaming readers' base: a line reader's raw chunks, and resuming from the state of older checkpoints."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from recipes.data.stream import START, ParsedLines, Position, StreamingLineReader


class NumberLines(StreamingLineReader[list[int]]):
    """One integer per line; a batch is the list of its rows' integers."""

    def parse(self, buffer: bytes, file_index: int, first_line: int) -> ParsedLines:
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
