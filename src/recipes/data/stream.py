"""Streaming readers of line-based files: bounded windows of rows, shuffled, sharded, resumable.

A subclass says how to parse a chunk of whole lines (``parse``) and how to make a batch of
rows (``make_batch``); this module does the rest, whatever the format. The reader never holds
more than one *window* of rows: it reads the files (any fsspec path, gzip by extension) in
chunks of whole lines, parses a chunk at once, and collects well-formed rows until the window
is full.

Why windows: a window is the shuffle buffer, shuffled with a generator seeded by
``(seed, epoch, window_index)``, and its start (file, byte offset, line number) is all a
resume needs. ``state_dict()`` records where the current window starts and how many steps were
taken from it; ``load_state_dict()`` re-reads that window, which yields the same rows in the same
order, and skips the steps already taken. No buffer content is ever saved.

- Every rank reads and parses every line, so that all ranks agree, without communicating, on
  which rows are well-formed and on where the epoch ends; it keeps only its own rows.
- Rows are dealt to ranks as ``recipes.data.sharding`` says; with ``drop_last`` a trailing
  partial step is dropped and counted in the log, without it served as a last, smaller step
  (only the epoch's last window can have one).
- A malformed line is logged with its file and line number and skipped; one more than
  ``max_malformed_rows`` in an epoch raises a ``DataError`` naming them.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import fsspec
import numpy as np
import numpy.typing as npt

from recipes.data.reader import DataError, DataReader
from recipes.data.sharding import StepLayout, window_permutation

logger = logging.getLogger(__name__)

BatchT = TypeVar("BatchT")

MAX_LINE_BYTES = 1 << 20


@dataclass(frozen=True)
class ParsedLines:
    """The lines of one chunk: per line, where it ends, whether it is a row, and its columns.

    ``columns`` hold one entry per line (their first dimension); the entries of lines that are
    not ``valid`` mean nothing. ``problems`` say what is wrong with the invalid lines; a line that
    is neither valid nor a problem (a header, say) is skipped silently.
    """

    line_ends: npt.NDArray[np.int64]  # byte offset just past each line's newline
    valid: npt.NDArray[np.bool_]
    columns: tuple[npt.NDArray[Any], ...]
    problems: dict[int, str]  # line index -> what is wrong with it


@dataclass(frozen=True)
class Position:
    """A line boundary in the stream: ``line_number`` lines of file ``file_index`` lie before it."""

    file_index: int
    byte_offset: int
    line_number: int


START = Position(0, 0, 0)


class StreamingLineReader(DataReader[BatchT], ABC, Generic[BatchT]):
    """Reads files of lines (plain, or gzip by the ``.gz`` extension) from any fsspec paths.

    ``paths`` is one path, URL or glob, or a list of them, read in order. ``shuffle_buffer_size``
    rows (rounded up to whole global steps) are read, shuffled if ``shuffle``, and served before
    the next ones are read.
    """

    _exhausted: bool
    _pending: tuple[Position, ParsedLines] | None

    def __init__(
        self,
        paths: str | Sequence[str],
        *,
        batch_size: int,
        num_accumulate: int = 1,
        dp_rank: int = 0,
        dp_size: int = 1,
        shuffle: bool = True,
        shuffle_buffer_size: int = 65_536,
        seed: int = 0,
        max_malformed_rows: int = 100,
        read_chunk_bytes: int = 1 << 20,
        drop_last: bool = True,
    ) -> None:
        self._layout = StepLayout(batch_size, num_accumulate, dp_rank, dp_size, drop_last)
        for name, value, minimum in (
            ("shuffle_buffer_size", shuffle_buffer_size, 1),
            ("max_malformed_rows", max_malformed_rows, 0),
            ("read_chunk_bytes", read_chunk_bytes, 1),
        ):
            if value < minimum:
                raise ValueError(f"`{name}` must be at least {minimum}, but is {value} instead.")
        self._files = open_files(paths)
        step_rows = self._layout.rows_per_global_step
        self._rows_per_window = -(-shuffle_buffer_size // step_rows) * step_rows
        self._shuffle = shuffle
        self._seed = seed
        self._max_malformed_rows = max_malformed_rows
        self._read_chunk_bytes = read_chunk_bytes

        self._epoch = 0
        self._chunks = self._read_chunks(START)  # Lazy: opens nothing before the first read.
        self._start_epoch()

    # What a format says -----------------------------------------------------------------------

    @abstractmethod
    def parse(self, buffer: bytes, file_index: int, first_line: int) -> ParsedLines:
        """The lines of ``buffer`` (whole, newline-terminated lines of file ``file_index``, the first
        of which is line ``first_line`` of the file, counting from 0)."""

    @abstractmethod
    def make_batch(self, columns: tuple[npt.NDArray[Any], ...]) -> BatchT:
        """A batch of the rows whose columns are given (any number of rows, zero included)."""

    @abstractmethod
    def empty_columns(self) -> tuple[npt.NDArray[Any], ...]:
        """Columns of zero rows, with the shapes and dtypes ``parse`` gives."""

    # The DataReader contract -------------------------------------------------------------------

    def __next__(self) -> list[BatchT]:
        while self._steps_taken == len(self._window_steps):
            if self._exhausted:
                raise StopIteration
            if not self._read_window():
                self._exhausted = True
                self._layout.log_dropped_rows(logger, self._epoch, self._dropped_rows)
                raise StopIteration
        self._steps_taken += 1
        return self._window_steps[self._steps_taken - 1]

    def reset(self) -> None:
        self._epoch += 1
        self._start_epoch()

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self._epoch,
            "window_index": self._window_index,
            "file_index": self._window_start.file_index,
            "byte_offset": self._window_start.byte_offset,
            "line_number": self._window_start.line_number,
            "malformed_rows": self._malformed_at_window_start,
            "steps_taken": self._steps_taken,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._epoch = int(state_dict["epoch"])
        self._start_epoch()
        window_index = int(state_dict["window_index"])
        if window_index < 0:
            return
        start = Position(int(state_dict["file_index"]), int(state_dict["byte_offset"]), int(state_dict["line_number"]))
        self._window_index = window_index - 1
        self._seek(start, int(state_dict["malformed_rows"]))
        if not self._read_window():
            raise ValueError("`state_dict` must point at a window of the data, but points past its end.")
        self._steps_taken = int(state_dict["steps_taken"])

    def file_name(self, file_index: int) -> str:
        return str(self._files[file_index].full_name)

    # Windows -----------------------------------------------------------------------------------

    def _start_epoch(self) -> None:
        # The committed position: where the current window starts, and what was taken from it.
        self._window_index = -1
        self._window_start = START
        self._malformed_at_window_start = 0
        self._window_steps: list[list[BatchT]] = []
        self._steps_taken = 0
        # Only the epoch's last window drops rows, so re-reading a window on resume recounts them.
        self._dropped_rows = 0
        # The reading position, ahead of the committed one.
        self._seek(START, malformed_rows=0)

    def _seek(self, position: Position, malformed_rows: int) -> None:
        self._chunks.close()  # Closes its open file now rather than at garbage collection.
        self._position = position
        self._malformed_rows = malformed_rows
        self._chunks = self._read_chunks(position)
        self._pending = None
        self._cursor = 0
        self._exhausted = False

    def _read_window(self) -> bool:
        """Reads, shuffles and batches the next window; False at the end of the epoch."""
        window_start, malformed_at_start = self._position, self._malformed_rows
        columns = self._collect_rows(self._rows_per_window)
        num_rows = len(columns[0])
        step_rows = self._layout.rows_per_global_step
        num_steps = self._layout.num_steps(num_rows)
        self._dropped_rows += self._layout.num_dropped_rows(num_rows)
        if num_steps == 0:
            return False
        self._window_index += 1
        if self._shuffle:
            order = window_permutation(num_rows, self._seed, self._epoch, self._window_index)
        else:
            order = np.arange(num_rows, dtype=np.int64)
        self._window_steps = []
        for step in range(num_steps):
            micro_batches = self._layout.rank_rows(order[step * step_rows : (step + 1) * step_rows])
            self._window_steps.append([self.make_batch(tuple(c[rows] for c in columns)) for rows in micro_batches])
        self._window_start, self._malformed_at_window_start = window_start, malformed_at_start
        self._steps_taken = 0
        return True

    def _collect_rows(self, num_rows: int) -> tuple[npt.NDArray[Any], ...]:
        """The columns of the next ``num_rows`` well-formed rows, or fewer at the end of the data.

        The window ends right after its last row, wherever the chunks happen to end, so that
        re-reading it from its start (on resume) finds the same rows.
        """
        parts: list[tuple[npt.NDArray[Any], ...]] = []
        collected = 0
        while collected < num_rows:
            if self._pending is None or self._cursor == len(self._pending[1].valid):
                next_chunk = next(self._chunks, None)
                if next_chunk is None:
                    break
                chunk_start, buffer = next_chunk
                self._pending = (chunk_start, self.parse(buffer, chunk_start.file_index, chunk_start.line_number))
                self._cursor = 0
            chunk_start, parsed = self._pending
            valid_so_far = np.cumsum(parsed.valid[self._cursor :])
            wanted = num_rows - collected
            if len(valid_so_far) and valid_so_far[-1] >= wanted:
                stop = self._cursor + int(np.searchsorted(valid_so_far, wanted)) + 1
            else:
                stop = len(parsed.valid)
            self._skip_malformed(chunk_start, parsed, self._cursor, stop)
            rows = self._cursor + np.flatnonzero(parsed.valid[self._cursor : stop])
            parts.append(tuple(column[rows] for column in parsed.columns))
            collected += len(rows)
            self._position = Position(
                chunk_start.file_index,
                chunk_start.byte_offset + int(parsed.line_ends[stop - 1]),
                chunk_start.line_number + stop,
            )
            self._cursor = stop
        if not parts:
            return self.empty_columns()
        return tuple(np.concatenate(arrays) for arrays in zip(*parts))

    def _skip_malformed(self, chunk_start: Position, parsed: ParsedLines, begin: int, end: int) -> None:
        for line in sorted(index for index in parsed.problems if begin <= index < end):
            path = self.file_name(chunk_start.file_index)
            line_number = chunk_start.line_number + line + 1
            problem = parsed.problems[line]
            self._malformed_rows += 1
            if self._malformed_rows > self._max_malformed_rows:
                raise DataError(
                    f"Line {line_number} of {path} is malformed: {problem}. It is malformed row "
                    f"{self._malformed_rows} of this epoch, over the limit `max_malformed_rows` "
                    f"({self._max_malformed_rows})."
                )
            logger.warning("Skipping line %d of %s, which is malformed: %s.", line_number, path, problem)

    def _read_chunks(self, start: Position) -> Generator[tuple[Position, bytes], None, None]:
        """Chunks of whole lines (a last line without newline gets one), from ``start`` on."""
        position = start
        for file_index in range(start.file_index, len(self._files)):
            if file_index != start.file_index:
                position = Position(file_index, 0, 0)
            with self._files[file_index] as file:
                if position.byte_offset:
                    file.seek(position.byte_offset)
                tail = b""
                while True:
                    block = file.read(self._read_chunk_bytes)
                    if not block:
                        if tail:
                            yield position, tail + b"\n"
                        break
                    block = tail + block
                    cut = block.rfind(b"\n") + 1
                    chunk, tail = block[:cut], block[cut:]
                    if len(tail) > MAX_LINE_BYTES:
                        line_number = position.line_number + chunk.count(b"\n") + 1
                        raise DataError(
                            f"Line {line_number} of {self.file_name(file_index)} must be at most "
                            f"{MAX_LINE_BYTES} bytes long, but is longer instead."
                        )
                    if chunk:
                        yield position, chunk
                        position = Position(
                            file_index,
                            position.byte_offset + len(chunk),
                            position.line_number + chunk.count(b"\n"),
                        )


def open_files(paths: str | Sequence[str]) -> list[Any]:
    """The fsspec files of ``paths`` (globs expanded, in order), checked to exist."""
    files = fsspec.open_files([paths] if isinstance(paths, str) else list(paths), mode="rb", compression="infer")
    if not files:
        raise DataError(f"`paths` must name at least one file, but {paths!r} matches none instead.")
    for file in files:
        if not file.fs.isfile(file.path):
            raise DataError(f"`paths` must name existing files, but {file.full_name} does not exist.")
    return list(files)
