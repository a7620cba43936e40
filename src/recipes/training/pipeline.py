"""The train pipeline: the next step's batches read, and their sparse ids sent to the tables' owners,
while the current step computes.

As TorchRec's ``TrainPipelineSparseDist`` does, one background thread works a step ahead: it
reads the next step's micro-batches and, for every embedding collection of the model, checks and
groups their sparse features and sends their ids to the ranks that own the rows
(``ShardedEmbeddingCollection.prepare_ahead``), over a second process group of the same ranks so
that its collectives never interleave with the step's. What was prepared travels with the
batch's sparse features (``SparseFeatures.prepared``) to the collection's forward, which then
only pools and sends the partial sums back. On a GPU the thread reads ahead and pins the batch; the main thread copies
it without blocking, and the ids travel in the forward as without a pipeline.

It changes nothing in what is computed, only when: the batches, ids and their order are those of
the plain loop, so a run is bit-exact with ``trainer.pipeline: false``, and a checkpoint holds the
reader's position before the batch read ahead, so a resume reads that batch again.

The thread is the reader's only user while it works, and every rank asks it for a step at the same
point of the loop, so the ranks' background collectives pair up. A reader that draws from the global
random generators would interleave its draws with the model's differently at every run: the first
read checks for that, and such a reader is read on the main thread instead, as without a pipeline.
"""

from __future__ import annotations

import copy
import logging
import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, fields, is_dataclass, replace
from queue import SimpleQueue
from typing import Any, Literal, TypeVar

import numpy as np
import torch

from embedding import PreparedLookup, ReadAhead, ShardedEmbeddingCollection, SparseFeatures
from gang import Gang, Gangs
from recipes.runtime.threads import leaves_a_core, spans_several_nodes
from recipes.training.data_reader import DataReader

log = logging.getLogger(__name__)

BatchT = TypeVar("BatchT")
T = TypeVar("T")


@dataclass
class _Read:
    """One step read ahead: the reader's state before it, its micro-batches (``None``: the epoch ended) and what
    was prepared for their forwards, or the error that reading or preparing it raised, re-raised when the step is
    taken."""

    state: dict[str, Any]
    batches: list[Any] | None = None
    prepared: list[PreparedLookup | ReadAhead] = field(default_factory=list)
    error: BaseException | None = None


