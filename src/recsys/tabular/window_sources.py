"""The windows of a schema's training data (``dataset.windows``): by the time in the files' paths, or by the
value ranges of a time column of one table; and the reader that trains on them one after the other.

``by: path``: ``train_path`` is a glob (``logs/*/hour=*/*.parquet``); each file it matches (or each file in a
folder it matches) carries a time in its path (its last, if several), and the files of one time are a
window, named by it (``2026-11-27T14``). ``by: column``: the rows of ``train_path`` whose time column falls
in one ``every``-long range are a window (``2026-11-27``), so logs kept as one table are read in windows too:
each window's rows are written to a file of their own once, at the start, so that reading a window costs its own
rows, not the table's. Both read every format of the schema (``by: column``: CSV, TSV, Parquet), and rows a
``split`` leaves to validation stay out.
"""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import fsspec
import numpy as np

from recipes import ConfigError, DataError, DataReader
from recsys.click.batch import CTRBatch
from recsys.data.window_sequence import Window, WindowSequence
from recsys.tabular.added_columns import times_out_of_range
from recsys.tabular.formats.data_format import DataFormat
from recsys.tabular.joins import side_numbers
from recsys.tabular.schema import TabularDataSection
from recsys.tabular.text_layout import UnreadableText, read_text_table

TIME_FORMS = "YYYY-MM-DD, YYYY-MM-DD-HH (or THH), YYYYMMDD, YYYYMMDDHH, and an hour as hour=HH"
"""The forms of time recognised in a path, for messages."""

_DASHED = re.compile(r"(?<!\d)(\d{4})-(\d{2})-(\d{2})(?:[T_-](\d{2}))?(?!\d)")
_COMPACT = re.compile(r"(?<!\d)(\d{4})(\d{2})(\d{2})(\d{2})?(?!\d)")
_HOUR = re.compile(r"(?<![A-Za-z])hour=(\d{1,2})(?!\d)")
_WILDCARDS = re.compile(r"[*?\[]")
_EVERY = re.compile(r"^(\d+)([dhms])$")
_UNIT_S = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def time_in(text: str) -> tuple[datetime, bool] | None:
    """The last date (and hour) of ``text`` in one of ``TIME_FORMS`` (UTC), and whether it had an hour: the last,
    as a folder of a date above the windows' (``/data/2026-01-01/logs/2026-11-27/...``) is not their time."""
    matches = [*_DASHED.finditer(text), *_COMPACT.finditer(text)]
    for match in sorted(matches, key=lambda found: found.start(), reverse=True):
        year, month, day, hour = match.groups()
        try:
            found = datetime(int(year), int(month), int(day), int(hour or 0), tzinfo=timezone.utc)
        except ValueError:
            continue  # Digits that are no date.
        hour_part = _HOUR.search(text, match.end())
        if hour is None and hour_part is not None and int(hour_part.group(1)) < 24:
            return found.replace(hour=int(hour_part.group(1))), True
        return found, hour is not None
    return None


def window_name(start: datetime, with_hour: bool) -> str:
    return start.strftime("%Y-%m-%dT%H" if with_hour else "%Y-%m-%d")


@dataclass
class PathWindowsScan:
    """The windows of files there at one look: ``done`` (complete), ``waiting`` (a done-file missing)."""

    done: list[Window]
    waiting: list[Window]


