"""The windows of a schema's training data: times in paths, files grouped and ordered by them, done-files, and
windows by a time column written one file each."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recipes import ConfigError, DataError
from recsys.tabular.formats.arrow import ArrowFormatConfig
from recsys.tabular.schema import SplitByValue, TabularDataSection, WindowsSection
from recsys.tabular.window_sources import ColumnWindows, PathWindows, every_seconds, time_in


def local(path: str) -> str:
    """A local path of fsspec's ``file://`` URL."""
    return path.removeprefix("file://")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=timezone.utc)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("logs/2026-11-27/part-0.csv", (utc(2026, 11, 27), False)),
        ("logs/2026-11-27/hour=14/part-0.csv", (utc(2026, 11, 27, 14), True)),
        ("logs/dt=2026-11-27-09.csv", (utc(2026, 11, 27, 9), True)),
        ("logs/2026-11-27T09/x", (utc(2026, 11, 27, 9), True)),
        ("logs/20261127/x.parquet", (utc(2026, 11, 27), False)),
        ("logs/2026112723.gz", (utc(2026, 11, 27, 23), True)),
        ("logs/20261127/12345678/x", (utc(2026, 11, 27), False)),  # Digits that are no date are passed over.
        ("data/2020-01-01/logs/2026-11-27/hour=03/x", (utc(2026, 11, 27, 3), True)),  # The last date.
        ("logs/part-0.csv", None),
        ("logs/hour=14/x.csv", None),  # An hour needs a date.
    ],
)
def test_the_time_in_a_path(text: str, expected: tuple[datetime, bool] | None) -> None:
    assert time_in(text) == expected


def touch(path: Path, text: str = "x") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_files_of_one_time_are_a_window_in_time_order_done_files_and_underscores_aside(tmp_path: Path) -> None:
    for hour in (10, 9):
        for part in (1, 0):
            touch(tmp_path / "2026-11-27" / f"hour={hour:02d}" / f"part-{part}.csv")
    touch(tmp_path / "2026-11-27" / "hour=09" / "_SUCCESS")
    touch(tmp_path / "2026-11-27" / "hour=09" / ".part-2.csv.crc")

    windows = PathWindows(f"{tmp_path}/*/hour=*/*", None).windows()
    assert [(w.name, w.start) for w in windows] == [
        ("2026-11-27T09", utc(2026, 11, 27, 9).timestamp()),
        ("2026-11-27T10", utc(2026, 11, 27, 10).timestamp()),
    ]
    assert [Path(p).name for p in windows[0].paths] == ["part-0.csv", "part-1.csv"]

    done = PathWindows(f"{tmp_path}/*/hour=*/*.csv", "_SUCCESS")
    assert [w.name for w in done.windows()] == ["2026-11-27T09"]
    assert done.describe() == f"files matching {tmp_path}/*/hour=*/*.csv with a _SUCCESS file"
    assert done.windows_not_done() == "1 window waits for its _SUCCESS file: 2026-11-27T10"
    assert PathWindows(f"{tmp_path}/*/hour=*/*.csv", None).windows_not_done() == ""
    # A folder matched is a window of its files.
    assert [len(w.paths) for w in PathWindows(f"{tmp_path}/2026-*", None).windows()] == [4]


def test_a_pattern_or_a_file_without_time_is_an_error(tmp_path: Path) -> None:
    touch(tmp_path / "flat" / "a.csv")
    with pytest.raises(ConfigError, match=r"must be a pattern with a time in it \(YYYY-MM-DD, YYYY-MM-DD-HH"):
        PathWindows(f"{tmp_path}/flat/a.csv", None)
    with pytest.raises(DataError, match=r"Every file that `dataset.train_path` matches must have a time in its path"):
        PathWindows(f"{tmp_path}/flat/*.csv", None).windows()
    # The last time of a path is its window's: a dated folder above the windows' is not.
    touch(tmp_path / "2026-01-01" / "logs" / "2026-11-27" / "a.csv")
    touch(tmp_path / "2026-01-01" / "logs" / "2026-11-28" / "a.csv")
    windows = PathWindows(f"{tmp_path}/2026-01-01/logs/*/a.csv", None).windows()
    assert [w.name for w in windows] == ["2026-11-27", "2026-11-28"]
    # A path without wildcards is a window of its time.
    assert [w.name for w in PathWindows(f"{tmp_path}/2026-01-01/logs/2026-11-27/a.csv", None).windows()] == [
        "2026-11-27"
    ]


