"""Reading a checkpoint that a running job may prune: a read lease, and a retry where no lease can be held.

The run that saves checkpoints deletes those its keep policy drops (with ``keep_last_n=1``, the previous
one at every save) while ``eval``, ``export`` or another run's model bank may be reading them. On a local
file system a reader holds a shared ``flock`` on ``step_N/reading.lock`` while it reads, and the pruning
rank takes an exclusive one, without waiting, before it deletes: a checkpoint a reader holds is left for a
later prune. A new save of the same step waits for the readers of the old one instead (``CheckpointStore``).
The commit makes the lock file, so a reader needs no write permission, and no reader adds a file to a
directory that a prune may be deleting. Locks die with their process: a killed reader leaves nothing
behind. Having taken its lease, a reader checks that the checkpoint is still committed (the prune may have
come first) and otherwise chooses again: ``last`` is then the newer one.

Where there is no ``flock`` (``memory://``, object stores, a file system that refuses it) or no lock file
(a checkpoint saved before leases), nothing holds a checkpoint: a read that fails because its checkpoint
vanished meanwhile is tried again on the next choice, a bounded number of times.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Callable, Iterator
from typing import TypeVar

from checkpoint.errors import CheckpointError, CheckpointNotFoundError, CorruptCheckpointError
from checkpoint.store import READ_LOCK_FILE_NAME, CheckpointStore, Scan, basename
from gang import Gang

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_CHOICES = 5
"""How many checkpoints a reader chooses, each deleted before it was read, before it gives up."""


_GONE = "gone"
"""A checkpoint that is not there: pruned, or between the two renames of a new save of its step."""


@contextlib.contextmanager
def read_lease(store: CheckpointStore, step: int) -> Iterator[None]:
    """Hold the checkpoint of ``step`` against pruning while the block runs, where the file system allows."""
    descriptor = None
    if store.has_atomic_rename:
        descriptor = _shared_lock(store, f"{store.step_dir(step)}/{READ_LOCK_FILE_NAME}")
    try:
        yield
    finally:
        if descriptor is not None:
            os.close(descriptor)


def _shared_lock(store: CheckpointStore, path: str) -> int | None:
    """A descriptor of the lock file at ``path`` with a shared ``flock`` on it; None where none can be held."""
    while True:
        try:
            descriptor = os.open(path, os.O_RDONLY)
        except OSError:  # Pruned already, or saved before leases: the caller checks it is still there.
            return None
        try:
            held = store.lock(descriptor, fcntl.LOCK_SH)  # A prune or a same-step save may hold it exclusively.
        except BaseException:
            os.close(descriptor)
            raise
        if held and _names_file(path, descriptor):
            return descriptor
        os.close(descriptor)
        if not held:
            return None
        # Deleted, or replaced by a new save of its step, while this waited: lock the new checkpoint, if any.


def _names_file(path: str, descriptor: int) -> bool:
    """Whether ``path`` still names the file open as ``descriptor`` (not deleted or replaced since it was opened)."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(descriptor)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


@contextlib.contextmanager
def unread(store: CheckpointStore, step_dir: str) -> Iterator[bool]:
    """Whether no reader holds the checkpoint at ``step_dir``; while the block runs, none can start to.

    Where the file system refuses ``flock`` no reader can hold it: True, as off local disk.
    """
    if not store.has_atomic_rename:
        yield True
        return
    with store.held_from_readers(step_dir, wait=False) as free:
        yield free


def read_chosen(
    store: CheckpointStore,
    gang: Gang,
    scan: Callable[[], Scan],
    choose: Callable[[], int],
    read: Callable[[int], T],
) -> T:
    """``read(step)`` of the checkpoint ``choose`` picks, held by a lease on every rank of ``gang`` (collective).

    Rank 0 chooses, so that every rank reads the same step. A checkpoint deleted before every rank held
    it is chosen again; ``choose`` naming the same step again (an explicit one) means it is gone for good,
    unless it is back by then (a new save of its step was replacing it). A damaged one fails at once.
    Without a lease, a read that fails because its checkpoint vanished meanwhile is tried again in one
    process. In a gang a failed read raises on the rank where it failed, and ranks whose read went on stop at
    the gang's timeout, in ``read``'s next collective or their caller's: agreeing on the outcome would take a
    collective after ``read``, which a rank that failed before one of ``read``'s own would pair with the wrong one.

    :raises CheckpointNotFoundError: if the step ``choose`` insists on is gone.
    :raises CorruptCheckpointError: if the chosen checkpoint is damaged.
    :raises RuntimeError: if ``MAX_CHOICES`` checkpoints in a row were deleted before they were read.
    """
    vanished: int | None = None
    for _ in range(MAX_CHOICES):
        step = _agreed_choice(gang, choose)
        with read_lease(store, step):
            problems = gang.all_gather_object(_problem(store, scan(), step, insisted=step == vanished))
            if not any(problems):
                try:
                    return read(step)
                except Exception:
                    if gang.size > 1 or step in scan().committed:  # Ranks that read on would wait for this one.
                        raise
                    log.warning("The checkpoint of step %d was deleted while it was read: choosing again.", step)
            elif damage := next((problem for problem in problems if problem not in (None, _GONE)), None):
                raise CorruptCheckpointError(
                    f"The checkpoint of step {step} under {store.url} must be intact to be read, but {damage}."
                )
            elif step == vanished:
                raise CheckpointNotFoundError(
                    f"The checkpoint of step {step} under {store.url} must be there to be read, but the run "
                    "that saved it deleted it."
                )
        vanished = step
    raise RuntimeError(
        f"Could not read a checkpoint under {store.url}: the run that saves them deleted {MAX_CHOICES} in a row "
        "before they were read, and its file system holds no read lease. Run the command again."
    )


def _problem(store: CheckpointStore, scan: Scan, step: int, insisted: bool) -> str | None:
    """None where the checkpoint of ``step`` is committed; else ``_GONE``, or why it is damaged: as the scan found
    it, or, where ``choose`` insists on the step, as noted when the run moved it aside."""
    if step in scan.committed:
        base = scan.committed[step].base_step
        return None if base is None else _problem(store, scan, base, insisted)
    name = f"step_{step}"
    for damaged in scan.damaged:
        if basename(damaged.path) == name:
            return f"it is damaged: {damaged.reason}"
    for path in scan.set_aside if insisted else ():
        if basename(path).split(".")[0] == name:
            return f"it is damaged ({store.damage_note(path)}) and was moved aside to {basename(path)}"
    return _GONE


def _agreed_choice(gang: Gang, choose: Callable[[], int]) -> int:
    """Rank 0's choice, on every rank; a choice that failed raises on every rank."""
    if gang.size == 1:
        return choose()
    step, error = None, None
    if gang.rank == 0:
        try:
            step = choose()
        except Exception as ex:
            error = ex
    step, message = gang.broadcast_object((step, None if error is None else str(error)))
    if error is not None:
        raise error
    if message is not None:
        raise CheckpointError(message)
    assert step is not None
    return int(step)
