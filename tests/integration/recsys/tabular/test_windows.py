"""Online training end to end (``dataset.windows``): windows of files trained in time order, each scored before
it is trained on; every N windows checkpointed; the window limit; a kill -9 inside a window resumed bit-exact;
a following run that picks up a window written while it waits and stops, saved, on SIGTERM; a window complete
after a later one trained when it is, and named while it waits for its done-file; and the misuse."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support.cli_runs import assert_one_line_error, run_main
from support.resume_helpers import (
    assert_bitwise_equal,
    assert_same_training,
    check_ok,
    committed_steps,
    final_states,
    load_verified,
    metric_history,
    read_metadata,
    run_recipes,
    stall_env,
    start_recipes,
    tensorboard_scalars,
    wait_and_kill_at_stall,
    wait_until,
)
from support.window_data import write_hour, write_preset, write_table

HOURS = ["2026-11-27T00", "2026-11-27T01", "2026-11-27T02"]
PATTERN = "logs/*/hour=*/*.csv"
# 100 rows a window, 32 a step and the last, smaller step trained too: 4 steps a window.
KEEP_ALL = ["checkpoint.keep_last_n=null", "checkpoint.keep_best_n=null"]
TABLES = {"fixed": [], "hash": ["model.embeddings.kind=hash"]}


def make_data(root: Path, fmt: str = "csv") -> Path:
    for hour in range(3):
        write_hour(root / "logs", hour, 100, fmt)
    write_table(root / "valid.csv", 1, 64)
    valid = "valid.csv" if fmt == "csv" else "logs/2026-11-27/hour=00/part-0.parquet"
    return write_preset(root / "online.yaml", f"logs/*/hour=*/*.{fmt}", valid, fmt)


def train(root: Path, output: str, *overrides: str, nproc: int = 1) -> list[str]:
    ranks = ["--nproc", str(nproc)] if nproc > 1 else []
    return ["train", str(root / "online.yaml"), "-o", str(root / output), *ranks, *overrides]


@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("tables", ["fixed", "hash"])
def test_windows_train_in_time_order_scored_first_checkpointed_every_n_windows(
    tmp_path: Path, nproc: int, tables: str
) -> None:
    make_data(tmp_path)
    windows = ["dataset.windows.by=path", "checkpoint.every_n_windows=2", *KEEP_ALL, *TABLES[tables]]
    check_ok(run_recipes(tmp_path, *train(tmp_path, "out", *windows, nproc=nproc)))

    rows = metric_history(tmp_path / "out")["window"]
    # Each window scored by the model before it trained on it, at the step its training starts from.
    assert [(row["step"], row["window"], row["window_index"]) for row in rows] == [
        (1, HOURS[0], 0.0),
        (5, HOURS[1], 1.0),
        (9, HOURS[2], 2.0),
    ]
    assert rows[0]["auc"] == 0.5  # The untrained model scores every row alike.
    assert all(row["auc"] > 0.7 for row in rows[1:])  # Then it knows which users click.
    assert [step for step, _ in tensorboard_scalars(tmp_path / "out", "window", "auc")] == [1, 5, 9]
    # Every 2 windows, and the last.
    assert committed_steps(tmp_path / "out") == [8, 12]
    assert load_verified(tmp_path / "out" / "checkpoints" / "step_8", "rank_0.pt")["data_reader"]["window"] == HOURS[1]


def test_max_num_windows_stops_and_parquet_windows_read_alike(tmp_path: Path) -> None:
    make_data(tmp_path, "parquet")
    check_ok(run_recipes(tmp_path, *train(tmp_path, "out", "dataset.windows.by=path", "trainer.max_num_windows=2")))
    assert [row["window"] for row in metric_history(tmp_path / "out")["window"]] == HOURS[:2]
    assert committed_steps(tmp_path / "out") == [8]


def test_windows_by_column_of_one_table_are_its_hours_in_time_order(tmp_path: Path) -> None:
    make_data(tmp_path)
    write_table(tmp_path / "table.csv", 3, 100)  # The rows of 3 hours, shuffled.
    by_column = ["dataset.train_path=table.csv", "dataset.windows.by=column", "dataset.windows.column=ts"]
    check_ok(run_recipes(tmp_path, *train(tmp_path, "out", *by_column, "dataset.windows.every=1h")))
    rows = metric_history(tmp_path / "out")["window"]
    assert [(row["step"], row["window"]) for row in rows] == [(1, HOURS[0]), (5, HOURS[1]), (9, HOURS[2])]


RESUME = ["dataset.windows.by=path", "checkpoint.every_n_steps=3", *KEEP_ALL]
FOLLOW = ["dataset.follow=true", "dataset.windows.done_file=_SUCCESS", "dataset.windows.poll_interval_s=0.2"]


@pytest.mark.parametrize(
    ("tables", "stall_step", "resumed_from"),
    [pytest.param("fixed", 8, 6, id="fixed-inside-a-window"), pytest.param("hash", 9, 8, id="hash-at-a-window-end")],
)
def test_a_kill_9_inside_a_window_resumes_bit_exact(
    tmp_path: Path, tables: str, stall_step: int, resumed_from: int
) -> None:
    make_data(tmp_path)
    overrides = [*RESUME, "checkpoint.every_n_windows=2", *TABLES[tables]]
    reference = tmp_path / "reference"
    check_ok(run_recipes(tmp_path, *train(tmp_path, "reference", *overrides)))
    assert committed_steps(reference) == [3, 6, 8, 9, 12]

    marker = tmp_path / "stalled"
    stalled = start_recipes(
        tmp_path, *train(tmp_path, "run", *overrides), env=stall_env("before_rename", stall_step, marker), stalling=True
    )
    wait_and_kill_at_stall(stalled, marker)
    assert max(committed_steps(tmp_path / "run")) == resumed_from
    position = load_verified(tmp_path / "run" / "checkpoints" / f"step_{resumed_from}", "rank_0.pt")["data_reader"]
    assert (position["window"], position["window_index"]) == (HOURS[1], 1)  # Steps 5 to 8: the second window.

    check_ok(run_recipes(tmp_path, *train(tmp_path, "run", *overrides)))
    assert_same_training(reference, tmp_path / "run", 12)
    assert tensorboard_scalars(reference, "window", "auc") == tensorboard_scalars(tmp_path / "run", "window", "auc")


def mark_done(root: Path, *hours: int) -> None:
    for hour in hours:
        (root / "logs" / "2026-11-27" / f"hour={hour:02d}" / "_SUCCESS").write_text("")


def waiting_after(output: Path, window: str) -> Callable[[], bool]:
    log = output / "logs" / "rank_0.log"
    return lambda: log.is_file() and f"Waiting for the next window after {window}" in log.read_text()


def stop_while_waiting(process: Any, output: Path, window: str) -> str:
    """SIGTERM once the run waits for the window after ``window``; its stderr, once it exited 0."""
    wait_until(waiting_after(output, window), process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr
    return str(stderr)


@pytest.mark.parametrize("tables", ["fixed", "hash"])
def test_on_2_ranks_a_kill_9_inside_a_window_resumes_bit_exact(tmp_path: Path, tables: str) -> None:
    """The run waits (following the data) after its second window, so the kill finds it there: its last
    checkpoint, of step 6, is inside that window."""
    make_data(tmp_path)
    mark_done(tmp_path, 0, 1, 2)
    overrides = [*RESUME, *FOLLOW, *TABLES[tables], "--nproc", "2"]
    reference = start_recipes(tmp_path, *train(tmp_path, "reference", *overrides))
    stop_while_waiting(reference, tmp_path / "reference", HOURS[2])

    (tmp_path / "logs" / "2026-11-27" / "hour=02" / "_SUCCESS").unlink()
    output = tmp_path / "run"
    killed = start_recipes(tmp_path, *train(tmp_path, "run", *overrides))
    wait_until(waiting_after(output, HOURS[1]), killed)
    ranks = subprocess.run(["pgrep", "-P", str(killed.pid)], capture_output=True, text=True).stdout.split()
    for pid in [*map(int, ranks), killed.pid]:
        os.kill(pid, signal.SIGKILL)
    killed.communicate(timeout=60)
    assert committed_steps(output) == [3, 6]
    assert load_verified(output / "checkpoints" / "step_6", "rank_1.pt")["data_reader"]["window"] == HOURS[1]

    mark_done(tmp_path, 2)
    stop_while_waiting(start_recipes(tmp_path, *train(tmp_path, "run", *overrides)), output, HOURS[2])
    assert committed_steps(output) == [3, 6, 9, 12]
    for reference_state, state in zip(final_states(tmp_path / "reference", 12), final_states(output, 12)):
        assert_bitwise_equal(reference_state, state)
    assert metric_history(tmp_path / "reference") == metric_history(output)
    for run, tag in (("train", "loss"), ("window", "auc")):
        assert tensorboard_scalars(tmp_path / "reference", run, tag) == tensorboard_scalars(output, run, tag)


def test_follow_picks_up_a_new_window_and_stops_saved_on_sigterm_while_waiting(tmp_path: Path) -> None:
    make_data(tmp_path)
    mark_done(tmp_path, 0, 1, 2)
    follow = ["dataset.windows.by=path", *FOLLOW]
    output = tmp_path / "out"
    process = start_recipes(tmp_path, *train(tmp_path, "out", *follow))
    wait_until(waiting_after(output, HOURS[2]), process)
    write_hour(tmp_path / "logs", 3, 100)  # Not there until its done-file is.
    mark_done(tmp_path, 3)
    stderr = stop_while_waiting(process, output, "2026-11-27T03")

    assert "Waiting for the next window after 2026-11-27T03: files matching " in stderr
    assert [row["window"] for row in metric_history(output)["window"]] == [*HOURS, "2026-11-27T03"]
    assert committed_steps(output) == [16]
    assert read_metadata(output / "checkpoints" / "step_16").resumable

    # Windows written while the run is down are taken in time order when it starts again.
    for hour in (5, 4):
        write_hour(tmp_path / "logs", hour, 100, done_file=True)
    stop_while_waiting(start_recipes(tmp_path, *train(tmp_path, "out", *follow)), output, "2026-11-27T05")
    windows = [row["window"] for row in metric_history(output)["window"]]
    assert windows == [*HOURS, "2026-11-27T03", "2026-11-27T04", "2026-11-27T05"]
    assert committed_steps(output)[-1] == 24


def test_a_window_done_after_a_later_one_is_trained_late_and_named_while_it_waits(tmp_path: Path) -> None:
    """The hours 0 and 2 have their done-file, hour 1 not yet: 0 and 2 are trained, and the lines at the start and
    at the end name hour 1; once its done-file is there, the same command trains it, saying it is late."""
    make_data(tmp_path)
    mark_done(tmp_path, 0, 2)
    overrides = ["dataset.windows.by=path", "dataset.windows.done_file=_SUCCESS", *KEEP_ALL]
    first = check_ok(run_recipes(tmp_path, *train(tmp_path, "out", *overrides)))
    waits = f"1 window waits for its _SUCCESS file: {HOURS[1]}"
    assert f"Data in windows: files matching {PATTERN} with a _SUCCESS file; {waits}\n" in first.stderr
    assert f"The data has no more windows to train after {HOURS[2]}: training ends; {waits}\n" in first.stderr
    assert [row["window"] for row in metric_history(tmp_path / "out")["window"]] == [HOURS[0], HOURS[2]]

    mark_done(tmp_path, 1)
    second = check_ok(run_recipes(tmp_path, *train(tmp_path, "out", *overrides)))
    assert f"Window {HOURS[1]} is trained late, after {HOURS[2]}, a later one" in second.stderr
    assert "waits for" not in second.stderr
    rows = metric_history(tmp_path / "out")["window"]
    assert [(row["step"], row["window"], row["window_index"]) for row in rows] == [
        (1, HOURS[0], 0.0),
        (5, HOURS[2], 1.0),
        (9, HOURS[1], 2.0),
    ]
    assert committed_steps(tmp_path / "out") == [8, 12]
    trained = load_verified(tmp_path / "out" / "checkpoints" / "step_12", "rank_0.pt")["data_reader"]["trained"]
    assert trained == [HOURS[0], HOURS[2], HOURS[1]]


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        pytest.param(
            ["dataset.train_path=flat/a.csv"],
            "error: `dataset.train_path` must be a pattern with a time in it (YYYY-MM-DD, YYYY-MM-DD-HH (or THH), "
            "YYYYMMDD, YYYYMMDDHH, and an hour as hour=HH; or a wildcard where it is) to be read in windows, but is ",
            id="no-time",
        ),
        pytest.param(
            ["dataset.train_path=flat/*.csv"],
            "error: Every file that `dataset.train_path` matches must have a time in its path (YYYY-MM-DD",
            id="a-file-without-time",
        ),
        pytest.param(
            ["dataset.train_path=none/*/hour=*/*.csv"],
            "error: `dataset.train_path` must match the files of at least one window, but ",
            id="matches-nothing",
        ),
        pytest.param(
            ["dataset.windows.done_file=_SUCCESS"],
            "error: `dataset.train_path` must match the files of at least one window with its _SUCCESS file "
            f"(`dataset.windows.done_file`), but '{PATTERN}' matches 4 files of 3 windows ({HOURS[0]} to {HOURS[2]}), "
            "none with it (set `dataset.follow: true` to wait for them).\n",
            id="none-done",
        ),
    ],
)
def test_a_misused_window_pattern_is_one_line_and_exit_2(
    tmp_path: Path,
    overrides: list[str],
    error: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    make_data(tmp_path)
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.csv").write_text("ts,user,item,click\n1,2,3,1\n")
    monkeypatch.chdir(tmp_path)

    misused = train(tmp_path, "out", *overrides, "dataset.windows.by=path")
    code, _, err = run_main(capsys, *misused)

    assert code == 2
    assert_one_line_error(err)
    assert err.startswith(error)