def test_windows_waiting_for_their_done_file_are_named_and_none_done_says_what_the_pattern_matches(
    tmp_path: Path,
) -> None:
    for day in (1, 2, 3):
        touch(tmp_path / f"2024-01-0{day}" / "part-0.csv")
    touch(tmp_path / "2024-01-03" / "part-1.csv")
    windows = PathWindows(f"{tmp_path}/*/*.csv", "_SUCCESS")
    with pytest.raises(ConfigError) as raised:
        windows.check_any_done()
    assert str(raised.value) == (
        "`dataset.train_path` must match the files of at least one window with its _SUCCESS file "
        f"(`dataset.windows.done_file`), but '{tmp_path}/*/*.csv' matches 4 files of 3 windows (2024-01-01 to "
        "2024-01-03), none with it (set `dataset.follow: true` to wait for them)."
    )

    for day in (1, 3):
        touch(tmp_path / f"2024-01-0{day}" / "_SUCCESS", "")
    windows.check_any_done()
    assert [window.name for window in windows.windows()] == ["2024-01-01", "2024-01-03"]
    assert windows.windows_not_done() == "1 window waits for its _SUCCESS file: 2024-01-02"
    (tmp_path / "2024-01-03" / "_SUCCESS").unlink()
    touch(tmp_path / "2024-01-05" / "part-0.csv")
    assert windows.windows_not_done() == "3 windows wait for their _SUCCESS file: 2024-01-02, 2024-01-03, 2024-01-05"

    with pytest.raises(ConfigError, match=r"must match the files of at least one window, but '.*' matches none \("):
        PathWindows(f"{tmp_path}/*/*.parquet", "_SUCCESS").check_any_done()


def test_every_is_a_number_and_a_unit() -> None:
    assert [every_seconds(every) for every in ("1d", "6h", "30m", "90s")] == [86400, 21600, 1800, 90]
    with pytest.raises(ConfigError, match=r"`dataset.windows.every` must be a positive number and d, h, m or s"):
        every_seconds("1w")


DAY = int(utc(2026, 11, 27).timestamp())


def schema(**windows: object) -> TabularDataSection:
    return TabularDataSection(
        split=SplitByValue(column="ts", valid_from=DAY + 3 * 86400),
        windows=WindowsSection(by="column", **windows),  # type: ignore[arg-type]
    )


def test_windows_by_column_are_written_one_file_each_the_validation_rows_left_out(tmp_path: Path) -> None:
    times = [DAY + 86400 + 5, DAY - 86400, DAY + 7, DAY + 3 * 86400, DAY + 86400 + 1]
    lines = [f"{ts},{k}\n" for k, ts in enumerate(times)]
    (tmp_path / "t.csv").write_text("ts,k\n" + "".join(lines))

    by_column = ColumnWindows(str(tmp_path / "t.csv"), schema(start=DAY), "ts", 86400, str(tmp_path / "w"))
    windows = by_column.windows()
    assert [w.name for w in windows] == ["before-2026-11-27", "2026-11-27", "2026-11-28"]
    assert by_column.windows_not_done() == ""  # The table is there: every window of it is complete.
    assert [w.start for w in windows] == [DAY - 86400, DAY, DAY + 86400]
    assert [Path(local(w.paths[0])).read_text() for w in windows] == [
        "ts,k\n" + lines[1],
        "ts,k\n" + lines[2],
        "ts,k\n" + lines[0] + lines[4],  # In file order; the validation row (k=3) in none.
    ]


def test_windows_by_column_of_parquet_files_by_the_hour(tmp_path: Path) -> None:
    pq.write_table(pa.table({"ts": [DAY + 3600, DAY + 10, DAY + 3700], "k": [0, 1, 2]}), tmp_path / "t.parquet")
    data = TabularDataSection(format=ArrowFormatConfig(name="parquet"), windows=WindowsSection(by="column"))

    windows = ColumnWindows(str(tmp_path / "t.parquet"), data, "ts", 3600, str(tmp_path / "w")).windows()
    assert [w.name for w in windows] == ["2026-11-27T00", "2026-11-27T01"]
    assert pq.read_table(local(windows[1].paths[0])).column("k").to_pylist() == [0, 2]


def test_follow_needs_windows_of_files() -> None:
    with pytest.raises(ValueError, match=r"`follow` waits for new windows of files, so `windows.by` must be `path`"):
        TabularDataSection(follow=True)


@pytest.mark.parametrize("form", ["csv", "parquet"])
def test_a_time_no_window_can_hold_is_refused_naming_the_file_and_row(tmp_path: Path, form: str) -> None:
    times = [DAY + 5, 1e20, DAY + 7]
    if form == "csv":
        (tmp_path / "t.csv").write_text("ts,k\n" + "".join(f"{ts},{k}\n" for k, ts in enumerate(times)))
        data = schema()
    else:
        pq.write_table(pa.table({"ts": times, "k": [0, 1, 2]}), tmp_path / "t.parquet")
        data = TabularDataSection(format=ArrowFormatConfig(name="parquet"), windows=WindowsSection(by="column"))

    with pytest.raises(DataError) as raised:
        ColumnWindows(str(tmp_path / f"t.{form}"), data, "ts", 86400, str(tmp_path / "w"))
    line = " (line 3)" if form == "csv" else ""
    assert str(raised.value) == (
        "`dataset.windows.column` 'ts' must hold seconds since 1970 in years 1 to 9999 (UTC), but row 2 of "
        f"{tmp_path}/t.{form}{line} holds 1e+20 instead."
    )
    assert not (tmp_path / "w").exists()
