"""One training run per output directory: ``train`` holds ``OUTPUT_DIR/train.lock`` for its whole run.

Two runs writing one directory delete each other's checkpoints and interleave their metrics, so
``train`` takes the lock before it writes anything and keeps it until it exits. On a local file
system the lock is ``fcntl.flock`` on that file: the kernel drops it when the process ends in any
way, ``kill -9`` included, so a crash never leaves behind a lock that blocks the next run. The
file also holds a JSON record of its holder (host, pid, the process's start time, since when),
read for two things only: the message that names the holder to a second run, and the log line
that says a crashed run's lock was taken over (the lock was free, yet a record was left).

Where ``flock`` is not to be had (a remote fsspec directory such as ``s3://...``, or a file
system that refuses it) the record is the lock: a run takes it if there is none, or if the
holder it names ran on this host and is no longer running (its pid is gone, a zombie, or now a
process that started later, or the machine rebooted since). A holder on another host cannot be
checked from here, so its directory is refused with the path to delete once that run is over.
There, taking the lock is a read, a check and a write, not one atomic step: of two runs started
at the same instant both may pass, though the record read back after writing catches most.

Only ``train`` locks; ``eval``, ``predict`` and ``checkpoints`` read a running directory as it is.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import posixpath
import socket
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from checkpoint.store import FLOCK_UNSUPPORTED
from gang import Gang
from recipes.errors import UserError, WriteError

log = logging.getLogger(__name__)

LOCK_FILE_NAME = "train.lock"

# A holder writes its record just after it takes the lock; a second run that finds the lock
# taken waits this long for the record before it names the holder as unknown.
RECORD_WAIT_S = 1.0

# The failures to lock that come of the output directory the user named (not theirs to write, under a file, not
# there on a remote store): exit 2. Any other (a full disk, an I/O error) is a runtime failure: exit 1.
_USER_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST, errno.EISDIR, errno.ENOENT, errno.ELOOP}
)


class OutputDirLockedError(UserError):
    """Another training run holds the output directory: the CLI exits 2 naming it."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as its record says; enough to tell a live holder from a dead one on its host."""

    host: str
    pid: int
    since: str
    # Clock ticks from boot to the process's start (Linux ``/proc/PID/stat``), and the boot it was
    # in: a pid reused by a later process, or by a process after a reboot, is not the holder.
    start_time: int | None = None
    boot_id: str | None = None

    @classmethod
    def this_process(cls) -> Holder:
        pid = os.getpid()
        stat = _process_stat(pid)
        return cls(
            host=socket.gethostname(),
            pid=pid,
            since=datetime.now().astimezone().isoformat(timespec="seconds"),
            start_time=None if stat is None else stat[1],
            boot_id=_boot_id(),
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Holder | None:
        """The record, or ``None`` when it is empty or unreadable (half written, or not ours)."""
        try:
            data = json.loads(text)
            holder = cls(
                host=str(data["host"]),
                pid=int(data["pid"]),
                since=str(data["since"]),
                start_time=None if data.get("start_time") is None else int(data["start_time"]),
                boot_id=None if data.get("boot_id") is None else str(data["boot_id"]),
            )
        except (ValueError, TypeError, KeyError):
            return None
        return holder

    def is_running(self) -> bool | None:
        """Whether the holder still runs; ``None`` for a holder on another host, which cannot be checked."""
        if self.host != socket.gethostname():
            return None
        boot_id = _boot_id()
        if self.boot_id is not None and boot_id is not None and boot_id != self.boot_id:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # Another user's process: it exists.
        stat = _process_stat(self.pid)
        if stat is None:
            return True  # No /proc to look closer: the pid exists.
        state, start_time = stat
        if state in ("Z", "X"):
            return False  # Dead, waiting for its parent to reap it.
        return self.start_time is None or start_time == self.start_time

    def describe(self) -> str:
        return f"pid {self.pid} on host {self.host}, since {self.since}"


class RunLock:
    """The lock of one output directory; ``acquire`` raises ``OutputDirLockedError`` naming the holder.

    After ``acquire``, ``taken_over`` is the record of a holder that ended without releasing the
    lock (``kill -9``, a lost machine), for the caller to log once logging is set up.
    """

    def __init__(self, output_dir: str) -> None:
        self.output_dir = output_dir
        self.path = f"{output_dir.rstrip('/')}/{LOCK_FILE_NAME}"
        self.taken_over: Holder | None = None
        self._fs, self._fs_path = fsspec.core.url_to_fs(self.path)
        self._fd: int | None = None
        self._record: Holder | None = None

    def acquire(self) -> None:
        """Take the lock; a failure leaves no lock file behind, half written or empty, that a later run would read."""
        try:
            if not (isinstance(self._fs, LocalFileSystem) and self._acquire_flock()):
                self._acquire_record()
        except OSError as ex:
            if ex.errno in _USER_ERRNOS:
                raise UserError(f"Cannot lock the output directory {self.output_dir}: {ex}") from None
            raise WriteError(self.path, ex) from ex

    def acquire_on_rank_0(self, gang: Gang) -> None:
        """Rank 0 takes the lock, and every rank learns whether it did; the others hold nothing.

        It is one collective, made before any rank writes to the directory: were rank 0 to fail
        alone, the other ranks would start training, or wait for it in their next collective until
        the gang's timeout. When rank 0 fails, every rank raises, the others with rank 0's message.
        """
        error: Exception | None = None
        if gang.rank == 0:
            try:
                self.acquire()
            except Exception as ex:
                error = ex
        outcome = None if error is None else (isinstance(error, UserError), str(error))
        if gang.size > 1:
            outcome = gang.broadcast_object(outcome)
            if outcome is not None:
                gang.barrier()  # Every rank has its copy before any tears gloo down (rank 0 aborted otherwise).
        if error is not None:
            raise error
        if outcome is not None:
            user_error, message = outcome
            raise OutputDirLockedError(message) if user_error else RuntimeError(f"Rank 0 failed to lock: {message}")

    def release(self) -> None:
        """Give the lock back and remove its file; safe to call twice, or after ``acquire`` failed."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                # Removed while still locked: a run that opened the old file and locks it after
                # this sees that the path no longer names it, and starts over on a new file.
                if _names_file(self._fs_path, fd):
                    os.unlink(self._fs_path)
            except OSError:
                pass
            finally:
                os.close(fd)  # Closing drops the flock.
        elif self._record is not None:
            record, self._record = self._record, None
            with contextlib.suppress(OSError):
                if self._read_record() == record:
                    self._fs.rm(self._fs_path)

    def log_take_over(self) -> None:
        if self.taken_over is not None:
            log.warning(
                "Took over the lock of %s from %s, which is no longer running.",
                self.output_dir,
                self.taken_over.describe(),
            )

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # flock on a local file ------------------------------------------------------------------

    def _acquire_flock(self) -> bool:
        """Take the flock and write the record; ``False`` when the file system has no flock."""
        os.makedirs(os.path.dirname(self._fs_path) or ".", exist_ok=True)
        while True:
            fd = os.open(self._fs_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as ex:
                os.close(fd)
                if ex.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise self._locked_error(self._wait_for_record(), unverifiable=False) from None
                if ex.errno in FLOCK_UNSUPPORTED:
                    return False
                raise
            if _names_file(self._fs_path, fd):
                break
            os.close(fd)  # The holder removed this file as it released it: lock the path's new file.
        try:
            self.taken_over = Holder.from_json(os.pread(fd, 1 << 16, 0).decode(errors="replace"))
            record = Holder.this_process()
            data = record.to_json().encode()
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        except BaseException:
            self._fd = fd
            self.release()  # The file goes, as at the end of a run: no empty or half-written record stays.
            raise
        self._fd, self._record = fd, record
        return True

    def _wait_for_record(self) -> Holder | None:
        deadline = time.monotonic() + RECORD_WAIT_S
        while True:
            with contextlib.suppress(OSError):
                holder = self._read_record()
                if holder is not None:
                    return holder
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)

    # The record as the lock -----------------------------------------------------------------

    def _acquire_record(self) -> None:
        self._fs.makedirs(posixpath.dirname(self._fs_path), exist_ok=True)
        if self._fs.exists(self._fs_path):
            previous = self._read_record()
            running = None if previous is None else previous.is_running()
            if previous is not None and running is not False:
                raise self._locked_error(previous, unverifiable=running is None)
            self.taken_over = previous
        record = Holder.this_process()
        try:
            self._fs.pipe_file(self._fs_path, record.to_json().encode())
        except OSError:
            with contextlib.suppress(OSError):
                if self._read_record() is None:  # Empty or half written (a full disk): no record of anyone's.
                    self._fs.rm(self._fs_path)
            raise
        back = self._read_record()
        if back != record:
            raise self._locked_error(back, unverifiable=False)
        self._record = record

    def _read_record(self) -> Holder | None:
        data: Any = self._fs.cat_file(self._fs_path)
        return Holder.from_json(data.decode(errors="replace"))

    def _locked_error(self, holder: Holder | None, unverifiable: bool) -> OutputDirLockedError:
        who = "another training run" if holder is None else f"another training run ({holder.describe()})"
        message = f"{self.output_dir} is in use by {who}; wait for it to end, or train into another directory"
        if unverifiable:
            message += f" (if that run is over, delete {self.path})"
        return OutputDirLockedError(message + ".")


def _names_file(path: str, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _process_stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and start time (clock ticks after boot), from Linux's /proc."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            stat = file.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # The name in parentheses may hold spaces.
    return fields[0], int(fields[19])


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as file:
            return file.read().strip()
    except OSError:
        return None