class PathWindows:
    """The windows of the files that ``pattern`` matches, by the time in their paths; with ``done_file``, only
    those whose every folder holds it are complete, the others wait for it."""

    def __init__(self, pattern: str, done_file: str | None) -> None:
        if not _WILDCARDS.search(pattern) and time_in(pattern) is None:
            raise ConfigError(
                f"`dataset.train_path` must be a pattern with a time in it ({TIME_FORMS}; or a wildcard where it "
                f"is) to be read in windows, but is '{pattern}' instead."
            )
        self._pattern = pattern
        self._done_file = done_file
        self._fs, self._path = fsspec.core.url_to_fs(pattern)

    def windows(self) -> list[Window]:
        return self.scan().done

    def windows_not_done(self) -> str:
        waiting = self.scan().waiting
        if not waiting:
            return ""
        names = ", ".join(window.name for window in waiting)
        if len(waiting) == 1:
            return f"1 window waits for its {self._done_file} file: {names}"
        return f"{len(waiting)} windows wait for their {self._done_file} file: {names}"

    def scan(self) -> PathWindowsScan:
        """The windows there now, in time order: the complete ones, and those whose done-file is missing."""
        self._fs.invalidate_cache()
        by_time: dict[datetime, tuple[bool, list[str]]] = {}
        for path in sorted(self._fs.glob(self._path)):
            found = time_in(path)
            if found is None:
                raise DataError(
                    f"Every file that `dataset.train_path` matches must have a time in its path ({TIME_FORMS}) to "
                    f"be read in windows, but {path} has none."
                )
            start, with_hour = found
            files = [p for p in self._fs.find(path)] if self._fs.isdir(path) else [path]
            data = [p for p in files if not posixpath.basename(p).startswith(("_", "."))]
            by_time.setdefault(start, (with_hour, []))[1].extend(data)
        scan = PathWindowsScan([], [])
        for start, (with_hour, paths) in sorted(by_time.items()):
            if not paths:
                continue
            full = tuple(self._fs.unstrip_protocol(path) for path in sorted(set(paths)))
            window = Window(window_name(start, with_hour), start.timestamp(), full)
            (scan.done if self._done(paths) else scan.waiting).append(window)
        return scan

    def _done(self, paths: Sequence[str]) -> bool:
        if self._done_file is None:
            return True
        folders = {posixpath.dirname(path) for path in paths}
        return all(self._fs.exists(f"{folder}/{self._done_file}") for folder in folders)

    def describe(self) -> str:
        done = "" if self._done_file is None else f" with a {self._done_file} file"
        return f"files matching {self._pattern}{done}"

    def check_any_done(self) -> None:
        """At start-up, without ``follow``: that a window is there to train, or a ``ConfigError`` saying what
        the pattern matches."""
        scan = self.scan()
        if scan.done:
            return
        if not scan.waiting:
            raise ConfigError(
                f"`dataset.train_path` must match the files of at least one window, but '{self._pattern}' matches "
                "none (set `dataset.follow: true` to wait for them)."
            )
        files = sum(len(window.paths) for window in scan.waiting)
        first, last = scan.waiting[0].name, scan.waiting[-1].name
        times = first if first == last else f"{first} to {last}"
        raise ConfigError(
            f"`dataset.train_path` must match the files of at least one window with its {self._done_file} file "
            f"(`dataset.windows.done_file`), but '{self._pattern}' matches {files} files of {len(scan.waiting)} "
            f"windows ({times}), none with it (set `dataset.follow: true` to wait for them)."
        )


class ColumnWindows:
    """The windows of the rows of the tables ``paths`` by ranges of ``column``'s values (seconds since 1970),
    ``every_s`` long, from ``start`` on (the rows before it one window), written once, at the start, as one file
    per window in ``folder`` (the lines of a CSV/TSV file as they are, the rows of a Parquet file), so that a
    window is read at the cost of its own rows, not of the table's."""

    def __init__(self, paths: str, schema: TabularDataSection, column: str, every_s: int, folder: str) -> None:
        self._paths = paths
        self._windows: list[Window] = []
        tables = _read_tables(paths, schema, column)
        values = np.concatenate([table.values for table in tables]) if tables else np.zeros(0)
        bounds = schema.split.bounds("train") or (-math.inf, math.inf)
        keep = (values >= bounds[0]) & (values < bounds[1])
        if not keep.any():
            raise DataError(f"`dataset.train_path` ({paths}) must have training rows to read in windows, but has none.")
        start = schema.windows.start
        origin = 0.0 if start is None else start
        daily = every_s % 86400 == 0 and origin % 86400 == 0
        with np.errstate(invalid="ignore"):
            index = np.floor((values - origin) / every_s)
        index[~keep] = np.nan
        if start is not None:
            index[keep & (values < start)] = -1  # The history before ``start``.
        fs, root = fsspec.core.url_to_fs(folder)
        fs.makedirs(root, exist_ok=True)
        ends = np.cumsum([len(table.values) for table in tables])
        per_table = np.split(index, ends[:-1])
        for k in np.unique(index[~np.isnan(index)]).astype(np.int64):
            low = origin + int(k) * every_s
            name = f"before-{_time_name(origin, daily)}" if k < 0 else _time_name(low, daily)
            path = f"{root}/{name}.{schema.format.name}"
            _write_window(fs, path, tables, [table_index == k for table_index in per_table])
            first_time = float(values[index == k].min()) if k < 0 else low
            self._windows.append(Window(name, first_time, (fs.unstrip_protocol(path),)))

    def windows(self) -> list[Window]:
        return self._windows

    def windows_not_done(self) -> str:
        return ""  # Every window of a table is complete: the table is there.

    def describe(self) -> str:
        return f"windows of {self._paths}"


def _time_name(seconds: float, daily: bool) -> str:
    moment = datetime.fromtimestamp(seconds, tz=timezone.utc)
    if daily:
        return moment.strftime("%Y-%m-%d")
    return moment.strftime("%Y-%m-%dT%H" if moment.minute == moment.second == 0 else "%Y-%m-%dT%H:%M:%S")


def every_seconds(every: str) -> int:
    """``1d``, ``6h``, ``30m``, ``90s`` in seconds."""
    match = _EVERY.match(every.strip())
    if match is None or int(match.group(1)) == 0:
        raise ConfigError(
            f"`dataset.windows.every` must be a positive number and d, h, m or s (1d, 6h), but is '{every}' instead."
        )
    return int(match.group(1)) * _UNIT_S[match.group(2)]


