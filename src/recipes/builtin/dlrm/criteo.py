"""A streaming reader of the raw Criteo click logs (Kaggle / Terabyte format).

Each line holds a label (0 or 1), 13 integer features and 26 categorical features written as
hexadecimal hashes, separated by tabs; any feature may be empty. The reader never holds more
than one bounded *window* of rows: it reads the files in chunks of bytes, parses a chunk's
lines at once with numpy, and collects well-formed rows until the window is full.

Why windows: a window is the shuffle buffer, shuffled with a generator seeded by
``(seed, epoch, window_index)``, and its start (file, byte offset, line number) is all a
resume needs. ``state_dict()`` records where the current window starts and how many steps were
taken from it; ``load_state_dict()`` re-reads that window, which yields the same rows in the same
order, and skips the steps already taken. No buffer content is ever saved.

Choices worth knowing:

- Integer features become ``log(max(x, 0) + 1)`` as in DLRM; an empty one becomes 0.
- A categorical hash ``h`` becomes the id ``h % num_embeddings`` of its table; an empty one
  becomes the id 0 (which it shares with the hashes that are multiples of the table size).
- Every rank reads and parses every line, so that all ranks agree, without communicating, on
  which rows are well-formed and on where the epoch ends; it keeps only its own rows. For very
  large DP gangs, split the files per rank beforehand instead.
- Rows are dealt to ranks as ``recipes.data.sharding`` says, a contract that whatever gathers
  per-row outputs relies on: over an epoch, the ``p``-th row of the epoch's order (the files'
  order without ``shuffle``) is rank ``p % dp_size``'s ``p // dp_size``-th.
- Rows that do not fill a whole global step at the end of an epoch are dropped and counted in
  the log (``drop_last=True``, for training), or served as a last, smaller step
  (``drop_last=False``, for validation, which must score every row); a rank that step does not
  reach reads batches of zero rows. Every window but the last is a whole number of steps, so
  only the last window has such a tail.
- A malformed line is logged and skipped; one more than ``max_malformed_rows`` in an epoch
  raises a ``DataError`` naming the file and the line.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import numpy.typing as npt

from recipes.click.batch import CTRBatch, make_ctr_batch
from recipes.data.reader import DataError, DataReader
from recipes.data.sharding import StepLayout, window_permutation

logger = logging.getLogger(__name__)

NUM_DENSE_FEATURES = 13
NUM_SPARSE_FEATURES = 26
SPARSE_FEATURE_NAMES = tuple(f"cat_{i}" for i in range(NUM_SPARSE_FEATURES))
_NUM_FIELDS = 1 + NUM_DENSE_FEATURES + NUM_SPARSE_FEATURES
_MAX_HEX_DIGITS = 8
_MAX_INT_CHARS = 18  # A longer integer would not fit in an int64.
_MAX_LINE_BYTES = 1 << 20

_HEX_VALUES = np.full(256, 255, dtype=np.uint8)
for _digit, _char in enumerate(b"0123456789abcdef"):
    _HEX_VALUES[_char] = _digit
    _HEX_VALUES[ord(chr(_char).upper())] = _digit


@dataclass(frozen=True)
class ParsedLines:
    """The lines of one chunk; the rows of the arrays where ``valid`` is False mean nothing."""

    line_ends: npt.NDArray[np.int64]  # byte offset just past each line's newline
    valid: npt.NDArray[np.bool_]
    labels: npt.NDArray[np.float32]
    dense: npt.NDArray[np.float32]
    sparse: npt.NDArray[np.int64]
    problems: dict[int, str]  # line index -> what is wrong with it


def parse_criteo_lines(buffer: bytes, table_sizes: npt.NDArray[np.int64]) -> ParsedLines:
    """Parses complete, newline-terminated lines at once (vectorised: no Python loop over rows)."""
    data = np.frombuffer(buffer, dtype=np.uint8)
    newlines = np.flatnonzero(data == ord("\n"))
    num_lines = len(newlines)
    line_starts = np.concatenate([[0], newlines[:-1] + 1]).astype(np.int64)

    tabs = np.flatnonzero(data == ord("\t"))
    tab_counts = np.bincount(np.searchsorted(newlines, tabs), minlength=num_lines)
    well_split = tab_counts == _NUM_FIELDS - 1
    rows = np.flatnonzero(well_split)
    field_tabs = tabs[np.repeat(well_split, tab_counts)].reshape(-1, _NUM_FIELDS - 1)
    # int32 offsets (a chunk is far below 2 GiB) halve the size of the per-character temporaries.
    starts = np.concatenate([line_starts[rows, None], field_tabs + 1], axis=1).astype(np.int32)
    ends = np.concatenate([field_tabs, newlines[rows, None]], axis=1).astype(np.int32)
    lengths = ends - starts

    label_chars = data[starts[:, 0]]
    label_ok = (lengths[:, 0] == 1) & ((label_chars == ord("0")) | (label_chars == ord("1")))
    dense_slice = slice(1, 1 + NUM_DENSE_FEATURES)
    dense, dense_ok = _parse_log_integers(data, starts[:, dense_slice], ends[:, dense_slice])
    sparse_slice = slice(1 + NUM_DENSE_FEATURES, _NUM_FIELDS)
    hashes, sparse_ok = _parse_hex(data, ends[:, sparse_slice], lengths[:, sparse_slice])
    ids = np.where(lengths[:, sparse_slice] == 0, 0, hashes % table_sizes)

    fields_ok = np.concatenate([label_ok[:, None], dense_ok, sparse_ok], axis=1)
    row_ok = fields_ok.all(axis=1)
    valid = np.zeros(num_lines, dtype=np.bool_)
    valid[rows[row_ok]] = True

    result_labels = np.zeros(num_lines, dtype=np.float32)
    result_labels[rows] = label_chars - ord("0")
    result_dense = np.zeros((num_lines, NUM_DENSE_FEATURES), dtype=np.float32)
    result_dense[rows] = dense
    result_sparse = np.zeros((num_lines, NUM_SPARSE_FEATURES), dtype=np.int64)
    result_sparse[rows] = ids
    problems = {
        int(line): f"it must have {_NUM_FIELDS} tab-separated fields, but has {tab_counts[line] + 1} instead"
        for line in np.flatnonzero(~well_split)
    }
    for row in np.flatnonzero(~row_ok):
        field = int(np.argmin(fields_ok[row]))
        text = bytes(data[starts[row, field] : ends[row, field]]).decode(errors="replace")
        problems[int(rows[row])] = _field_problem(field, text)
    return ParsedLines(newlines + 1, valid, result_labels, result_dense, result_sparse, problems)


def _parse_log_integers(
    data: npt.NDArray[np.uint8], starts: npt.NDArray[np.int32], ends: npt.NDArray[np.int32]
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
    """``log(max(x, 0) + 1)`` of decimal integer fields (empty: 0), and which fields were valid."""
    lengths = ends - starts
    width = int(min(max(lengths.max(initial=0), 1), _MAX_INT_CHARS))
    offsets = np.arange(width)
    positions = ends[..., None] - width + offsets
    inside = offsets >= (width - lengths)[..., None]
    chars = data[np.maximum(positions, 0)]
    digits = chars - np.uint8(ord("0"))
    is_digit = digits < 10
    is_sign = (chars == ord("-")) & (positions == starts[..., None]) & (lengths >= 2)[..., None]
    valid = np.all(~inside | is_digit | is_sign, axis=-1) & (lengths <= _MAX_INT_CHARS)
    negative = np.any(inside & is_sign, axis=-1)
    powers = 10.0 ** np.arange(width - 1, -1, -1)
    values = np.where(inside & is_digit, digits, 0).astype(np.float64) @ powers
    return np.where(negative, 0.0, np.log1p(values)).astype(np.float32), valid


def _parse_hex(
    data: npt.NDArray[np.uint8], ends: npt.NDArray[np.int32], lengths: npt.NDArray[np.int32]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """The values of hexadecimal fields of up to 8 digits (empty: 0), and which fields were valid."""
    offsets = np.arange(_MAX_HEX_DIGITS)
    inside = offsets >= (_MAX_HEX_DIGITS - lengths)[..., None]
    nibbles = _HEX_VALUES[data[np.maximum(ends[..., None] - _MAX_HEX_DIGITS + offsets, 0)]]
    valid = np.all(~inside | (nibbles < 16), axis=-1) & (lengths <= _MAX_HEX_DIGITS)
    shifts = 4 * (_MAX_HEX_DIGITS - 1 - offsets)
    values = (np.where(inside, nibbles, 0).astype(np.uint32) << shifts.astype(np.uint32)).sum(axis=-1, dtype=np.int64)
    return values, valid


def _field_problem(field: int, text: str) -> str:
    if field == 0:
        return f"the label must be 0 or 1, but is {text!r} instead"
    if field <= NUM_DENSE_FEATURES:
        return f"integer feature {field - 1} must be a decimal integer or empty, but is {text!r} instead"
    name = SPARSE_FEATURE_NAMES[field - 1 - NUM_DENSE_FEATURES]
    return f"`{name}` must be a hexadecimal hash of at most 8 digits or empty, but is {text!r} instead"


@dataclass(frozen=True)
class _Position:
    """A line boundary in the stream: ``line_number`` lines of file ``file_index`` lie before it."""

    file_index: int
    byte_offset: int
    line_number: int


_START = _Position(0, 0, 0)


class CriteoReader(DataReader[CTRBatch]):
    """Reads Criteo-format files (plain, or gzip by the ``.gz`` extension) from any fsspec path.

    ``paths`` is one path, URL or glob, or a list of them (e.g. one per day file), read in
    order. ``num_embeddings_per_feature`` sizes the 26 tables the hashes are folded into: one
    int for all, or one per feature. ``shuffle_buffer_size`` rows (rounded up to whole global
    steps) are read, shuffled if ``shuffle``, and served before the next ones are read.
    """

    def __init__(
        self,
        paths: str | Sequence[str],
        *,
        batch_size: int,
        num_embeddings_per_feature: int | Sequence[int],
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
        self._table_sizes = _table_sizes(num_embeddings_per_feature)
        for name, value, minimum in (
            ("shuffle_buffer_size", shuffle_buffer_size, 1),
            ("max_malformed_rows", max_malformed_rows, 0),
            ("read_chunk_bytes", read_chunk_bytes, 1),
        ):
            if value < minimum:
                raise ValueError(f"`{name}` must be at least {minimum}, but is {value} instead.")
        self._files = _open_files(paths)
        step_rows = self._layout.rows_per_global_step
        self._rows_per_window = -(-shuffle_buffer_size // step_rows) * step_rows
        self._shuffle = shuffle
        self._seed = seed
        self._max_malformed_rows = max_malformed_rows
        self._read_chunk_bytes = read_chunk_bytes

        self._epoch = 0
        self._chunks = self._read_chunks(_START)  # Lazy: opens nothing before the first read.
        self._start_epoch()

    def _start_epoch(self) -> None:
        # The committed position: where the current window starts, and what was taken from it.
        self._window_index = -1
        self._window_start = _START
        self._malformed_at_window_start = 0
        self._window_steps: list[list[CTRBatch]] = []
        self._steps_taken = 0
        # Only the epoch's last window drops rows, so re-reading a window on resume recounts them.
        self._dropped_rows = 0
        # The reading position, ahead of the committed one.
        self._seek(_START, malformed_rows=0)

    def _seek(self, position: _Position, malformed_rows: int) -> None:
        self._chunks.close()  # Closes its open file now rather than at garbage collection.
        self._position = position
        self._malformed_rows = malformed_rows
        self._chunks = self._read_chunks(position)
        self._pending: tuple[_Position, ParsedLines] | None = None
        self._cursor = 0
        self._exhausted = False

    def __next__(self) -> list[CTRBatch]:
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
        start = _Position(int(state_dict["file_index"]), int(state_dict["byte_offset"]), int(state_dict["line_number"]))
        self._window_index = window_index - 1
        self._seek(start, int(state_dict["malformed_rows"]))
        if not self._read_window():
            raise ValueError("`state_dict` must point at a window of the data, but points past its end.")
        self._steps_taken = int(state_dict["steps_taken"])

    def _read_window(self) -> bool:
        """Reads, shuffles and batches the next window; False at the end of the epoch."""
        window_start, malformed_at_start = self._position, self._malformed_rows
        labels, dense, sparse = self._collect_rows(self._rows_per_window)
        step_rows = self._layout.rows_per_global_step
        num_steps = self._layout.num_steps(len(labels))
        self._dropped_rows += self._layout.num_dropped_rows(len(labels))
        if num_steps == 0:
            return False
        self._window_index += 1
        if self._shuffle:
            order = window_permutation(len(labels), self._seed, self._epoch, self._window_index)
        else:
            order = np.arange(len(labels), dtype=np.int64)
        self._window_steps = []
        for step in range(num_steps):
            micro_batches = self._layout.rank_rows(order[step * step_rows : (step + 1) * step_rows])
            self._window_steps.append([_make_batch(labels[i], dense[i], sparse[i]) for i in micro_batches])
        self._window_start, self._malformed_at_window_start = window_start, malformed_at_start
        self._steps_taken = 0
        return True

    def _collect_rows(
        self, num_rows: int
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.int64]]:
        """The next ``num_rows`` well-formed rows, or fewer at the end of the data.

        The window ends right after its last row, wherever the chunks happen to end, so that
        re-reading it from its start (on resume) finds the same rows.
        """
        parts: list[tuple[Any, ...]] = []
        collected = 0
        while collected < num_rows:
            if self._pending is None or self._cursor == len(self._pending[1].valid):
                next_chunk = next(self._chunks, None)
                if next_chunk is None:
                    break
                chunk_start, buffer = next_chunk
                self._pending = (chunk_start, parse_criteo_lines(buffer, self._table_sizes))
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
            parts.append((parsed.labels[rows], parsed.dense[rows], parsed.sparse[rows]))
            collected += len(rows)
            self._position = _Position(
                chunk_start.file_index,
                chunk_start.byte_offset + int(parsed.line_ends[stop - 1]),
                chunk_start.line_number + stop,
            )
            self._cursor = stop
        if not parts:
            return (
                np.zeros(0, np.float32),
                np.zeros((0, NUM_DENSE_FEATURES), np.float32),
                np.zeros((0, NUM_SPARSE_FEATURES), np.int64),
            )
        return tuple(np.concatenate(arrays) for arrays in zip(*parts))  # type: ignore[return-value]

    def _skip_malformed(self, chunk_start: _Position, parsed: ParsedLines, begin: int, end: int) -> None:
        for line in sorted(index for index in parsed.problems if begin <= index < end):
            path = self._files[chunk_start.file_index].full_name
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

    def _read_chunks(self, start: _Position) -> Generator[tuple[_Position, bytes], None, None]:
        """Chunks of whole lines (a last line without newline gets one), from ``start`` on."""
        position = start
        for file_index in range(start.file_index, len(self._files)):
            if file_index != start.file_index:
                position = _Position(file_index, 0, 0)
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
                    if len(tail) > _MAX_LINE_BYTES:
                        line_number = position.line_number + chunk.count(b"\n") + 1
                        raise DataError(
                            f"Line {line_number} of "
                            f"{self._files[file_index].full_name} must be at most {_MAX_LINE_BYTES} "
                            f"bytes long, but is longer instead."
                        )
                    if chunk:
                        yield position, chunk
                        position = _Position(
                            file_index,
                            position.byte_offset + len(chunk),
                            position.line_number + chunk.count(b"\n"),
                        )


def _make_batch(
    labels: npt.NDArray[np.float32], dense: npt.NDArray[np.float32], sparse: npt.NDArray[np.int64]
) -> CTRBatch:
    batch_size = len(labels)
    offsets = np.arange(batch_size + 1, dtype=np.int64)
    features = {name: (sparse[:, i], offsets) for i, name in enumerate(SPARSE_FEATURE_NAMES)}
    return make_ctr_batch(dense, features, labels)


def _table_sizes(num_embeddings_per_feature: int | Sequence[int]) -> npt.NDArray[np.int64]:
    if isinstance(num_embeddings_per_feature, int):
        sizes = [num_embeddings_per_feature] * NUM_SPARSE_FEATURES
    else:
        sizes = list(num_embeddings_per_feature)
    if len(sizes) != NUM_SPARSE_FEATURES or min(sizes) < 1:
        raise ValueError(
            f"`num_embeddings_per_feature` must be a positive int or {NUM_SPARSE_FEATURES} positive ints, "
            f"but is {num_embeddings_per_feature} instead."
        )
    return np.asarray(sizes, dtype=np.int64)


def _open_files(paths: str | Sequence[str]) -> list[Any]:
    """The fsspec files of ``paths`` (globs expanded, in order), checked to exist."""
    files = fsspec.open_files([paths] if isinstance(paths, str) else list(paths), mode="rb", compression="infer")
    if not files:
        raise DataError(f"`paths` must name at least one file, but {paths!r} matches none instead.")
    for file in files:
        if not file.fs.isfile(file.path):
            raise DataError(f"`paths` must name existing files, but {file.full_name} does not exist.")
    return list(files)
