"""Reading a checkpoint that a running job may prune: a read lease, and a retry where no lease can be held.

The run that saves checkpoints deletes those its keep policy drops (with ``keep_last_n=1``, the previous
one at every save) while ``eval``, ``export`` or another run's model bank may be reading them. On a local
file system a reader holds a shared ``flock`` on ``step_N/reading.lock`` while it reads, and the pruning
rank takes an exclusive one, without waiting, before it deletes: a checkpoint a reader holds is left for a
later prune. The commit makes the lock file, so a reader needs no write permission, and no reader adds a
file to a directory that a prune may be deleting. Locks die with their process: a killed reader leaves
nothing behind. Having taken its lease, a reader checks that the checkpoint is still committed (the prune
may have come first) and otherwise chooses again: ``last`` is then the newer one.

Where there is no ``flock`` (``memory://``, object stores) or no lock file (a checkpoint saved before
leases), nothing holds a checkpoint: a read that fails because its checkpoint vanished meanwhile is tried
again on the next choice, a bounded number of times.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Callable, Collection, Iterator
from typing import TypeVar

from checkpoint.errors import CheckpointError, CheckpointNotFoundError
from checkpoint.store import READ_LOCK_FILE_NAME, CheckpointStore
from gang import Gang

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_CHOICES = 5
"""How many checkpoints a reader chooses, each deleted before it was read, before it gives up."""


@contextlib.contextmanager
def read_lease(store: CheckpointStore, step: int) -> Iterator[None]:
    """Hold the checkpoint of ``step`` against pruning while the block runs, where the file system allows."""
    if not store.has_atomic_rename:
        yield
        return
    try:
        descriptor = os.open(f"{store.step_dir(step)}/{READ_LOCK_FILE_NAME}", os.O_RDONLY)
    except OSError:  # Pruned already, or saved before leases: the caller checks it is still there.
        yield
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH)  # A prune holds the exclusive lock only while it deletes.
        yield
    finally:
        os.close(descriptor)


@contextlib.contextmanager
def unread(store: CheckpointStore, step_dir: str) -> Iterator[bool]:
    """Whether no reader holds the checkpoint at ``step_dir``; while the block runs, none can start to."""
    if not store.has_atomic_rename:
        yield True
        return
    descriptor = os.open(f"{step_dir}/{READ_LOCK_FILE_NAME}", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(descriptor)


def read_chosen(
    store: CheckpointStore,
    gang: Gang,
    committed: Callable[[], Collection[int]],
    choose: Callable[[], int],
    read: Callable[[int], T],
) -> T:
    """``read(step)`` of the checkpoint ``choose`` picks, held by a lease on every rank of ``gang`` (collective).

    Rank 0 chooses, so that every rank reads the same step. A checkpoint deleted before every rank held
    it is chosen again; ``choose`` naming the same step again (an explicit one) means it is gone for good.
    Without a lease, a read that fails because its checkpoint vanished meanwhile is tried again in one
    process; ranks of a gang fail together instead, as they would mid-way through ``read``'s collectives.

    :raises CheckpointNotFoundError: if the step ``choose`` insists on is gone.
    :raises RuntimeError: if ``MAX_CHOICES`` checkpoints in a row were deleted before they were read.
    """
    vanished: int | None = None
    for _ in range(MAX_CHOICES):
        step = _agreed_choice(gang, choose)
        if step == vanished:
            raise CheckpointNotFoundError(
                f"The checkpoint of step {step} under {store.url} must be there to be read, but the run "
                "that saved it deleted it."
            )
        with read_lease(store, step):
            held = step in committed()
            if all(gang.all_gather_object(held)):
                try:
                    return read(step)
                except Exception:
                    if gang.size > 1 or step in committed():  # Ranks that read on would wait for this one.
                        raise
                    log.warning("The checkpoint of step %d was deleted while it was read: choosing again.", step)
        vanished = step
    raise RuntimeError(
        f"Could not read a checkpoint under {store.url}: the run that saves them deleted {MAX_CHOICES} in a row "
        "before they were read, and its file system holds no read lease. Run the command again."
    )


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