class _Worker:
    """One daemon thread running submitted calls in order (a hung collective never blocks the interpreter's exit)."""

    def __init__(self) -> None:
        self._calls: SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = SimpleQueue()
        threading.Thread(target=self._loop, name="train-pipeline", daemon=True).start()

    def submit(self, call: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._calls.put((call, future))
        return future

    def close(self) -> None:
        self._calls.put(None)

    def _loop(self) -> None:
        while (item := self._calls.get()) is not None:
            call, future = item
            try:
                future.set_result(call())
            except BaseException as ex:  # handed to the main thread with the result
                future.set_exception(ex)


def use_pipeline(setting: bool | Literal["auto"], device: torch.device, reads_disk: bool = False) -> bool:
    """``trainer.pipeline``'s choice for a rank on ``device``, said in the log where ``auto`` turns it off.

    The thread overlaps waiting (a GPU step, another node's answer, a table's rows read from disk: ``reads_disk``)
    and work of its own with the step. On a CPU whose cores the step's threads all take, there is no waiting to
    overlap and its work preempts a thread of every parallel region: ``dlrm_criteo_tiny`` on 2 idle cores ran
    32,000 samples/s with it, 61,000 without (docs/benchmarks.md, "Training on a shared machine").
    """
    if setting != "auto":
        return setting
    if device.type != "cpu" or reads_disk or leaves_a_core() or spans_several_nodes():
        return True
    log.info(
        "Train pipeline: off (trainer.pipeline: auto): the step's threads take every core of this node, so the "
        "pipeline's thread would preempt them."
    )
    return False


class PipelinedReader(DataReader[BatchT]):
    """``reader``'s steps, each read and prepared on a background thread during the step before it.

    ``collections`` are the model's embedding collections whose ids travel ahead (on a CPU gang;
    none on a GPU), on clones of ``gangs`` (the job's); ``device`` is where the batches go. Every
    process of the job builds it at the same point (the clones are process groups).
    """

    def __init__(
        self,
        reader: DataReader[BatchT],
        collections: Sequence[ShardedEmbeddingCollection],
        device: torch.device,
        gangs: Gangs,
    ) -> None:
        self._reader = reader
        self._device = device
        self._id_gangs = _id_gangs(collections, gangs) if device.type == "cpu" else {}
        self._prefetching = [collection for collection in collections if id(collection) in self._id_gangs]
        if device.type == "cuda":  # only rows of tables off the device are read ahead, on the host
            self._prefetching = [collection for collection in collections if collection.reads_ahead]
        self._worker = _Worker()
        self._pending: Future[_Read] | None = None
        self._handed_over: list[PreparedLookup | ReadAhead] = []
        """What was prepared for the step last handed to the Trainer: its forward has used it since, or not."""
        self._on_main_thread = False
        self._num_reads = 0
        self._reported = False

    def __next__(self) -> list[BatchT]:
        if self._on_main_thread:
            read = self._read_and_prepare(prefetch=False)
        else:
            if self._pending is None:
                self._submit()
            assert self._pending is not None
            read = self._pending.result()
            self._pending = None
            self._check_first_read()
        if read.error is not None:
            raise read.error
        if read.batches is None:
            raise StopIteration
        self._stop_unused_prefetching()
        self._handed_over = read.prepared
        if not self._on_main_thread:
            self._submit()
        return [_to_device(batch, self._device) for batch in read.batches]

    @property
    def wrapped(self) -> DataReader[BatchT]:
        """The reader read ahead: between its data epochs (or windows) no step is read ahead of the Trainer."""
        return self._reader

    def reset(self) -> None:
        assert self._pending is None, "An epoch ends with no step read ahead."
        self._reader.reset()

    def describe(self) -> str:
        return self._reader.describe()

    def state_dict(self) -> dict[str, Any]:
        """The position before the step read ahead: a resume reads that step again."""
        if self._pending is not None:
            return self._pending.result().state
        return self._reader.state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        assert self._pending is None, "A reader's state is loaded before training starts."
        self._reader.load_state_dict(state_dict)

    def close(self, wait: bool = True) -> None:
        """Stop the thread once the step read ahead is done; ``wait`` for it (its collectives pair with the other
        ranks', which must end before the process groups do). A run that failed does not wait: a rank that
        failed may never pair."""
        if wait and self._pending is not None:
            self._pending.result()
        self._pending = None
        self._worker.close()

    # Reading ahead ----------------------------------------------------------------------------

    def _submit(self) -> None:
        self._num_reads += 1
        self._pending = self._worker.submit(lambda: self._read_and_prepare(prefetch=True))

    def _read_and_prepare(self, prefetch: bool) -> _Read:
        """Read one step, remembering the position before it; on the CPU, send its ids ahead."""
        read = _Read(copy.deepcopy(self._reader.state_dict()))
        random_state = _global_random_state() if self._num_reads == 1 else None
        try:
            read.batches = next(self._reader)
        except StopIteration:
            return read
        except BaseException as ex:
            read.error = ex
            return read
        if random_state is not None and random_state != _global_random_state():
            self._on_main_thread = True  # checked by the main thread once this read is done
        if self._device.type == "cuda":
            read.batches = [_map_tensors(batch, _pinned) for batch in read.batches]
        if prefetch and not self._on_main_thread and self._prefetching:
            try:
                read.batches = [self._prepare_ahead(batch, read.prepared) for batch in read.batches]
            except BaseException as ex:
                read.error = ex
        return read

    def _prepare_ahead(self, batch: Any, prepared: list[PreparedLookup | ReadAhead]) -> Any:
        """``batch`` with its sparse features carrying what each collection prepared ahead for them: on a CPU, their
        lookups with the ids sent ahead; for a GPU, the rows of tables off the device read ahead."""
        found = list(_sparse_features_in(batch))
        carrying = list(found)
        for collection in self._prefetching:
            features = _features_of(collection, found)
            if features is not None:
                index = found.index(features)
                if self._device.type == "cuda":
                    carrying[index] = collection.read_ahead(carrying[index])
                else:
                    carrying[index] = collection.prepare_ahead(carrying[index], self._id_gangs[id(collection)])
                handed = carrying[index].prepared_for(collection)
                assert isinstance(handed, (PreparedLookup, ReadAhead))
                prepared.append(handed)
        return _rebuild(batch, lambda value: _replacement(value, found, carrying))

    def _check_first_read(self) -> None:
        if self._reported:
            return
        self._reported = True
        if self._on_main_thread:
            log.warning(
                "The training reader draws from the global random generators: it is read on the main thread, "
                "without the pipeline, so that runs stay reproducible. Give it its own generator to pipeline it."
            )
        elif self._prefetching:
            log.info("Train pipeline: the next step is read and its ids sent ahead while a step computes.")

    def _stop_unused_prefetching(self) -> None:
        """Stop preparing ahead for a collection whose forward did not use what was prepared for the last step."""
        unused = {id(prepared.owner) for prepared in self._handed_over if not prepared.used}
        for collection in [c for c in self._prefetching if id(c) in unused]:
            log.warning(
                "Train pipeline: the model looked up other sparse features than the batch's own object, so the "
                "ids sent ahead went unused; they travel in the forward from now on."
            )
            self._prefetching.remove(collection)


def _id_gangs(collections: Sequence[ShardedEmbeddingCollection], gangs: Gangs) -> dict[int, Gang]:
    """Per collection, the gang its ids are sent ahead on: the clone of its own (one of ``gangs``), whose
    collectives never pair with the step's; its own where no id leaves the rank. A collection on a gang of
    its own making gets none: its ids travel in the forward."""
    if not any(collection.sends_ids for collection in collections):
        return {id(collection): collection.gang for collection in collections}
    clone = gangs.clone()  # the same decision on every rank: the models are the same
    clones = {id(gangs.root): clone.root, id(gangs.dp): clone.dp, id(gangs.tp): clone.tp}
    id_gangs = {}
    for collection in collections:
        if not collection.sends_ids:
            id_gangs[id(collection)] = collection.gang
        elif id(collection.gang) in clones:
            id_gangs[id(collection)] = clones[id(collection.gang)]
        else:
            log.info("Train pipeline: a sparse table's gang is none of the job's; its ids travel in the forward.")
    return id_gangs


def _features_of(collection: ShardedEmbeddingCollection, found: Sequence[SparseFeatures]) -> SparseFeatures | None:
    """The one sparse-features object of a batch that holds every feature ``collection`` looks up, if one does."""
    needed = [feature for table in collection.tables for feature in table.features]
    holding = [features for features in found if all(name in features for name in needed)]
    return holding[0] if len(holding) == 1 else None


def _sparse_features_in(batch: Any, depth: int = 3) -> Iterator[SparseFeatures]:
    """The sparse-features objects of a batch: itself, or in its dataclass fields, mapping values or items."""
    if isinstance(batch, SparseFeatures):
        yield batch
    elif depth > 0:
        for child in _children(batch):
            yield from _sparse_features_in(child, depth - 1)


def _children(value: Any) -> list[Any]:
    if is_dataclass(value) and not isinstance(value, type):
        return [getattr(value, field.name) for field in fields(value)]
    if isinstance(value, Mapping):
        return list(value.values())
    if isinstance(value, (list, tuple)):
        return list(value)
    return []


def _rebuild(value: Any, replace_leaf: Callable[[Any], Any]) -> Any:
    """``value`` rebuilt through dataclasses, mappings, lists, tuples and sparse features (mappings of dataclasses),
    each part that ``replace_leaf`` maps to something other than ``None`` replaced by it."""
    replaced = replace_leaf(value)
    if replaced is not None:
        return replaced
    if isinstance(value, SparseFeatures):
        jagged = {name: _rebuild(ids, replace_leaf) for name, ids in value.items()}
        return SparseFeatures(jagged, value.prepared)
    if is_dataclass(value) and not isinstance(value, type):
        return replace(
            value, **{f.name: _rebuild(getattr(value, f.name), replace_leaf) for f in fields(value) if f.init}
        )
    if isinstance(value, Mapping):
        return {key: _rebuild(item, replace_leaf) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        items = [_rebuild(item, replace_leaf) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
    return value


def _map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``value`` with ``fn`` applied to each of its tensors."""
    return _rebuild(value, lambda part: fn(part) if isinstance(part, torch.Tensor) else None)


def _replacement(value: Any, originals: Sequence[SparseFeatures], replacements: Sequence[SparseFeatures]) -> Any:
    """The replacement of ``value`` if it is one of ``originals`` (by identity), else ``None``."""
    return next((new for old, new in zip(originals, replacements) if value is old), None)


def _pinned(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.pin_memory() if tensor.device.type == "cpu" else tensor


def _to_device(batch: Any, device: torch.device) -> Any:
    """A pinned batch copied to the GPU without blocking the host; on the CPU, the batch as it is."""
    if device.type != "cuda":
        return batch
    return _map_tensors(batch, lambda tensor: tensor.to(device, non_blocking=True))


def _global_random_state() -> tuple[Any, ...]:
    """The global generators a reader could draw from: Python's, numpy's and torch's CPU one."""
    _, keys, position, has_gauss, cached_gauss = np.random.get_state(legacy=True)
    return (
        random.getstate(),
        np.asarray(keys).tobytes(),
        position,
        has_gauss,
        cached_gauss,
        torch.random.get_rng_state().numpy().tobytes(),
    )
