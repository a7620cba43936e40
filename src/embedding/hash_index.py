"""The id -> row map of a dynamic (hash) table shard: any int64 id, no collisions, admission and eviction.

A shard has ``capacity`` row slots. :class:`HashIndex` maps ids to slots with open addressing
(linear probing over an ``int32`` array of slot numbers, at most 80% full and growing with the
ids held up to 1.25 entries per slot, with backward-shift deletion, so no tombstones), and keeps
per slot its key, the step it was last looked up in training and how often it was. The whole
batch goes through one numba call.

Training lookups find or insert; evaluation only finds. The choices are deterministic, given the
index's state, so that runs reproduce and resume bit-exact:

- a step's ids arrive sorted and deduplicated, with their number of occurrences;
- admission: an absent id gets a slot once seen ``min_count`` times (counted, while it has no
  slot, in a count-min sketch with conservative update, whose counts halve periodically, so
  that it counts recent occurrences) and, with ``admit_probability`` < 1, on
  a coin flip seeded by the id and the step. Until then it has no row (slot -1);
- a free slot is the next one at or after a cursor that sweeps the slots;
- a full shard does what its eviction policy says (:mod:`embedding.eviction`): evict (``lru``:
  the least recently looked-up id, ``lfu``: the least often), refuse the id, or raise. Eviction
  takes the lowest-scored of 8 candidate slots sampled from a hash of the id and the step, as
  Redis samples its keys: an approximation of the exact order that costs a few reads per insert
  instead of a heap. A slot looked up in the current step is never evicted, since its gradient
  is still to be applied; an id whose candidates all were gets no row in this step;
- a policy may expire ids (``ttl``): before a step's first lookup, the slots not looked up in its
  last ``expires_after`` steps are freed.

Slot, key and counters live in numpy arrays that a checkpoint saves as they are. Here the ids of a
step are taken one after the other; :class:`embedding.cuda_hash_index.CudaHashIndex` takes them
all at once on a GPU and comes to the same slots.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np
import numpy.typing as npt
import torch

from embedding import compiled_source
from embedding.eviction import EVICTION_POLICIES, EvictionConfig, Score, WhenFull, eviction_spec
from embedding.hash_probing import EMPTY, MAX_COUNT, best_candidate, coin, count_occurrences, find, home

ENTRIES_PER_SLOT = 1.25
"""Index entries per slot: the index is at most 80% full, where linear probing stays short."""

SKETCH_DEPTH = 2
MIN_INDEX_SIZE = 1024


class TableFullError(RuntimeError):
    """Raised when a table whose eviction policy makes no room (``none``) has no free slot for an admitted id."""


@numba.njit(cache=True)
def _lookup_kernel(index, keys, ids, slots):  # type: ignore[no-untyped-def]
    for i in range(ids.size):
        position = find(index, keys, ids[i])
        slots[i] = index[position] if position >= 0 else -1


@numba.njit(cache=True)
def _touch_kernel(index, keys, last_seen, frequency, ids, step, slots):  # type: ignore[no-untyped-def]
    """Find every occurrence of ``ids``; a found slot is marked as used in ``step`` and counted once more."""
    for i in range(ids.size):
        position = find(index, keys, ids[i])
        if position < 0:
            slots[i] = -1
            continue
        slot = index[position]
        last_seen[slot] = step
        if frequency[slot] < MAX_COUNT:
            frequency[slot] += 1
        slots[i] = slot


@numba.njit(cache=True)
def _delete(index, keys, position):  # type: ignore[no-untyped-def]
    """Empty index ``position``, shifting back the entries whose probe passed through it."""
    size = index.size
    hole = position
    probe = position
    while True:
        probe += 1
        if probe == size:
            probe = 0
        slot = index[probe]
        if slot == EMPTY:
            break
        entry_home = home(keys[slot], size)
        # The entry at ``probe`` may move into the hole unless its home lies cyclically in (hole, probe].
        if hole <= probe:
            movable = entry_home <= hole or entry_home > probe
        else:
            movable = entry_home <= hole and entry_home > probe
        if movable:
            index[hole] = slot
            hole = probe
    index[hole] = EMPTY


@numba.njit(cache=True)
def _free_slots_kernel(index, keys, last_seen, slots):  # type: ignore[no-untyped-def]
    """Free ``slots``: their ids leave the index."""
    for slot in slots:
        _delete(index, keys, find(index, keys, keys[slot]))
        last_seen[slot] = -1


@functools.cache
def _find_or_insert_kernel(score: Score | None, when_full: WhenFull) -> Any:
    """The kernel that gives slots to new ids under an eviction policy's ``score`` and ``when_full``.

    Both are constants of the kernel, so numba compiles the score into it; numba's cache keeps one
    entry per policy in this closure's index, keyed by them, so a new process loads it compiled.
    """
    evicts, fails = when_full == "evict", when_full == "error"
    score_source = compiled_source.source_digest(score)  # An edited score compiles anew (see compiled_source).

    @numba.njit(cache=True)
    def find_or_insert(  # type: ignore[no-untyped-def]
        index, keys, last_seen, frequency, sketch, counters,
        ids, counts, step, seed, min_count, probability, slots, inserted,
    ):  # fmt: skip
        """Map sorted, unique ``ids`` (seen ``counts`` times this step) to slots, inserting admitted ones.

        One id after the other, in order: each decision sees the ones before it. Returns the number of
        slots written to ``inserted`` (to be initialised), or -1 - i if id ``i`` found the shard full
        under a policy that fails then.
        """
        score_source  # noqa: B018 (named, so that the kernel captures it)
        capacity = keys.size
        num_inserted = 0
        for i in range(ids.size):
            key = ids[i]
            position = find(index, keys, key)
            if position >= 0:
                slot = index[position]
                last_seen[slot] = step
                frequency[slot] = min(np.int64(frequency[slot]) + counts[i], np.int64(MAX_COUNT))
                slots[i] = slot
                continue
            admitted = True
            if min_count > 1:
                admitted = count_occurrences(sketch, counters, key, counts[i]) >= min_count
            if admitted and probability < 1.0 and not coin(key, step, seed, probability):
                admitted = False
            slot = -1
            if admitted:
                if counters[0] < capacity:
                    slot = counters[1]
                    while last_seen[slot] >= 0:
                        slot = slot + 1 if slot + 1 < capacity else 0
                    counters[1] = slot + 1 if slot + 1 < capacity else 0
                    counters[0] += 1
                elif fails:
                    return -1 - i
                elif evicts:
                    slot = best_candidate(keys, last_seen, frequency, key, step, score)
                    if slot >= 0:
                        _delete(index, keys, find(index, keys, keys[slot]))
                        counters[4] += 1
            if slot < 0:
                counters[3] += 1
                slots[i] = -1
                continue
            keys[slot] = key
            last_seen[slot] = step
            frequency[slot] = min(counts[i], np.int64(MAX_COUNT))
            index[-1 - find(index, keys, key)] = slot
            counters[2] += 1
            slots[i] = slot
            inserted[num_inserted] = slot
            num_inserted += 1
        return num_inserted

    return find_or_insert


@dataclass(frozen=True)
class HashPolicy:
    """How a hash table admits and evicts ids (see the module's docstring)."""

    min_count: int = 1
    admit_probability: float = 1.0
    eviction: EvictionConfig = field(default_factory=EVICTION_POLICIES.default("lru"))


class HashIndex:
    """The slots of one shard of a dynamic table, and the ids that hold them.

    ``step`` counts training steps; the optimizer advances it after applying a step's
    gradients (``advance``), so that everything looked up before an update counts as that
    step's, whatever the number of micro-batches.
    """

    def __init__(self, capacity: int, policy: HashPolicy, seed: int = 0, sketch_width: int | None = None) -> None:
        self.capacity = capacity
        self.policy = policy
        self.eviction = eviction_spec(policy.eviction)  # what a full shard does, compiled into the kernels
        self.seed = seed
        self.keys = np.zeros(capacity, dtype=np.int64)
        self.last_seen = np.full(capacity, -1, dtype=np.int32)
        self.frequency = np.zeros(capacity, dtype=np.int32)
        self.index = np.full(self._index_size(0), EMPTY, dtype=np.int32)
        width = sketch_width if sketch_width is not None else max(capacity, 1024)
        self.sketch = np.zeros((SKETCH_DEPTH, width) if policy.min_count > 1 else (SKETCH_DEPTH, 0), dtype=np.int32)
        # num_used, cursor, admitted, rejected, evicted, and the occurrences counted in the sketch since it last aged.
        self.counters = np.zeros(6, dtype=np.int64)
        self.step = 0
        self._expired_at = -1

    @property
    def nbytes(self) -> int:
        """The memory of the map itself (keys, counters, index, sketch), besides the rows; the index
        grows with the ids held, up to 1.25 entries per slot."""
        arrays = (self.keys, self.last_seen, self.frequency, self.index, self.sketch)
        return sum(array.nbytes for array in arrays)

    @property
    def num_used(self) -> int:
        return int(self.counters[0])

    def statistics(self) -> dict[str, float]:
        """Rows in use and the cumulative admitted, rejected and evicted ids (expired ones included)."""
        return {
            "rows_used": float(self.counters[0]),
            "admitted": float(self.counters[2]),
            "rejected": float(self.counters[3]),
            "evicted": float(self.counters[4]),
        }

    def find(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The slot of each id, -1 where it has none; changes nothing."""
        slots = np.empty(ids.size, dtype=np.int64)
        _lookup_kernel(self.index, self.keys, np.ascontiguousarray(ids, dtype=np.int64), slots)
        return slots

    def touch_or_insert(
        self, ids: npt.NDArray[np.int64], table: str
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The slot of every occurrence in ``ids`` (-1: not admitted) as a training step looks them up,
        and the slots given to new ids (see :meth:`find_or_insert`).

        Ids that hold a slot are found where they are; only the others, usually few once the
        table is warm, are sorted and offered for admission: that is :meth:`find_or_insert` of
        the sorted unique ids, without sorting them all.
        """
        self._expire_due()
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        slots = np.empty(ids.size, dtype=np.int64)
        _touch_kernel(self.index, self.keys, self.last_seen, self.frequency, ids, self.step, slots)
        missing = np.flatnonzero(slots < 0)
        if missing.size == 0:
            return slots, np.empty(0, dtype=np.int64)
        missing_ids = ids[missing]
        unique, inverse, counts = np.unique(missing_ids, return_inverse=True, return_counts=True)
        unique_slots, inserted = self.find_or_insert(unique, counts, table)
        slots[missing] = unique_slots[inverse]
        return slots, inserted

    def find_or_insert(
        self, ids: npt.NDArray[np.int64], counts: npt.NDArray[np.int64], table: str
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The slots of sorted, unique ``ids`` seen ``counts`` times in this step (-1: not admitted),
        and the slots given to new ids, whose rows and optimizer state the caller must reset.

        :raises TableFullError: if the eviction policy fails when full (``none``) and an admitted id finds no
            free slot.
        """
        self._expire_due()
        policy = self.policy
        self._reserve(self.num_used + ids.size)
        slots = np.empty(ids.size, dtype=np.int64)
        inserted = np.empty(ids.size, dtype=np.int64)
        kernel = _find_or_insert_kernel(self.eviction.score, self.eviction.when_full)
        result = kernel(
            self.index, self.keys, self.last_seen, self.frequency, self.sketch, self.counters,
            np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(counts, dtype=np.int64),
            self.step, self.seed, policy.min_count, policy.admit_probability, slots, inserted,
        )  # fmt: skip
        if result < 0:
            raise self.full_error(table, int(ids[-1 - result]))
        return slots, inserted[:result]

    def look_up(self, ids: torch.Tensor, training: bool, table: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The slot of each of ``ids`` (-1: none) on their device and, in training, the slots given to
        new ids (:meth:`touch_or_insert`); evaluation only finds (:meth:`find`)."""
        keys = ids.detach().to("cpu", torch.int64).numpy()
        if training:
            slots, inserted = self.touch_or_insert(keys, table)
        else:
            slots, inserted = self.find(keys), np.empty(0, dtype=np.int64)
        return torch.from_numpy(slots).to(ids.device), torch.from_numpy(inserted)

    @property
    def held_keys(self) -> npt.NDArray[np.int64] | torch.Tensor:
        """The id each slot holds, in the array the lookups keep current (a device tensor for an index on a GPU):
        what a half-precision row's rounding is keyed by."""
        return self.keys

    def keys_of(self, slots: torch.Tensor) -> npt.NDArray[np.int64]:
        """The ids that hold ``slots``."""
        keys: npt.NDArray[np.int64] = self.keys[slots.cpu().numpy()]
        return keys

    def full_error(self, table: str, key: int) -> TableFullError:
        return TableFullError(
            f"Table '{table}' is full: all {self.capacity:,} rows of this rank's shard hold ids and its eviction "
            f"is '{self.policy.eviction.name}', so id {key} finds no row; raise `capacity` or set `eviction` to a "
            "policy that makes room, such as lru."
        )

    def advance(self) -> None:
        self.step += 1

    def _index_size(self, num_entries: int) -> int:
        """The index for ``num_entries`` ids: doubling from 1024 entries up to the capacity's.

        An index sized for the capacity from the start spreads a young table's few ids over a
        large array, one cache line each; growing with the ids keeps them close. Its size never
        changes a slot, so it need not be saved.
        """
        full = max(int(np.ceil(self.capacity * ENTRIES_PER_SLOT)), 1)
        size = min(MIN_INDEX_SIZE, full)
        while size < full and size < num_entries * ENTRIES_PER_SLOT:
            size = min(2 * size, full)
        return size

    def _reserve(self, num_entries: int) -> None:
        """Grow the index, rehashing its ids, until ``num_entries`` ids fit it at most 80% full."""
        size = self._index_size(num_entries)
        if size > self.index.size:
            self.index = np.full(size, EMPTY, dtype=np.int32)
            _insert_all(self.index, self.keys, np.flatnonzero(self.last_seen >= 0))

    def _expire_due(self) -> None:
        """Under a policy that expires ids (``ttl``), free the expired slots once per step, before the step's
        first lookup: an id back after more than ``expires_after`` steps starts again from a fresh row."""
        lifetime = self.eviction.expires_after
        if lifetime is None or self._expired_at == self.step:
            return
        expired = np.flatnonzero((self.last_seen >= 0) & (self.step - self.last_seen > lifetime))
        _free_slots_kernel(self.index, self.keys, self.last_seen, expired)
        self.counters[0] -= expired.size
        self.counters[4] += expired.size
        self._expired_at = self.step

    def occupied(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """The used slots and their keys, by slot."""
        slots = np.flatnonzero(self.last_seen >= 0)
        return slots, self.keys[slots]

    def state_dict(self) -> dict[str, Any]:
        """Everything that decides future slots and admissions, to resume bit-exact on the same shard."""
        slots, keys = self.occupied()
        return {
            "capacity": self.capacity,
            "step": self.step,
            "slots": slots,
            "keys": keys,
            "last_seen": self.last_seen[slots],
            "frequency": self.frequency[slots],
            "sketch": self.sketch.copy(),
            "counters": self.counters.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the exact slots of ``state`` (a state of a shard with this capacity)."""
        self._place(state["slots"], state["keys"], state["last_seen"], state["frequency"])
        self.sketch[...] = state["sketch"]
        self.counters[:] = state["counters"]
        self.step = int(state["step"])
        self._expired_at = -1
        self._state_loaded()

    def load_keys(
        self,
        keys: npt.NDArray[np.int64],
        last_seen: npt.NDArray[np.int32],
        frequency: npt.NDArray[np.int32],
        step: int,
    ) -> npt.NDArray[np.int64]:
        """Take ``keys`` (sorted) into slots 0, 1, ... (resharding); return their slots."""
        slots = np.arange(keys.size, dtype=np.int64)
        self._place(slots, keys, last_seen, frequency)
        self.counters[:] = 0
        self.counters[0] = keys.size
        self.counters[1] = keys.size % max(self.capacity, 1)
        self.step = step
        self._expired_at = -1
        self._state_loaded()
        return slots

    def _state_loaded(self) -> None:
        """Called once a loaded state is in the arrays (the GPU map copies them to the device)."""

    def load_counts(self, sketch: npt.NDArray[np.int32], totals: npt.NDArray[np.int64] | None) -> None:
        """Take the occurrences counted in ``sketch`` (this shard's width) and, if given, the cumulative
        admitted, rejected, evicted and counted ``totals`` (resharding)."""
        self.sketch[...] = sketch
        if totals is not None:
            self.counters[2:] = totals

    def _place(
        self,
        slots: npt.NDArray[np.int64],
        keys: npt.NDArray[np.int64],
        last_seen: npt.NDArray[np.int32],
        frequency: npt.NDArray[np.int32],
    ) -> None:
        self.keys[:] = 0
        self.last_seen[:] = -1
        self.frequency[:] = 0
        self.index = np.full(self._index_size(slots.size), EMPTY, dtype=np.int32)
        self.keys[slots] = keys
        self.last_seen[slots] = last_seen
        self.frequency[slots] = frequency
        _insert_all(self.index, self.keys, np.ascontiguousarray(slots, dtype=np.int64))


@numba.njit(cache=True)
def _insert_all(index, keys, slots):  # type: ignore[no-untyped-def]
    for slot in slots:
        index[-1 - find(index, keys, keys[slot])] = slot


@numba.njit(cache=True)
def _resize_kernel(sketch, resized):  # type: ignore[no-untyped-def]
    width, new_width = np.int64(sketch.shape[1]), np.int64(resized.shape[1])
    for column in range(new_width):
        # The 32-bit hash prefixes that ``reduce_hash`` maps onto ``column``, and the old columns they came from.
        low = (column * 2**32 + new_width - 1) // new_width
        high = ((column + 1) * 2**32 + new_width - 1) // new_width - 1
        for row in range(sketch.shape[0]):
            count = np.int32(0)
            for old in range((low * width) >> 32, ((high * width) >> 32) + 1):
                count = max(count, sketch[row, old])
            resized[row, column] = count


def resize_sketch(sketch: npt.NDArray[np.int32], width: int) -> npt.NDArray[np.int32]:
    """``sketch`` with ``width`` columns, each the largest count of the old columns its ids hashed to.

    A column is picked by the top bits of the same hash whatever the width, so every id's new count
    is at least its old one: a count-min sketch may overcount, never undercount, and stays one when
    a checkpoint moves to shards of another capacity.
    """
    resized = np.zeros((sketch.shape[0], width), dtype=np.int32)
    if sketch.shape[1] > 0 and width > 0:
        _resize_kernel(np.ascontiguousarray(sketch, dtype=np.int32), resized)
    return resized
