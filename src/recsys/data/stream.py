"""Streaming readers: bounded windows of rows, shuffled, sharded, resumable, whatever the file format.

A ``StreamingReader`` subclass says where its chunks of records come from (``read_chunks``: parsed
chunks from a position on) and how to make a batch of rows (``make_batch``); this module does the
rest. ``StreamingLineReader`` is the one for files of lines (any fsspec path, gzip by extension):
it reads them in chunks of whole lines and asks its subclass to ``parse`` a chunk at once. A
columnar format reads its own chunks (``recsys.tabular.formats.parquet``: record batches, a position
being a row). The reader never holds more than one *window* of rows plus one chunk: it collects
well-formed rows from the chunks until the window is full.

Why windows: a window is the shuffle buffer, shuffled with a generator seeded by
``(seed, epoch, window_index)``, and its start (file, offset, record number) is all a
resume needs. ``state_dict()`` records where the current window starts and how many steps were
taken from it; ``load_state_dict()`` re-reads that window, which yields the same rows in the same
order, and skips the steps already taken. No buffer content is ever saved.

- Every rank reads and parses every record, so that all ranks agree, without communicating, on
  which rows are well-formed and on where the epoch ends; it keeps only its own rows.
- Rows are dealt to ranks as ``recsys.data.step_layout`` says; with ``drop_last`` a trailing
  partial step is dropped and counted in the log, without it served as a last, smaller step
  (only the epoch's last window can have one).
- A malformed record is logged with its file and line (or row) number and skipped; one more than
  ``max_malformed_rows`` in an epoch raises a ``DataError`` naming them.
"""

from __future__ import annotations

import gzip
import logging
import zlib
from abc import ABC, abstractmethod
from collections.abc import Generator, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import fsspec
import numpy as np
import numpy.typing as npt

from recipes import DataError, DataReader
from recsys.data.parse_ahead import parsed_ahead
from recsys.data.step_layout import StepLayout, window_permutation

logger = logging.getLogger(__name__)

BatchT = TypeVar("BatchT")

MAX_LINE_BYTES = 1 << 20
_HEAD_BLOCK_BYTES = 1 << 16  # What the check of a file's first lines reads at a time.


@dataclass(frozen=True)
class ParsedLines:
    """The records of one chunk (lines, or a record batch's rows): per record, where it ends, whether
    it is a row, and its columns.

    ``columns`` hold one entry per record (their first dimension); the entries of records that are
    not ``valid`` mean nothing. ``problems`` say what is wrong with the invalid records; a record
    that is neither valid nor a problem (a header line, say) is skipped silently.
    """

    line_ends: npt.NDArray[np.int64]  # per record, the offset just past it from the chunk's (bytes; rows: 1, 2...)
    valid: npt.NDArray[np.bool_]
    columns: tuple[npt.NDArray[Any], ...]
    problems: dict[int, str]  # record index -> what is wrong with it


@dataclass(frozen=True)
class Position:
    """A record boundary in the stream: ``record_number`` records of file ``file_index`` lie before it,
    and reading resumes at ``offset`` (a byte offset in a file of lines; a row offset, the same as
    ``record_number``, in a Parquet file)."""

    file_index: int
    offset: int
    record_number: int


START = Position(0, 0, 0)


