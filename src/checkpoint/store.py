"""The checkpoints root on any fsspec file system, and the moves that make a checkpoint appear whole.

Layout under the root::

    step_N/                  a committed checkpoint: metadata.json + the files it lists (on local
                             disk also reading.lock, which readers lock: see ``checkpoint.reading``)
    step_N.tmp-<save id>/    a save in progress (or one that died): never loaded
    step_N.old-<save id>/    a checkpoint being replaced by a new save of the same step
    step_N.damaged[-K]/      a damaged checkpoint moved aside, with why_damaged.txt: never
                             loaded, never deleted

A checkpoint is committed in one of two ways. On local disk the whole directory, metadata
included, is renamed from its temporary name, which POSIX makes atomic. Object stores and
``memory://`` have no atomic directory rename, so the data files are moved into ``step_N/``
first and ``metadata.json`` is written last: its presence is the commit.

A ``step_N/`` without valid metadata is either the manager's own unfinished work (a commit or
a removal cut short, which leaves the ``.unfinished`` marker in it first) or damage done to it
from outside. Only the former is deleted; damage is moved aside, since the files that are left
may be what a person needs to recover a run.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

import fsspec
from fsspec.implementations.local import LocalFileSystem

from checkpoint.errors import CheckpointError, CheckpointWriteError
from checkpoint.metadata import METADATA_FILE_NAME, CheckpointMetadata, FileRecord

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"step_(\d+)")
_UNFINISHED_DIR = re.compile(r"step_\d+\.(tmp|old)-[0-9a-f]+")
_REPLACED_DIR = re.compile(r"(step_\d+)\.old-[0-9a-f]+")
_DAMAGED_DIR = re.compile(r"step_(\d+)\.damaged(-\d+)?")

UNFINISHED_MARKER = ".unfinished"
"""Put into a ``step_N/`` before the manager fills it (without atomic rename) or empties it."""

DAMAGE_NOTE = "why_damaged.txt"

MAX_LISTINGS = 10
"""How many times ``scan`` lists a root that changes while it is checked before it takes the last listing."""

READ_LOCK_FILE_NAME = "reading.lock"
"""The empty file of a committed checkpoint on local disk that its readers lock (``checkpoint.reading``)."""

FLOCK_UNSUPPORTED = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})
"""``flock``'s answers that mean "not on this file system" rather than "taken": FUSE mounts (gcsfuse, s3fs),
Lustre mounted ``noflock``, NFS without its lock daemon."""

_ROOTS_WITHOUT_FLOCK: set[str] = set()
"""The roots whose file system refused ``flock``, said once per process rather than at every checkpoint."""


@dataclass(frozen=True)
class Leftover:
    """A directory under the root that is not a usable checkpoint, and why."""

    path: str
    reason: str


@dataclass(frozen=True)
class Scan:
    """What a listing of the root found.

    ``leftovers`` are the manager's own unfinished directories, safe to delete; ``damaged`` are
    ``step_N/`` directories that are not valid checkpoints, to move aside; ``set_aside`` are the
    paths of those moved aside earlier.
    """

    committed: Mapping[int, CheckpointMetadata]
    leftovers: Sequence[Leftover]
    damaged: Sequence[Leftover] = ()
    set_aside: Sequence[str] = ()


def basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


class CheckpointStore:
    """File-level access to a checkpoints root: naming, scanning, committing and removing directories."""

    def __init__(self, root: str) -> None:
        self.url = root
        self.fs, self.root = fsspec.core.url_to_fs(root)

    @property
    def has_atomic_rename(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    def step_dir(self, step: int) -> str:
        return f"{self.root}/step_{step}"

    def temp_dir(self, step: int, save_id: str) -> str:
        return f"{self.root}/step_{step}.tmp-{save_id}"

    def scan(self) -> Scan:
        """List the root, checking each checkpoint's metadata and the sizes of the files it lists.

        Sizes catch a truncated or missing file cheaply; the full checksum is verified on load. A run that saves
        into the root meanwhile (a reader of a running job lists it) may commit and prune between the listing and
        the checks, so that one listing saw the old checkpoint being deleted and the new one still under its
        temporary name, and no checkpoint at all: the root is listed again until it reads the same before and
        after the checks (``MAX_LISTINGS`` times at most).
        """
        if not self.fs.isdir(self.root):
            return Scan({}, [])
        names = self._directory_names()
        for _ in range(MAX_LISTINGS):
            scan = self._scan_listed(names)
            names, listed = self._directory_names(), names
            if names == listed:
                break
        return scan

    def _directory_names(self) -> list[str]:
        self.fs.invalidate_cache(self.root)
        try:
            entries = self.fs.ls(self.root, detail=True)
        except FileNotFoundError:
            return []
        return sorted(entry["name"].rstrip("/") for entry in entries if entry["type"] == "directory")

    def _scan_listed(self, paths: list[str]) -> Scan:
        committed: dict[int, CheckpointMetadata] = {}
        leftovers: list[Leftover] = []
        damaged: list[Leftover] = []
        set_aside: list[str] = []
        for path in paths:
            name = basename(path)
            if _UNFINISHED_DIR.fullmatch(name):
                leftovers.append(Leftover(path, "an unfinished save"))
            elif _DAMAGED_DIR.fullmatch(name):
                set_aside.append(path)
            elif match := _STEP_DIR.fullmatch(name):
                found = self._check_step_dir(path, int(match.group(1)))
                if isinstance(found, CheckpointMetadata):
                    committed[found.step] = found
                elif isinstance(found, Leftover):
                    leftovers.append(found)
                elif found is not None:
                    damaged.append(Leftover(path, found))
        return Scan(dict(sorted(committed.items())), leftovers, damaged, set_aside)

    def _check_step_dir(self, path: str, step: int) -> CheckpointMetadata | Leftover | str | None:
        """The metadata of the checkpoint at ``path``; a ``Leftover`` of the manager's own; why it is
        damaged; or None when it vanished while being listed (pruned by rank 0, seen from another rank)."""
        try:
            entries = self.fs.ls(path, detail=True)
            sizes = {basename(e["name"]): e["size"] for e in entries if e["type"] == "file"}
            if METADATA_FILE_NAME not in sizes:
                if UNFINISHED_MARKER in sizes:
                    return Leftover(path, "a save or removal cut short")
                return f"it has no {METADATA_FILE_NAME}"
            metadata = self.read_metadata(path)
        except FileNotFoundError:
            return None
        except CheckpointError as ex:
            return str(ex)
        if metadata.step != step:
            return f"its metadata is for step {metadata.step}"
        for file_name, record in metadata.files.items():
            if file_name not in sizes:
                return f"{file_name} is missing"
            if sizes[file_name] != record.size:
                return f"{file_name} is {sizes[file_name]} bytes instead of {record.size}"
        return metadata

    def read_metadata(self, step_dir: str) -> CheckpointMetadata:
        metadata_path = f"{step_dir}/{METADATA_FILE_NAME}"
        if not self.fs.exists(metadata_path):
            raise CheckpointError(f"`{step_dir}` must be a checkpoint directory, but has no {METADATA_FILE_NAME}.")
        text = self.fs.cat_file(metadata_path).decode("utf-8", errors="replace")
        return CheckpointMetadata.from_json(text, metadata_path)

    def lock(self, descriptor: int, operation: int) -> bool:
        """``flock(descriptor, operation)``; ``False`` where the file system has none, which is said once per root.

        :raises BlockingIOError: with ``LOCK_NB``, if another holds the lock.
        """
        try:
            fcntl.flock(descriptor, operation)
        except OSError as ex:
            if ex.errno not in FLOCK_UNSUPPORTED:
                raise
            if self.url not in _ROOTS_WITHOUT_FLOCK:
                _ROOTS_WITHOUT_FLOCK.add(self.url)
                log.warning(
                    "The file system of %s refuses flock (%s): its checkpoints are read without a read lease, so "
                    "a reader may see the running job delete or replace the checkpoint it reads, and choose again.",
                    self.url,
                    ex,
                )
            return False
        return True

    @contextlib.contextmanager
    def held_from_readers(self, step_dir: str, wait: bool) -> Iterator[bool]:
        """Whether this holds the committed checkpoint at ``step_dir`` against its readers (``checkpoint.reading``):
        while the block runs, none reads it or can start to. A reader holds it now: ``False``, or with ``wait``,
        ``True`` once the readers are done. Where the file system refuses ``flock`` no reader can hold it: ``True``.
        """
        descriptor = os.open(f"{step_dir}/{READ_LOCK_FILE_NAME}", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                self.lock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    yield False
                    return
                log.warning("Waiting for the readers of %s to finish before replacing it.", step_dir)
                self.lock(descriptor, fcntl.LOCK_EX)
            yield True
        finally:
            os.close(descriptor)

    def commit(self, temp_dir: str, metadata: CheckpointMetadata, save_id: str) -> None:
        """Make the checkpoint written to ``temp_dir`` visible as ``step_N/``, replacing any older one."""
        final_dir = self.step_dir(metadata.step)
        if self.has_atomic_rename:
            self.fs.pipe_file(f"{temp_dir}/{READ_LOCK_FILE_NAME}", b"")
            self.fs.pipe_file(f"{temp_dir}/{METADATA_FILE_NAME}", metadata.to_json().encode())
        if self.fs.exists(final_dir) and not self._is_checkpoint(final_dir):
            self._set_aside_foreign(final_dir)
        replacing = bool(self.fs.exists(final_dir))
        if replacing:
            log.warning("Replacing the existing checkpoint %s with a new save of the same step.", final_dir)
        if self.has_atomic_rename and replacing:
            self._replace(final_dir, temp_dir, f"{final_dir}.old-{save_id}")
        elif self.has_atomic_rename:
            os.rename(temp_dir, final_dir)
        else:
            if replacing:
                self.remove(final_dir)
            self.fs.makedirs(final_dir, exist_ok=True)
            self.fs.pipe_file(f"{final_dir}/{UNFINISHED_MARKER}", b"")
            for file_name in metadata.files:
                self.fs.mv(f"{temp_dir}/{file_name}", f"{final_dir}/{file_name}")
            self.fs.pipe_file(f"{final_dir}/{METADATA_FILE_NAME}", metadata.to_json().encode())
            self.fs.rm(f"{final_dir}/{UNFINISHED_MARKER}")
            self.fs.rm(temp_dir, recursive=True)

    def _replace(self, final_dir: str, temp_dir: str, replaced: str) -> None:
        """Rename the committed ``final_dir`` to ``replaced``, ``temp_dir`` to ``final_dir``, and delete ``replaced``,
        once no reader holds ``final_dir`` (``checkpoint.reading``) and while none can start to.

        This waits for readers to finish, unlike a prune, which leaves a checkpoint being read for later: the
        old checkpoint cannot stay under its name, and a same-step save is rare, at the end of a run (an online
        run's last save, or a stop right after a periodic checkpoint). Where the file system refuses ``flock``
        nothing holds a checkpoint, and it is replaced at once.
        """
        with self.held_from_readers(final_dir, wait=True):
            os.rename(final_dir, replaced)
            os.rename(temp_dir, final_dir)
            self.fs.rm(replaced, recursive=True)

    def _is_checkpoint(self, path: str) -> bool:
        """Whether ``path`` is a checkpoint directory as this manager writes them (it holds its metadata)."""
        return bool(self.fs.isdir(path)) and bool(self.fs.exists(f"{path}/{METADATA_FILE_NAME}"))

    def _set_aside_foreign(self, path: str) -> None:
        """Rename what someone else put where a checkpoint goes (a file, a folder without metadata) to
        ``step_N.not-a-checkpoint`` (``-2``, ... if taken): the framework never deletes what it did not write."""
        target, number = f"{path}.not-a-checkpoint", 1
        while self.fs.exists(target):
            number += 1
            target = f"{path}.not-a-checkpoint-{number}"
        self.fs.mv(path, target, recursive=True)
        log.warning("Moved %s, which is no checkpoint, aside to %s (kept, never deleted).", path, basename(target))

    def remove(self, step_dir: str) -> None:
        """Delete a checkpoint directory of the manager's own (see ``begin_removal``)."""
        self.begin_removal(step_dir)
        self.fs.rm(step_dir, recursive=True)

    def begin_removal(self, step_dir: str) -> None:
        """Mark ``step_dir`` as the manager's and take its metadata out, before deleting the rest.

        Without its metadata a half-deleted checkpoint is never loaded; with the marker, it is
        deleted at the next start rather than taken for a damaged checkpoint and kept forever.
        """
        with contextlib.suppress(OSError):  # On a full disk, go on: removing is how the space comes back.
            self.fs.pipe_file(f"{step_dir}/{UNFINISHED_MARKER}", b"")
        metadata_path = f"{step_dir}/{METADATA_FILE_NAME}"
        if self.fs.exists(metadata_path):
            self.fs.rm(metadata_path)

    def clean(self, leftovers: Sequence[Leftover], keep: Collection[str]) -> None:
        """Delete ``leftovers``, except the directories in ``keep`` (saves still in flight).

        A replaced checkpoint whose replacement never arrived (the commit died between its two
        renames) is the newest intact one of its step, so it is renamed back rather than deleted.
        """
        for leftover in leftovers:
            if leftover.path in keep:
                continue
            replaced = _REPLACED_DIR.fullmatch(basename(leftover.path))
            step_dir = f"{self.root}/{replaced.group(1)}" if replaced else ""
            if replaced and self.has_atomic_rename and not self.fs.exists(step_dir):
                log.warning("Restoring %s, whose replacement was never committed, as %s.", leftover.path, step_dir)
                os.rename(leftover.path, step_dir)
                continue
            log.warning("Removing %s under the checkpoints root: %s.", leftover.path, leftover.reason)
            self.fs.rm(leftover.path, recursive=True)

    def move_aside(self, step_dir: str, reason: str) -> str:
        """Rename a damaged checkpoint to ``step_N.damaged`` (``-2``, ``-3``, ... if taken), noting why inside.

        Never deleted: a damaged checkpoint may still hold the only copy of intact files (a model
        whose optimizer state was lost), and the framework must not delete what it cannot vouch
        for. Returns the new path.
        """
        target = f"{step_dir}.damaged"
        number = 1
        while self.fs.exists(target):
            number += 1
            target = f"{step_dir}.damaged-{number}"
        if self.has_atomic_rename:
            os.rename(step_dir, target)
        else:
            self.fs.mv(step_dir, target, recursive=True)
        log.warning(
            "Moved the damaged checkpoint %s aside to %s (kept, never deleted): %s", step_dir, basename(target), reason
        )
        try:
            self.fs.pipe_file(f"{target}/{DAMAGE_NOTE}", f"{reason}\n".encode())
        except OSError as ex:  # A full disk must not stop the fallback to an older checkpoint.
            log.warning("Could not write %s/%s: %s", target, DAMAGE_NOTE, ex)
        return target

    def damage_note(self, path: str) -> str:
        """Why the checkpoint moved aside to ``path`` was damaged, as noted when it was moved."""
        try:
            note: bytes = self.fs.cat_file(f"{path}/{DAMAGE_NOTE}")
        except OSError:
            return f"moved aside without a {DAMAGE_NOTE}"
        return note.decode("utf-8", errors="replace").strip()

    def free_space(self, path: str) -> str:
        """The free space of the file system holding ``path``, for an error message: 'unknown' off local disk."""
        if not self.has_atomic_rename:
            return "unknown"
        existing = os.path.abspath(path)
        while not os.path.exists(existing) and os.path.dirname(existing) != existing:
            existing = os.path.dirname(existing)
        try:
            free = shutil.disk_usage(existing).free
        except OSError:
            return "unknown"
        return _human_bytes(free)

    def write_error(self, step: int, path: str, error: OSError) -> CheckpointWriteError:
        """The one-line error of a failed write of ``path``, with the free space where it failed."""
        cause = str(error) if error.errno is None else f"[Errno {error.errno}] {error.strerror}"
        return CheckpointWriteError(
            f"Could not save the checkpoint of step {step}: writing {path} failed with {cause} "
            f"(free space there: {self.free_space(path)}). The earlier checkpoints are intact, "
            f"and no part of step {step} is visible."
        )

    def write_done_marker(self, temp_dir: str, rank: int, records: Mapping[str, FileRecord]) -> None:
        """Tell rank 0 that this rank's files of an asynchronous save are complete, and what they are."""
        document = {name: {"size": r.size, "sha256": r.sha256} for name, r in records.items()}
        self.fs.pipe_file(self._done_marker(temp_dir, rank), json.dumps(document).encode())

    def write_failure_marker(self, temp_dir: str, rank: int, message: str) -> None:
        """Tell rank 0 that this rank's part of an asynchronous save failed, so it stops waiting.

        Best effort: on a full disk even this small file may not be written, and rank 0 then
        waits until its timeout.
        """
        try:
            self.fs.pipe_file(self._failure_marker(temp_dir, rank), message.encode())
        except OSError as ex:
            log.warning("Could not tell rank 0 that rank %d's save failed: %s", rank, ex)

    def wait_for_done_markers(self, temp_dir: str, world_size: int, timeout_s: float) -> dict[str, FileRecord]:
        """Wait until every rank has written its done marker; return the records of all their files."""
        deadline = time.monotonic() + timeout_s
        waiting = set(range(world_size))
        while waiting:
            waiting = {rank for rank in waiting if not self.fs.exists(self._done_marker(temp_dir, rank))}
            if not waiting:
                break
            for rank in sorted(waiting):
                if self.fs.exists(failure := self._failure_marker(temp_dir, rank)):
                    message = self.fs.cat_file(failure).decode("utf-8", errors="replace")
                    raise RuntimeError(f"Rank {rank} failed to write its files of {temp_dir}: {message}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Rank 0 waited {timeout_s:g} s for ranks {sorted(waiting)} to finish writing "
                    f"{temp_dir}; they may have died or their file system may be far behind."
                )
            time.sleep(0.05)
        records: dict[str, FileRecord] = {}
        for rank in range(world_size):
            marker = self._done_marker(temp_dir, rank)
            for name, record in json.loads(self.fs.cat_file(marker)).items():
                records[name] = FileRecord(size=int(record["size"]), sha256=str(record["sha256"]))
            self.fs.rm(marker)
        return records

    @staticmethod
    def _done_marker(temp_dir: str, rank: int) -> str:
        return f"{temp_dir}/rank_{rank}.done.json"

    @staticmethod
    def _failure_marker(temp_dir: str, rank: int) -> str:
        return f"{temp_dir}/rank_{rank}.failed.txt"


def _human_bytes(size: int) -> str:
    units = ("B", "KB", "MB", "GB", "TB")
    value, index = float(size), 0
    while value >= 1000 and index < len(units) - 1:
        value, index = value / 1000, index + 1
    return f"{size} B" if index == 0 else f"{value:.1f} {units[index]}"