def windowed_train_reader(
    schema: TabularDataSection,
    files: DataFormat,
    train_path: str,
    make_reader: Callable[[DataFormat, list[str], str, bool], DataReader[CTRBatch]],
    split_folder: str,
) -> WindowSequence[CTRBatch]:
    """The train reader of ``schema``'s windows. ``make_reader(format, paths, split, train)``: a reader of a
    window's files for training (``train``) or to score it; ``split_folder``: where windows by column are
    written, one file each (by every rank: each its own folder)."""
    windows = schema.windows
    if windows.by == "path":
        by_path = PathWindows(train_path, windows.done_file)
        if not schema.follow:
            by_path.check_any_done()
        source: PathWindows | ColumnWindows = by_path
    else:
        column = windows.column or schema.split.column
        if column is None or (schema.split.column not in (None, column)):
            raise ConfigError(
                f"`dataset.windows.column` must name the time column (that of `split.column`, if set), but is "
                f"'{windows.column}' with `split.column` '{schema.split.column}'."
            )
        source = ColumnWindows(train_path, schema, column, every_seconds(windows.every), split_folder)

    def reader_of(window: Window, train: bool) -> DataReader[CTRBatch]:
        return make_reader(files, list(window.paths), "train", train)

    return WindowSequence(
        source,
        lambda window: reader_of(window, True),
        lambda window: reader_of(window, False),
        follow=schema.follow,
        poll_interval_s=windows.poll_interval_s,
    )


@dataclass
class _Table:
    """One file of a table read in windows by column: its time column's values, and its rows: a Parquet table,
    or the lines of a CSV/TSV file (with its header line, if any)."""

    values: np.ndarray[Any, Any]
    rows: Any
    header: bytes = b""


def _write_window(fs: Any, path: str, tables: Sequence[_Table], masks: Sequence[np.ndarray[Any, Any]]) -> None:
    """The rows of ``tables`` that ``masks`` choose, as one file of their format."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with fs.open(path, "wb") as out:
        if isinstance(tables[0].rows, pa.Table):
            pq.write_table(pa.concat_tables([t.rows.filter(pa.array(m)) for t, m in zip(tables, masks)]), out)
            return
        lines = [table.rows[row] for table, mask in zip(tables, masks) for row in np.flatnonzero(mask)]
        out.write(tables[0].header + b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines))


def _read_tables(paths: str, schema: TabularDataSection, column: str) -> list[_Table]:
    """The files of ``paths`` (CSV, TSV or Parquet): their time column (read by pyarrow) and their rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recsys.tabular.formats.delimited_text import CsvConfig

    name = schema.format.name
    if name not in ("csv", "tsv", "parquet"):
        raise ConfigError(
            f"`dataset.windows.by: column` reads the time column of CSV, TSV or Parquet files, but the format is "
            f"'{name}' (use `by: path` with files per window)."
        )
    tables = []
    files = fsspec.open_files(paths, mode="rb", compression="infer")
    text = schema.format_options(CsvConfig) if name != "parquet" else None
    for file in files:
        with file as stream:
            data = stream.read()
        if name == "parquet":
            table = pq.read_table(pa.BufferReader(data))
            tables.append(_Table(table.column(column).to_numpy(zero_copy_only=False).astype(np.float64), table))
            continue
        assert text is not None
        try:
            read = read_text_table(data, text.layout, None if text.header else text.column_names, False, [column])
        except UnreadableText as error:
            raise DataError(f"{file.full_name} must be text as `dataset.format` says, but is not: {error}.") from None
        values = side_numbers(file.full_name, column, read.column(column), table="the file")
        lines = [line for line in data.splitlines(keepends=True) if line.strip()]
        header, lines = (lines[0], lines[1:]) if text.header and lines else (b"", lines)
        if len(lines) != len(values):
            raise DataError(
                f"{file.full_name} must have one row per line to be read in windows by column, but has "
                f"{len(lines)} lines and {len(values)} rows."
            )
        tables.append(_Table(values, lines, header if not header or header.endswith(b"\n") else header + b"\n"))
    for file, table in zip(files, tables):
        _check_times(
            file.full_name.removeprefix("file://"), column, table.values, None if text is None else int(text.header)
        )
    if not tables:
        raise DataError(f"`dataset.train_path` must name at least one file, but {paths!r} matches none.")
    return tables


def _check_times(file: str, column: str, values: np.ndarray[Any, Any], header_lines: int | None) -> None:
    """Refuse a time that no window can hold (outside years 1 to 9999, as ``TIME_RANGE_S`` says): 1e20 was cast
    to garbage and ended in a raw numpy error. ``header_lines``: a text file's lines before its rows, to name the
    line too; ``None`` for a Parquet file."""
    bad = np.flatnonzero(times_out_of_range(values))
    if len(bad):
        row = int(bad[0])
        line = "" if header_lines is None else f" (line {row + 1 + header_lines})"
        raise DataError(
            f"`dataset.windows.column` '{column}' must hold seconds since 1970 in years 1 to 9999 (UTC), but row "
            f"{row + 1} of {file}{line} holds {values[row]:g} instead."
        )
