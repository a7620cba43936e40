"""The output directory's lock, taken in this process: one training run at a time, the record of its holder, a
crashed holder's lock taken over, flock-less and remote directories locked by their record (GitHub issue 16).
``python -m recipes`` beside a running or killed run: tests/integration/recipes/test_run_lock.py."""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import socket
from pathlib import Path
from typing import Any

import fsspec
import pytest

from gang import FakeGang
from recipes.errors import UserError, WriteError
from recipes.runtime import run_lock
from recipes.runtime.run_lock import LOCK_FILE_NAME, Holder, OutputDirLockedError, RunLock


def dead_pid() -> int:
    """A pid that no process has, as that of a holder that has ended and been reaped: the highest free one below
    the kernel's limit (pids are handed out upwards, so no new process takes it while the test runs)."""
    limit = Path("/proc/sys/kernel/pid_max")
    for pid in range((int(limit.read_text()) if limit.exists() else 1 << 22) - 1, 1, -1):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    raise AssertionError("every pid is taken")


def write_record(path: Path, **fields: Any) -> Holder:
    holder = dataclasses.replace(Holder.this_process(), **fields)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(holder.to_json())
    return holder


# In this process --------------------------------------------------------------------------------


def test_the_lock_holds_a_record_of_its_holder_and_is_gone_once_released(tmp_path: Path) -> None:
    output_dir = tmp_path / "run"
    lock = RunLock(str(output_dir))
    lock.acquire()

    record = json.loads((output_dir / LOCK_FILE_NAME).read_text())
    assert (record["pid"], record["host"]) == (os.getpid(), socket.gethostname())
    assert lock.taken_over is None

    lock.release()
    lock.release()  # Twice is harmless.
    assert not (output_dir / LOCK_FILE_NAME).exists()
    with RunLock(str(output_dir)):
        pass


def test_a_second_lock_of_the_same_directory_is_refused_naming_the_holder(tmp_path: Path) -> None:
    with RunLock(str(tmp_path)) as first:
        with pytest.raises(OutputDirLockedError) as refused:
            RunLock(str(tmp_path)).acquire()
        holder = Holder.from_json((tmp_path / LOCK_FILE_NAME).read_text())
        assert first.taken_over is None and holder is not None

    message = str(refused.value)
    assert f"pid {os.getpid()} on host {socket.gethostname()}, since {holder.since}" in message
    assert "is in use by another training run" in message and "\n" not in message


def test_a_record_left_by_a_dead_holder_is_taken_over_with_one_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    crashed = write_record(tmp_path / LOCK_FILE_NAME, pid=dead_pid(), since="2024-01-02T03:04:05+00:00")
    lock = RunLock(str(tmp_path))
    lock.acquire()
    with caplog.at_level(logging.WARNING, logger=run_lock.__name__):
        lock.log_take_over()
    lock.release()

    assert lock.taken_over == crashed
    [line] = caplog.messages
    assert f"from pid {crashed.pid} on host {crashed.host}, since 2024-01-02T03:04:05+00:00" in line
    assert "no longer running" in line


def test_a_live_holder_is_told_from_a_dead_one_by_pid_start_time_and_boot() -> None:
    me = Holder.this_process()
    assert me.is_running() is True
    assert Holder(me.host, dead_pid(), me.since, None, me.boot_id).is_running() is False
    if me.start_time is not None:  # Linux: a pid reused by a later process is not the holder.
        assert Holder(me.host, me.pid, me.since, me.start_time + 1, me.boot_id).is_running() is False
    if me.boot_id is not None:
        assert Holder(me.host, me.pid, me.since, me.start_time, "another-boot").is_running() is False
    assert Holder("another-host", me.pid, me.since).is_running() is None


def test_where_flock_is_refused_the_record_is_the_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_flock(fd: int, operation: int) -> None:
        raise OSError(run_lock.errno.ENOLCK, "No locks available")

    monkeypatch.setattr(run_lock.fcntl, "flock", no_flock)
    with RunLock(str(tmp_path)), pytest.raises(OutputDirLockedError, match=f"pid {os.getpid()} "):
        RunLock(str(tmp_path)).acquire()
    assert not (tmp_path / LOCK_FILE_NAME).exists()

    crashed = write_record(tmp_path / LOCK_FILE_NAME, pid=dead_pid())
    with RunLock(str(tmp_path)) as lock:
        assert lock.taken_over == crashed


def test_a_remote_directory_is_locked_by_its_record() -> None:
    output_dir = "memory://locks/run"
    fs = fsspec.filesystem("memory")
    try:
        with RunLock(output_dir), pytest.raises(OutputDirLockedError, match=f"pid {os.getpid()} "):
            RunLock(output_dir).acquire()
        assert not fs.exists(f"/locks/run/{LOCK_FILE_NAME}")

        crashed = Holder(socket.gethostname(), dead_pid(), "then")
        fs.pipe_file(f"/locks/run/{LOCK_FILE_NAME}", crashed.to_json().encode())
        with RunLock(output_dir) as lock:
            assert lock.taken_over == crashed

        # A holder on another host cannot be checked from here: the message says what to delete.
        elsewhere = Holder("another-host", 4321, "then")
        fs.pipe_file(f"/locks/run/{LOCK_FILE_NAME}", elsewhere.to_json().encode())
        with pytest.raises(OutputDirLockedError, match=f"pid 4321 on host another-host.*delete {output_dir}/"):
            RunLock(output_dir).acquire()
    finally:
        fs.rm("/locks", recursive=True)


def test_an_output_dir_that_is_a_file_is_a_user_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")

    with pytest.raises(UserError, match="Cannot lock the output directory"):
        RunLock(str(tmp_path / "file")).acquire()


def full_disk(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_when_the_record_is_written_is_a_runtime_failure_leaving_no_lock_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a user's error (exit 2) that left an empty train.lock behind."""
    monkeypatch.setattr(run_lock.os, "pwrite", full_disk)

    with pytest.raises(WriteError, match=rf"Could not write {tmp_path}/{LOCK_FILE_NAME}: \[Errno 28\] No space left"):
        RunLock(str(tmp_path)).acquire()

    assert not (tmp_path / LOCK_FILE_NAME).exists()
    monkeypatch.undo()
    with RunLock(str(tmp_path)) as lock:  # Once the disk has room, the next run takes the lock as if none had tried.
        assert lock.taken_over is None


def test_a_full_disk_on_a_remote_directory_leaves_no_half_written_record(monkeypatch: pytest.MonkeyPatch) -> None:
    fs = fsspec.filesystem("memory")
    written = fs.pipe_file

    def half_written(path: str, value: bytes, **kwargs: Any) -> None:
        written(path, value[:10], **kwargs)
        full_disk()

    monkeypatch.setattr(fs, "pipe_file", half_written)
    try:
        with pytest.raises(WriteError, match=r"Could not write memory://locks/full/train.lock: \[Errno 28\]"):
            RunLock("memory://locks/full").acquire()
        assert not fs.exists(f"/locks/full/{LOCK_FILE_NAME}")
    finally:
        fs.rm("/locks", recursive=True)


def test_rank_0_locks_for_its_gang_and_its_failure_is_everyones(tmp_path: Path) -> None:
    lock = RunLock(str(tmp_path))
    lock.acquire_on_rank_0(FakeGang())
    try:
        with pytest.raises(OutputDirLockedError):
            RunLock(str(tmp_path)).acquire_on_rank_0(FakeGang())
    finally:
        lock.release()
