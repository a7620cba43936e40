"""``CheckpointManager``: save, commit, prune, list and load the checkpoints of one training run.

Every rank takes part in a save. Rank 0 writes the state that all ranks share, one file per
top-level key (``model.pt``, ``optimizer.pt``, ``trainer.pt``, ...), every rank writes its own
(``rank_K.pt``: data reader position, RNG states, sparse table shards), and rank 0 commits the
checkpoint once all files exist. Separate files are written and checksummed side by side, which
SHA-256, one stream per file, needs to keep up with ``torch.save``; and a reader that wants only
the model reads only ``model.pt``. A synchronous save exchanges the file checksums over the
gang; an asynchronous one runs no collective in its background thread (it would interleave with
training's), so each rank leaves a done marker that rank 0's writer waits for.

A damaged checkpoint (bad metadata, a missing, short or altered file) is never deleted: rank 0
moves it aside, and a resume falls back to the newest intact one. A failed write (a full disk)
ends the save with one ``CheckpointWriteError`` naming the path and the free space, on every rank.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import torch

from checkpoint.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CheckpointWriteError,
    CorruptCheckpointError,
    classify_load_failure,
    describe_failure,
)
from checkpoint.loaded import (
    CheckpointInfo,
    LoadedCheckpoint,
    base_of,
    rank_file_name,
    read_file,
    shared_file_name,
    shared_keys,
)
from checkpoint.metadata import CheckpointMetadata, FileRecord, package_versions
from checkpoint.policy import CheckpointPolicy
from checkpoint.pruning import Pruner
from checkpoint.reading import read_chosen
from checkpoint.save_arguments import check_arguments, check_base, check_shared_state
from checkpoint.serialization import (
    TensorCopy,
    check_serializable,
    copy_tensors,
    num_bytes,
    stage_to_cpu,
    write_torch_file,
)
from checkpoint.store import CheckpointStore, Scan, basename
from gang import Gang

log = logging.getLogger(__name__)

# Two files at a time, each hashed on its own thread, keep two cores busy; the time of a save is
# then bounded by its largest file (the optimizer state, for Adam twice the model).
_FILES_AT_ONCE = 2

T = TypeVar("T")


@dataclass
class _SaveJob:
    """What one rank writes for one save, with everything rank 0 needs to commit it."""

    step: int
    save_id: str
    temp_dir: str
    shared_state: Mapping[str, Any] | None  # Only on rank 0.
    rank_state: Mapping[str, Any]
    score: float | None
    model_only: bool
    extras: Mapping[str, Any]
    base_step: int | None
    # An asynchronous save's copies of tensors the caller leaves unchanged until they are made,
    # and the event that says they are.
    pending_copies: list[TensorCopy] = field(default_factory=list)
    staged: threading.Event = field(default_factory=threading.Event)


class CheckpointManager:
    """The checkpoints of one run under ``root`` (a local path or an fsspec URL).

    ``save`` and ``wait`` are collective: every rank of ``gang`` calls them at the same point.
    Listing and loading are not, and may be called on any rank; pruning and cleaning up
    unfinished saves is done by rank 0 only. With ``clean_up=False`` the manager never deletes
    leftovers, which a reader of another run's directory needs: there, a temporary directory may
    be a save still in flight.
    """

    def __init__(
        self,
        root: str,
        gang: Gang,
        policy: CheckpointPolicy | None = None,
        *,
        gang_sizes: Mapping[str, int] | None = None,
        config_hash: str | None = None,
        done_marker_timeout_s: float = 600.0,
        clean_up: bool = True,
    ) -> None:
        self._store = CheckpointStore(root)
        self._gang = gang
        self._policy = policy or CheckpointPolicy()
        self._pruner = Pruner(self._store, self._policy)
        self._gang_sizes = dict(gang_sizes or {})
        self._config_hash = config_hash
        self._done_marker_timeout_s = done_marker_timeout_s
        self._clean_up = clean_up
        self._writer: ThreadPoolExecutor | None = None
        self._pending: tuple[_SaveJob, Future[None]] | None = None
        # The CPU copy of the last asynchronous save, kept to copy the next one into.
        self._staged: _SaveJob | None = None
        self._scan_lock = threading.Lock()  # The background writer prunes while the caller may list.
        self._scan()  # Rank 0 cleans what a killed run left behind.

    @property
    def root(self) -> str:
        return self._store.url

    @property
    def policy(self) -> CheckpointPolicy:
        return self._policy

    def save(
        self,
        step: int,
        shared_state: Mapping[str, Any],
        rank_state: Mapping[str, Any] | None = None,
        *,
        score: float | None = None,
        model_only: bool = False,
        extras: Mapping[str, Any] | None = None,
        blocking: bool = True,
        unchanged_until_staged: Callable[[torch.Tensor], bool] | None = None,
        base_step: int | None = None,
    ) -> None:
        """Save a checkpoint of ``step``, then delete what the policy no longer keeps.

        ``shared_state`` is the same on every rank and only rank 0's is written, one file per
        key (so its keys must be file-name safe). ``rank_state`` is this rank's own.
        ``model_only`` marks a checkpoint that holds only the model, which is never resumed
        from. ``extras`` (JSON values) go into ``metadata.json``. ``base_step`` names a committed checkpoint whose
        rank files this one's lie over (the sparse tables' rows changed since it): pruning keeps it as long as
        this one, and loading this one hands it over too (``LoadedCheckpoint.base``).

        With ``blocking=False`` the states are copied to CPU (into the buffers of the previous
        asynchronous save when shapes match, so the manager keeps one CPU copy of the state)
        and written in the background; the next ``save`` or ``wait`` raises if that failed.
        Tensors for which ``unchanged_until_staged`` holds are copied by the background thread
        too, not here: the caller promises to leave them unchanged until ``wait_until_staged``
        returns, and calls it before changing them. The Trainer passes its parameters and
        optimizer state, which change only in the optimizer step, so the copy of the bulk of
        the state overlaps the next forward and backward pass.
        """
        self.wait()
        job: _SaveJob | None = None
        error: BaseException | None = None
        try:
            job = self._make_job(step, shared_state, rank_state or {}, score, model_only, extras or {}, base_step)
        except CheckpointError as ex:
            error = ex
        # One collective agrees on the save id and surfaces a bad argument on every rank at once.
        outcomes = self._gang.all_gather_object((uuid.uuid4().hex[:12], describe_failure(error)))
        self._raise_if_failed(step, error, [message for _, message in outcomes])
        assert job is not None
        job.save_id = outcomes[0][0]
        job.temp_dir = self._store.temp_dir(step, job.save_id)
        if blocking:
            self._save_blocking(job)
        else:
            previous = self._staged
            defer = unchanged_until_staged
            job.shared_state, shared_copies = stage_to_cpu(
                job.shared_state, previous.shared_state if previous else None, defer
            )
            job.rank_state, rank_copies = stage_to_cpu(job.rank_state, previous.rank_state if previous else None, defer)
            job.pending_copies = [*shared_copies, *rank_copies]
            self._staged = job
            if self._writer is None:
                self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
            self._pending = (job, self._writer.submit(self._save_in_background, job))

    def wait_until_staged(self) -> None:
        """Block until the pending asynchronous save holds its own copy of every tensor of its state."""
        if self._pending is not None:
            self._pending[0].staged.wait()

    def wait(self) -> None:
        """Block until the pending asynchronous save is committed; raise on every rank if it failed."""
        if self._pending is None:
            return
        job, future = self._pending
        self._pending = None
        error = future.exception()
        outcomes = self._gang.all_gather_object(describe_failure(error))
        self._raise_if_failed(job.step, error, outcomes, job.temp_dir)

    def close(self) -> None:
        """``wait``, then prune once more on rank 0 if its prunes kept checkpoints being read (collective).

        Without this, the last save's prune would be their last chance, and the run would end keeping more
        than its policy says. As any prune, it does not wait: one still read stays, and is said to.
        """
        self.wait()
        if self._pruner.kept_while_read:
            self._pruner.prune(self._scan().committed, last=True)

    def load(self, step: int, keys: Sequence[str] | None = None) -> LoadedCheckpoint:
        """Load the checkpoint of ``step``, verifying every file it reads against its checksum.

        ``keys`` picks the parts of the shared state to read (default: all): evaluating a
        model needs ``["model"]`` and not the optimizer state, twice its size with Adam.
        """
        committed = self._scan().committed
        if step not in committed:
            raise CheckpointNotFoundError(
                f"`step` must be one of the committed checkpoints under {self.root} "
                f"({sorted(committed) or 'none'}), but is {step} instead."
            )
        metadata = committed[step]
        base = base_of(self._store, metadata, committed)
        available = shared_keys(metadata)
        missing = [key for key in keys or () if key not in available]
        if missing:
            raise CheckpointError(
                f"`keys` must name parts of the shared state of step {step} ({', '.join(available)}), "
                f"but {', '.join(missing)} are not."
            )
        shared_files = [shared_file_name(key) for key in (available if keys is None else keys)]
        with ThreadPoolExecutor(max_workers=_FILES_AT_ONCE, thread_name_prefix="checkpoint-reader") as readers:
            parts = list(readers.map(partial(read_file, self._store, metadata), shared_files))
        shared_state = {key: value for part in parts for key, value in part.items()}
        return LoadedCheckpoint(self._store, metadata, shared_state, base)

    def read(self, choose: Callable[[], int], read: Callable[[int], T]) -> T:
        """``read(step)`` of the checkpoint ``choose`` picks, which no prune deletes until ``read`` returns; one
        pruned before it was held is chosen again. Collective: rank 0 chooses for all (``checkpoint.reading``)."""
        return read_chosen(self._store, self._gang, self._scan, choose, read)

    def list_checkpoints(self) -> list[CheckpointInfo]:
        committed = self._scan().committed
        reasons = self._policy.reasons_to_keep(list(committed.values()))
        best = self.best_step()
        return [
            CheckpointInfo(
                step=step,
                path=self._store.step_dir(step),
                score=metadata.score,
                size_bytes=metadata.size_bytes,
                resumable=metadata.resumable,
                kept_by=reasons[step],
                is_best=step == best,
            )
            for step, metadata in committed.items()
        ]

    def list_damaged(self) -> list[CheckpointInfo]:
        """The damaged checkpoints: those moved aside, with the reason noted then, and those not moved yet
        (seen by a reader that does not clean up, or on another rank)."""
        self._scan()  # Rank 0 of the run moves what it finds damaged aside first.
        scan = self._store.scan()
        found = [(path, self._store.damage_note(path)) for path in scan.set_aside]
        found += [(damaged.path, damaged.reason) for damaged in scan.damaged]
        return [
            CheckpointInfo(
                step=int(basename(path)[len("step_") :].split(".")[0]),
                path=path,
                score=None,
                size_bytes=self._size_on_disk(path),
                resumable=False,
                kept_by=(),
                is_best=False,
                damage=reason,
            )
            for path, reason in found
        ]

    def last_resumable_step(self) -> int | None:
        resumable = [step for step, metadata in self._scan().committed.items() if metadata.resumable]
        return max(resumable, default=None)

    def load_newest_intact(self) -> LoadedCheckpoint | None:
        """The newest resumable checkpoint whose files all check out, the same on every rank (collective).

        A damaged one is moved aside by rank 0 and the next older one is tried: training resumes
        from what is intact, and the damaged files stay for a person to look at. Each rank reads
        every shared file and the rank files ``k`` with ``k % size == rank``: between them the ranks
        check every file once, and in the layout that saved it each reads exactly its own.
        """
        committed = self._scan().committed
        candidates = [step for step, metadata in sorted(committed.items(), reverse=True) if metadata.resumable]
        for step in self._gang.broadcast_object(candidates):
            loaded: LoadedCheckpoint | None = None
            error: Exception | None = None
            try:
                loaded = self.load(step)
                loaded.verify_rank_files(range(self._gang.rank, loaded.num_ranks, self._gang.size))
            except Exception as ex:
                error = ex
            outcomes = self._gang.all_gather_object(classify_load_failure(error))
            if not any(message for _, message in outcomes):
                assert loaded is not None
                return loaded
            if error is not None and not isinstance(error, CorruptCheckpointError):
                raise error
            for rank, (kind, message) in enumerate(outcomes):
                if kind != "damaged" and message is not None:
                    error_type = CheckpointError if kind == "user" else RuntimeError
                    raise error_type(f"Rank {rank} could not load the checkpoint of step {step}: {message}")
            if self._gang.rank == 0:
                reasons = dict.fromkeys(message for _, message in outcomes if message is not None)
                self._store.move_aside(self._store.step_dir(step), "; ".join(reasons))
        return None

    def best_step(self) -> int | None:
        """The step of the best-scored checkpoint, by the policy's ``lower_better``; None without scores."""
        ranked = self._policy.ranked_by_score(list(self._scan().committed.values()))
        return ranked[0].step if ranked else None

    def _make_job(
        self,
        step: int,
        shared_state: Mapping[str, Any],
        rank_state: Mapping[str, Any],
        score: float | None,
        model_only: bool,
        extras: Mapping[str, Any],
        base_step: int | None,
    ) -> _SaveJob:
        is_writer = self._gang.rank == 0
        check_arguments(step, score, extras, base_step)
        if is_writer:  # what rank 0 alone writes, or knows without listing on every rank
            check_shared_state(shared_state)
            if base_step is not None:
                check_base(step, base_step, self._scan().committed)
        check_serializable(rank_state, "rank_state")
        return _SaveJob(
            step=step,
            save_id="",
            temp_dir="",
            shared_state=shared_state if is_writer else None,
            rank_state=rank_state,
            score=None if score is None else float(score),
            model_only=model_only,
            extras=dict(extras),
            base_step=base_step,
        )

    def _write_own_files(self, job: _SaveJob) -> dict[str, FileRecord]:
        fs = self._store.fs
        with self._reporting_write_failure(job.step, job.temp_dir):
            fs.makedirs(job.temp_dir, exist_ok=True)
        files: dict[str, Mapping[str, Any]] = {rank_file_name(self._gang.rank): job.rank_state}
        if job.shared_state is not None:
            files.update({shared_file_name(key): {key: value} for key, value in job.shared_state.items()})
        largest_first = sorted(files, key=lambda name: num_bytes(files[name]), reverse=True)
        records: dict[str, FileRecord] = {}
        with ThreadPoolExecutor(max_workers=_FILES_AT_ONCE, thread_name_prefix="checkpoint-file") as writers:
            futures = {
                name: writers.submit(write_torch_file, fs, f"{job.temp_dir}/{name}", files[name])
                for name in largest_first
            }
            for name, future in futures.items():
                with self._reporting_write_failure(job.step, f"{job.temp_dir}/{name}"):
                    records[name] = future.result()
        return records

    def _save_blocking(self, job: _SaveJob) -> None:
        records: dict[str, FileRecord] = {}
        error: BaseException | None = None
        try:
            records = self._write_own_files(job)
        except Exception as ex:
            error = ex
        outcomes = self._gang.all_gather_object((records, describe_failure(error)))
        self._raise_if_failed(job.step, error, [message for _, message in outcomes], job.temp_dir)
        if self._gang.rank == 0:
            try:
                all_records = {name: record for rank_records, _ in outcomes for name, record in rank_records.items()}
                self._commit_and_prune(job, all_records)
            except Exception as ex:
                error = ex
        # Doubles as the barrier after which every rank sees the committed checkpoint.
        self._raise_if_failed(job.step, error, self._gang.all_gather_object(describe_failure(error)), job.temp_dir)

    def _save_in_background(self, job: _SaveJob) -> None:
        try:
            copy_tensors(job.pending_copies)
        finally:
            job.pending_copies = []  # Holds the caller's live tensors.
            job.staged.set()
        try:
            records = self._write_own_files(job)
            with self._reporting_write_failure(job.step, job.temp_dir):
                self._store.write_done_marker(job.temp_dir, self._gang.rank, records)
        except Exception as ex:
            if self._gang.rank != 0:  # Rank 0 waits for this rank's files; it need not wait any longer.
                self._store.write_failure_marker(job.temp_dir, self._gang.rank, str(describe_failure(ex)))
            raise
        if self._gang.rank == 0:
            all_records = self._store.wait_for_done_markers(job.temp_dir, self._gang.size, self._done_marker_timeout_s)
            self._commit_and_prune(job, all_records)

    @contextmanager
    def _reporting_write_failure(self, step: int, path: str) -> Iterator[None]:
        """Turn an ``OSError`` of writing ``path`` into the one line that says where and how much space is left."""
        try:
            yield
        except CheckpointWriteError:
            raise
        except OSError as ex:
            raise self._store.write_error(step, path, ex) from ex

    def _commit_and_prune(self, job: _SaveJob, records: Mapping[str, FileRecord]) -> None:
        metadata = CheckpointMetadata(
            step=job.step,
            score=job.score,
            model_only=job.model_only,
            world_size=self._gang.size,
            gang_sizes=self._gang_sizes,
            config_hash=self._config_hash,
            versions=package_versions(),
            files=records,
            extras=job.extras,
            base_step=job.base_step,
        )
        with self._reporting_write_failure(job.step, self._store.step_dir(job.step)):
            self._store.commit(job.temp_dir, metadata, job.save_id)
        log.info("Saved the checkpoint of step %d to %s.", job.step, self._store.step_dir(job.step))
        self._pruner.prune(self._scan().committed)

    def _scan(self) -> Scan:
        """List the root. Rank 0 of the run (``clean_up``) also deletes its own unfinished directories
        and moves damaged checkpoints aside, except a pending save's directories."""
        with self._scan_lock:
            scan = self._store.scan()
            if self._clean_up and self._gang.rank == 0 and (scan.leftovers or scan.damaged):
                in_flight = set()
                if self._pending is not None:
                    job = self._pending[0]
                    step_dir = self._store.step_dir(job.step)
                    in_flight = {job.temp_dir, step_dir, f"{step_dir}.old-{job.save_id}"}
                self._store.clean(scan.leftovers, keep=in_flight)
                for damaged in scan.damaged:
                    if damaged.path not in in_flight:
                        self._store.move_aside(damaged.path, damaged.reason)
            return scan

    def _raise_if_failed(
        self, step: int, own_error: BaseException | None, messages: list[str | None], temp_dir: str | None = None
    ) -> None:
        """Raise this rank's own error, or a summary of another rank's, so that all ranks fail together.

        Rank 0 first deletes the failed save's temporary directory (every rank is done with it
        by now): on a full disk, its partial files hold the space the user needs back.
        """
        if own_error is None and not any(messages):
            return
        if temp_dir is not None and self._gang.rank == 0:
            self._discard(temp_dir)
        if own_error is not None:
            raise own_error
        for rank, message in enumerate(messages):
            if message is not None:
                raise RuntimeError(f"Rank {rank} failed to save the checkpoint of step {step}: {message}")

    def _discard(self, temp_dir: str) -> None:
        try:
            if self._store.fs.exists(temp_dir):
                self._store.fs.rm(temp_dir, recursive=True)
        except OSError as ex:
            log.warning("Could not delete %s, left by a failed save: %s", temp_dir, ex)

    def _size_on_disk(self, path: str) -> int:
        try:
            return int(self._store.fs.du(path))
        except OSError:
            return 0