class StreamingReader(DataReader[BatchT], ABC, Generic[BatchT]):
    """Reads the records of files from any fsspec paths, in windows of rows, whatever the format.

    ``paths`` is one path, URL or glob, or a list of them, read in order. ``shuffle_buffer_size``
    rows (rounded up to whole global steps) are read, shuffled if ``shuffle``, and served before
    the next ones are read. With ``parse_threads`` above 1, a subclass parses the chunks after the
    one being batched meanwhile, on that many threads (``parsed_ahead``). ``paths_key`` is what
    messages about the files call ``paths``: the key the user named them with (``dataset.valid_path``).
    """

    record_name: ClassVar[str] = "line"
    """What a record is called in messages: ``Line 7 of day_0.tsv is malformed: ...``."""

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
        drop_last: bool = True,
        parse_threads: int = 1,
        paths_key: str = "paths",
    ) -> None:
        self._layout = StepLayout(batch_size, num_accumulate, dp_rank, dp_size, drop_last)
        require_at_least("shuffle_buffer_size", shuffle_buffer_size, 1)
        require_at_least("max_malformed_rows", max_malformed_rows, 0)
        require_at_least("parse_threads", parse_threads, 1)
        self.parse_threads = parse_threads
        self._files = open_files(paths, paths_key)
        step_rows = self._layout.rows_per_global_step
        self._rows_per_window = -(-shuffle_buffer_size // step_rows) * step_rows
        self._shuffle = shuffle
        self._seed = seed
        self._max_malformed_rows = max_malformed_rows

        self._epoch = 0
        self._chunks = self.read_chunks(START)  # Lazy: opens nothing before the first read.
        self._start_epoch()

    # What a format says -----------------------------------------------------------------------

    @abstractmethod
    def read_chunks(self, start: Position) -> Generator[tuple[Position, ParsedLines], None, None]:
        """The chunks of records from ``start`` (the epoch's start, or a position this reader gave) to the end
        of the last file, parsed, each with the position of its first record. A generator, so that it opens
        nothing before the first chunk is asked for, and closing it closes its file."""

    @abstractmethod
    def make_batch(self, columns: tuple[npt.NDArray[Any], ...]) -> BatchT:
        """A batch of the rows whose columns are given (any number of rows, zero included)."""

    @abstractmethod
    def empty_columns(self) -> tuple[npt.NDArray[Any], ...]:
        """Columns of zero rows, with the shapes and dtypes of the chunks' columns."""

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
            "offset": self._window_start.offset,
            "record_number": self._window_start.record_number,
            "malformed_rows": self._malformed_at_window_start,
            "steps_taken": self._steps_taken,
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._epoch = int(state_dict["epoch"])
        self._start_epoch()
        window_index = int(state_dict["window_index"])
        if window_index < 0:
            return
        # Checkpoints of line readers written before Parquet named the offset and record number after lines.
        offset = state_dict["offset"] if "offset" in state_dict else state_dict["byte_offset"]
        record_number = state_dict["record_number"] if "record_number" in state_dict else state_dict["line_number"]
        start = Position(int(state_dict["file_index"]), int(offset), int(record_number))
        self._window_index = window_index - 1
        self._seek(start, int(state_dict["malformed_rows"]))
        if not self._read_window():
            raise ValueError("`state_dict` must point at a window of the data, but points past its end.")
        self._steps_taken = int(state_dict["steps_taken"])

    def file_name(self, file_index: int) -> str:
        return str(self._files[file_index].full_name)

    def describe(self) -> str:
        names = [self.file_name(index) for index in range(len(self._files))]
        files = ", ".join(names) if len(names) <= 3 else f"{', '.join(names[:3])} and {len(names) - 3} more files"
        return (
            f"{files}: {self._rows_read} well-formed {self.record_name}s read this epoch, {self._malformed_rows} "
            f"malformed ones skipped; {self._layout.describe_step()}"
        )

    def check_first_rows(self, num_records: int = 100) -> None:
        """Parse the first records of every file now, so that a wrong format, delimiter or column stops
        the run before training time is spent: the check fails when more records than
        ``max_malformed_rows`` are bad, or when none is good."""
        for file_index in range(len(self._files)):
            parsed = self.first_records(file_index, num_records)
            if parsed is None:
                continue  # An empty file.
            head = min(num_records, len(parsed.valid))
            problems = sorted((record, problem) for record, problem in parsed.problems.items() if record < head)
            if problems and (len(problems) > self._max_malformed_rows or not parsed.valid[:head].any()):
                # The first record over the limit, or (when none is good) the first record.
                record, problem = problems[self._max_malformed_rows if len(problems) > self._max_malformed_rows else 0]
                raise DataError(
                    f"{self.record_name.capitalize()} {record + 1} of {self.file_name(file_index)} does not fit the "
                    f"schema: {problem} (found checking the first {num_records} {self.record_name}s; "
                    f"`dataset.max_malformed_rows` is {self._max_malformed_rows})."
                )

    def first_records(self, file_index: int, num_records: int) -> ParsedLines | None:
        """At least the first ``num_records`` records of file ``file_index`` parsed (fewer in a shorter file), or
        ``None`` for an empty file: its first chunk, which a format may cut shorter."""
        chunks = self.read_chunks(Position(file_index, 0, 0))
        try:
            first = next(chunks, None)
        finally:
            chunks.close()
        return None if first is None or first[0].file_index != file_index else first[1]

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
        self._rows_read = 0
        # The reading position, ahead of the committed one.
        self._seek(START, malformed_rows=0)

    def _seek(self, position: Position, malformed_rows: int) -> None:
        self._chunks.close()  # Closes its open file now rather than at garbage collection.
        self._position = position
        self._malformed_rows = malformed_rows
        self._chunks = self.read_chunks(position)
        self._pending = None
        self._cursor = 0
        self._exhausted = False

    def _read_window(self) -> bool:
        """Reads, shuffles and batches the next window; False at the end of the epoch."""
        window_start, malformed_at_start = self._position, self._malformed_rows
        columns = self._collect_rows(self._rows_per_window)
        num_rows = len(columns[0])
        self._rows_read += num_rows
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
            self._window_steps.append([self.make_batch(self._rows_of(columns, rows)) for rows in micro_batches])
        self._window_start, self._malformed_at_window_start = window_start, malformed_at_start
        self._steps_taken = 0
        return True

    def _rows_of(
        self, columns: tuple[npt.NDArray[Any], ...], rows: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[Any], ...]:
        """The given rows of the window's columns: in file order, a rank's rows are every ``dp_size``-th, so
        slices (views) take them without copying."""
        if self._shuffle or not len(rows):
            return tuple(column[rows] for column in columns)
        every = slice(int(rows[0]), int(rows[-1]) + 1, self._layout.dp_size)
        return tuple(column[every] for column in columns)

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
                self._pending = next_chunk
                self._cursor = 0
            chunk_start, parsed = self._pending
            valid_so_far = np.cumsum(parsed.valid[self._cursor :])
            wanted = num_rows - collected
            if len(valid_so_far) and valid_so_far[-1] >= wanted:
                stop = self._cursor + int(np.searchsorted(valid_so_far, wanted)) + 1
            else:
                stop = len(parsed.valid)
            self._skip_malformed(chunk_start, parsed, self._cursor, stop)
            if stop - self._cursor == valid_so_far[stop - self._cursor - 1]:  # All valid: a view, not a copy.
                rows: slice | npt.NDArray[np.int64] = slice(self._cursor, stop)
                collected += stop - self._cursor
            else:
                rows = self._cursor + np.flatnonzero(parsed.valid[self._cursor : stop])
                collected += len(rows)
            parts.append(tuple(column[rows] for column in parsed.columns))
            self._position = Position(
                chunk_start.file_index,
                chunk_start.offset + int(parsed.line_ends[stop - 1]),
                chunk_start.record_number + stop,
            )
            self._cursor = stop
        if not parts:
            return self.empty_columns()
        if len(parts) == 1:
            return parts[0]
        return tuple(np.concatenate(arrays) for arrays in zip(*parts))

    def _skip_malformed(self, chunk_start: Position, parsed: ParsedLines, begin: int, end: int) -> None:
        for record in sorted(index for index in parsed.problems if begin <= index < end):
            path = self.file_name(chunk_start.file_index)
            record_number = chunk_start.record_number + record + 1
            problem = parsed.problems[record]
            self._malformed_rows += 1
            if self._malformed_rows > self._max_malformed_rows:
                raise DataError(
                    f"{self.record_name.capitalize()} {record_number} of {path} is malformed: {problem}. It is "
                    f"malformed row {self._malformed_rows} of this epoch, over the limit `max_malformed_rows` "
                    f"({self._max_malformed_rows})."
                )
            logger.warning(
                "Skipping %s %d of %s, which is malformed: %s.", self.record_name, record_number, path, problem
            )


class StreamingLineReader(StreamingReader[BatchT], ABC):
    """Reads files of lines (plain, or gzip by the ``.gz`` extension) in chunks of whole lines of about
    ``read_chunk_bytes``, which ``parse`` turns into rows; the other arguments are ``StreamingReader``'s.
    Chunks of 4 MiB read a Criteo-format file about 5% faster than chunks of 1 MiB with two parse threads
    (each chunk costs some Python of its own, which holds the GIL; docs/benchmarks.md, "Data readers")."""

    def __init__(self, paths: str | Sequence[str], *, read_chunk_bytes: int = 1 << 22, **kwargs: Any) -> None:
        require_at_least("read_chunk_bytes", read_chunk_bytes, 1)
        self._read_chunk_bytes = read_chunk_bytes
        super().__init__(paths, **kwargs)

    @abstractmethod
    def parse(self, buffer: bytes, file_index: int, at_file_start: bool) -> ParsedLines:
        """The lines of ``buffer`` (whole, newline-terminated lines of file ``file_index``, the first of
        which is the file's first line if ``at_file_start``); called on several threads at once with
        ``parse_threads`` above 1."""

    def read_chunks(self, start: Position) -> Generator[tuple[Position, ParsedLines], None, None]:
        """The chunks of ``line_chunks``, parsed (their lines counted by the parse, not a pass of their own)."""

        def parse(chunk: tuple[int, int, bytes]) -> tuple[int, int, ParsedLines]:
            file_index, offset, buffer = chunk
            return file_index, offset, self.parse(buffer, file_index, offset == 0)

        record_number = start.record_number
        with (
            closing(self._byte_chunks(start)) as chunks,
            closing(parsed_ahead(parse, chunks, self.parse_threads)) as parsed_chunks,
        ):
            for file_index, offset, parsed in parsed_chunks:
                record_number = record_number if offset or file_index == start.file_index else 0
                yield Position(file_index, offset, record_number), parsed
                record_number += len(parsed.line_ends)

    def first_records(self, file_index: int, num_records: int) -> ParsedLines | None:
        """Only the file's first lines are read and parsed: a chunk of ``read_chunk_bytes`` (4 MiB) parsed for
        the check of 100 lines cost a second at every start (and more with lines parsed ahead on threads)."""
        head, at_end = b"", False
        with self._files[file_index] as file, reading(self.file_name(file_index)):
            while head.count(b"\n") <= num_records and len(head) <= MAX_LINE_BYTES:
                block = file.read(_HEAD_BLOCK_BYTES)
                at_end = not block
                if at_end:
                    break
                head += block
        if at_end and head and not head.endswith(b"\n"):
            head += b"\n"  # The last line of the file, as the reader reads it.
        cut = head.rfind(b"\n") + 1
        if cut == 0 and head:
            raise _line_too_long(self.file_name(file_index), 0)
        return self.parse(head[:cut], file_index, True) if head else None

    def line_chunks(self, start: Position) -> Generator[tuple[Position, bytes], None, None]:
        """Chunks of whole lines (a last line without newline gets one) from ``start`` on, each with the
        position of its first line; unparsed, for a pass over the data of its own (counting values, say)."""
        record_number = start.record_number
        with closing(self._byte_chunks(start)) as chunks:
            for file_index, offset, buffer in chunks:
                record_number = record_number if offset or file_index == start.file_index else 0
                yield Position(file_index, offset, record_number), buffer
                record_number += buffer.count(b"\n")

    def _byte_chunks(self, start: Position) -> Generator[tuple[int, int, bytes], None, None]:
        """``(file index, byte offset, chunk of whole lines)`` from ``start`` on."""
        for file_index in range(start.file_index, len(self._files)):
            offset = start.offset if file_index == start.file_index else 0
            with self._files[file_index] as file:
                if offset:
                    file.seek(offset)
                tail = b""
                while True:
                    block = self._read(file, file_index)
                    if not block:
                        if tail:
                            yield file_index, offset, tail + b"\n"
                        break
                    block = tail + block
                    cut = block.rfind(b"\n") + 1
                    chunk, tail = block[:cut], block[cut:]
                    if len(tail) > MAX_LINE_BYTES:
                        raise _line_too_long(self.file_name(file_index), offset + cut)
                    if chunk:
                        yield file_index, offset, chunk
                        offset += len(chunk)

    def _read(self, file: Any, file_index: int) -> bytes:
        """The next block of the file."""
        with reading(self.file_name(file_index)):
            block: bytes = file.read(self._read_chunk_bytes)
        return block


def _line_too_long(file_name: str, byte: int) -> DataError:
    return DataError(
        f"The line at byte {byte} of {file_name} must be at most {MAX_LINE_BYTES} bytes long, but is longer instead."
    )


@contextmanager
def reading(file_name: str) -> Iterator[None]:
    """Reads of ``file_name`` inside: a compressed file cut short or corrupt is a user's bad data, named."""
    try:
        yield
    except (EOFError, gzip.BadGzipFile, zlib.error) as ex:
        raise DataError(
            f"{file_name} must be a whole, valid compressed file, but reading it failed: "
            f"{type(ex).__name__}: {ex or 'it ends too early'}."
        ) from None


def require_at_least(name: str, value: int, minimum: int) -> None:
    """A reader's size argument must be at least ``minimum``."""
    if value < minimum:
        raise ValueError(f"`{name}` must be at least {minimum}, but is {value} instead.")


def open_files(paths: str | Sequence[str], paths_key: str) -> list[Any]:
    """The fsspec files of ``paths`` (globs expanded, in order), checked to exist; ``paths_key`` names them in
    messages."""
    files = fsspec.open_files([paths] if isinstance(paths, str) else list(paths), mode="rb", compression="infer")
    if not files:
        raise DataError(f"`{paths_key}` must name at least one file, but {paths!r} matches none instead.")
    for file in files:
        if file.fs.isdir(file.path):
            raise DataError(
                f"`{paths_key}` must name files, but {file.full_name} is a directory (a glob names its files)."
            )
        if not file.fs.isfile(file.path):
            raise DataError(f"`{paths_key}` must name existing files, but {file.full_name} does not exist.")
    return list(files)
