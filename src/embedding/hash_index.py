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
- a full shard evicts (``lru``: the least recently looked-up, ``lfu``: the least often) among
  candidate slots sampled from a hash of the id and the step, as Redis samples its keys: an
  approximation of the exact order that costs a few reads per insert instead of a heap. A slot
  looked up in the current step is never evicted, since its gradient is still to be applied;
- ``ttl`` frees, before a step's first lookup, the slots not looked up in the last ``ttl_steps``
  steps; a full shard then admits no more ids until some expire; ``none`` makes a full shard an
  error.

Slot, key and counters live in numpy arrays that a checkpoint saves as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import numba
import numpy as np
import numpy.typing as npt

from embedding.id_hashing import mix64, reduce_hash

EvictionPolicy = Literal["lru", "lfu", "ttl", "none"]
EVICTION_POLICIES: tuple[EvictionPolicy, ...] = get_args(EvictionPolicy)

ENTRIES_PER_SLOT = 1.25
"""Index entries per slot: the index is at most 80% full, where linear probing stays short."""

SKETCH_DEPTH = 2
MIN_INDEX_SIZE = 1024
EVICTION_CANDIDATES = 8
"""Slots sampled per eviction; more approximate the exact order better and cost more reads."""

_MAX_CANDIDATE_ROUNDS = 8
_EMPTY = -1
_LRU, _LFU, _TTL, _NONE = 0, 1, 2, 3

# Salts that make the hashes of one id for different purposes independent of each other.
_INDEX_SALT = np.uint64(0x9E3779B97F4A7C15)
_SKETCH_SALT = np.uint64(0xC2B2AE3D27D4EB4F)
_COIN_SALT = np.uint64(0x165667B19E3779F9)
_CANDIDATE_SALT = np.uint64(0xD6E8FEB86659FD93)


class TableFullError(RuntimeError):
    """Raised when a table with eviction ``none`` has no free slot for an admitted id."""


@numba.njit(cache=True)
def _home(key, index_size):  # type: ignore[no-untyped-def]
    return reduce_hash(mix64(np.uint64(key) ^ _INDEX_SALT), index_size)


@numba.njit(cache=True)
def _find(index, keys, key):  # type: ignore[no-untyped-def]
    """The index position holding ``key``, or, if absent, minus one minus the empty position ending its probe."""
    size = index.size
    position = _home(key, size)
    while True:
        slot = index[position]
        if slot == _EMPTY:
            return -1 - position
        if keys[slot] == key:
            return position
        position += 1
        if position == size:
            position = 0


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
        if slot == _EMPTY:
            break
        home = _home(keys[slot], size)
        # The entry at ``probe`` may move into the hole unless its home lies cyclically in (hole, probe].
        movable = (home <= hole or home > probe) if hole <= probe else (home <= hole and home > probe)
        if movable:
            index[hole] = slot
            hole = probe
    index[hole] = _EMPTY


@numba.njit(cache=True)
def _lookup_kernel(index, keys, ids, slots):  # type: ignore[no-untyped-def]
    for i in range(ids.size):
        position = _find(index, keys, ids[i])
        slots[i] = index[position] if position >= 0 else -1


@numba.njit(cache=True)
def _touch_kernel(index, keys, last_seen, frequency, ids, step, slots):  # type: ignore[no-untyped-def]
    """Find every occurrence of ``ids``; a found slot is marked as used in ``step`` and counted once more."""
    for i in range(ids.size):
        position = _find(index, keys, ids[i])
        if position < 0:
            slots[i] = -1
            continue
        slot = index[position]
        last_seen[slot] = step
        if frequency[slot] < 2**31 - 1:
            frequency[slot] += 1
        slots[i] = slot


@numba.njit(cache=True)
def _sketch_add(sketch, key, count):  # type: ignore[no-untyped-def]
    """Count ``count`` more occurrences of ``key`` (conservative update) and return its estimate."""
    width = sketch.shape[1]
    hash_value = mix64(np.uint64(key) ^ _SKETCH_SALT)
    estimate = np.int64(2**62)
    for row in range(sketch.shape[0]):
        column = reduce_hash(mix64(hash_value + np.uint64(row)), width)
        estimate = min(estimate, np.int64(sketch[row, column]))
    estimate = min(estimate + count, np.int64(2**31 - 1))
    for row in range(sketch.shape[0]):
        column = reduce_hash(mix64(hash_value + np.uint64(row)), width)
        if sketch[row, column] < estimate:
            sketch[row, column] = estimate
    return estimate


@numba.njit(cache=True)
def _halve(sketch):  # type: ignore[no-untyped-def]
    """Age the counts, as TinyLFU does, once the sketch has counted as many occurrences as it has columns.

    Without it a long stream of rare ids fills every column past ``min_count`` and admits every id;
    halving at this rate admitted 7% of ids seen once against 100% of ids seen twice in a step
    (2 x 1024 columns, 500 ids seen once and 20 twice per step).
    """
    for row in range(sketch.shape[0]):
        for column in range(sketch.shape[1]):
            sketch[row, column] >>= 1


@numba.njit(cache=True)
def _coin(key, step, seed, probability):  # type: ignore[no-untyped-def]
    # The step and the seed are mixed apart, so that no (seed, step) replays the coins of another pair.
    round_hash = mix64(mix64(np.uint64(seed) ^ _COIN_SALT) + np.uint64(step))
    hash_value = mix64(mix64(np.uint64(key) ^ _COIN_SALT) ^ round_hash)
    return (hash_value >> np.uint64(11)) * (1.0 / 9007199254740992.0) < probability


@numba.njit(cache=True)
def _victim(keys, last_seen, frequency, key, step, policy):  # type: ignore[no-untyped-def]
    """The slot to evict for ``key``: the lowest (score, key) among sampled slots not used this step, or -1."""
    capacity = keys.size
    hash_value = mix64(mix64(np.uint64(key) ^ _CANDIDATE_SALT) ^ np.uint64(step))
    best, best_score, best_key = -1, np.int64(0), np.int64(0)
    for attempt in range(EVICTION_CANDIDATES * _MAX_CANDIDATE_ROUNDS):
        if attempt % EVICTION_CANDIDATES == 0 and attempt > 0 and best >= 0:
            break
        slot = reduce_hash(mix64(hash_value + np.uint64(attempt)), capacity)
        if last_seen[slot] == step:
            continue
        score = np.int64(frequency[slot]) if policy == _LFU else np.int64(last_seen[slot])
        if best < 0 or score < best_score or (score == best_score and keys[slot] < best_key):
            best, best_score, best_key = slot, score, keys[slot]
    return best


@numba.njit(cache=True)
def _expire(index, keys, last_seen, step, ttl_steps):  # type: ignore[no-untyped-def]
    """Free the slots not looked up for more than ``ttl_steps`` steps; return how many."""
    expired = 0
    for slot in range(keys.size):
        if last_seen[slot] >= 0 and step - last_seen[slot] > ttl_steps:
            _delete(index, keys, _find(index, keys, keys[slot]))
            last_seen[slot] = -1
            expired += 1
    return expired


@numba.njit(cache=True)
def _find_or_insert_kernel(  # type: ignore[no-untyped-def]
    index, keys, last_seen, frequency, sketch, counters,
    ids, counts, step, seed, min_count, probability, policy, slots, inserted,
):  # fmt: skip
    """Map sorted, unique ``ids`` (seen ``counts`` times this step) to slots, inserting admitted ones.

    ``counters`` holds [num_used, cursor, admitted, rejected, evicted, counted]. Returns the number of
    slots written to ``inserted`` (to be initialised), or -1 - i if id ``i`` found the shard full
    under eviction ``none``.
    """
    capacity = keys.size
    num_inserted = 0
    for i in range(ids.size):
        key = ids[i]
        position = _find(index, keys, key)
        if position >= 0:
            slot = index[position]
            last_seen[slot] = step
            frequency[slot] = min(np.int64(frequency[slot]) + counts[i], np.int64(2**31 - 1))
            slots[i] = slot
            continue
        admitted = True
        if min_count > 1:
            admitted = _sketch_add(sketch, key, counts[i]) >= min_count
            counters[5] += counts[i]
            if counters[5] >= sketch.shape[1]:
                _halve(sketch)
                counters[5] //= 2
        if admitted and probability < 1.0 and not _coin(key, step, seed, probability):
            admitted = False
        slot = -1
        if admitted:
            if counters[0] < capacity:
                slot = counters[1]
                while last_seen[slot] >= 0:
                    slot = slot + 1 if slot + 1 < capacity else 0
                counters[1] = slot + 1 if slot + 1 < capacity else 0
                counters[0] += 1
            elif policy == _NONE:
                return -1 - i
            elif policy != _TTL:
                slot = _victim(keys, last_seen, frequency, key, step, policy)
                if slot >= 0:
                    _delete(index, keys, _find(index, keys, keys[slot]))
                    counters[4] += 1
        if slot < 0:
            counters[3] += 1
            slots[i] = -1
            continue
        keys[slot] = key
        last_seen[slot] = step
        frequency[slot] = min(counts[i], np.int64(2**31 - 1))
        index[-1 - _find(index, keys, key)] = slot
        counters[2] += 1
        slots[i] = slot
        inserted[num_inserted] = slot
        num_inserted += 1
    return num_inserted


@dataclass(frozen=True)
class HashPolicy:
    """How a hash table admits and evicts ids (see the module's docstring)."""

    min_count: int = 1
    admit_probability: float = 1.0
    eviction: EvictionPolicy = "lru"
    ttl_steps: int | None = None


class HashIndex:
    """The slots of one shard of a dynamic table, and the ids that hold them.

    ``step`` counts training steps; the optimizer advances it after applying a step's
    gradients (``advance``), so that everything looked up before an update counts as that
    step's, whatever the number of micro-batches.
    """

    def __init__(self, capacity: int, policy: HashPolicy, seed: int = 0, sketch_width: int | None = None) -> None:
        self.capacity = capacity
        self.policy = policy
        self.seed = seed
        self.keys = np.zeros(capacity, dtype=np.int64)
        self.last_seen = np.full(capacity, -1, dtype=np.int32)
        self.frequency = np.zeros(capacity, dtype=np.int32)
        self.index = np.full(self._index_size(0), _EMPTY, dtype=np.int32)
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

        :raises TableFullError: if eviction is ``none`` and an admitted id finds no free slot.
        """
        self._expire_due()
        policy = self.policy
        self._reserve(self.num_used + ids.size)
        slots = np.empty(ids.size, dtype=np.int64)
        inserted = np.empty(ids.size, dtype=np.int64)
        result = _find_or_insert_kernel(
            self.index, self.keys, self.last_seen, self.frequency, self.sketch, self.counters,
            np.ascontiguousarray(ids, dtype=np.int64), np.ascontiguousarray(counts, dtype=np.int64),
            self.step, self.seed, policy.min_count, policy.admit_probability,
            EVICTION_POLICIES.index(policy.eviction), slots, inserted,
        )  # fmt: skip
        if result < 0:
            raise TableFullError(
                f"Table '{table}' is full: all {self.capacity:,} rows of this rank's shard hold ids and its eviction "
                f"is 'none', so id {int(ids[-1 - result])} finds no row; raise `capacity` or set `eviction` to "
                "lru, lfu or ttl."
            )
        return slots, inserted[:result]

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
            self.index = np.full(size, _EMPTY, dtype=np.int32)
            _insert_all(self.index, self.keys, np.flatnonzero(self.last_seen >= 0))

    def _expire_due(self) -> None:
        """Under ``ttl``, free the expired slots once per step, before the step's first lookup: an id back
        after more than ``ttl_steps`` steps starts again from a fresh row."""
        ttl_steps = self.policy.ttl_steps
        if self.policy.eviction != "ttl" or self._expired_at == self.step:
            return
        assert ttl_steps is not None
        freed = _expire(self.index, self.keys, self.last_seen, self.step, ttl_steps)
        self.counters[0] -= freed
        self.counters[4] += freed
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
        return slots

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
        self.index = np.full(self._index_size(slots.size), _EMPTY, dtype=np.int32)
        self.keys[slots] = keys
        self.last_seen[slots] = last_seen
        self.frequency[slots] = frequency
        _insert_all(self.index, self.keys, np.ascontiguousarray(slots, dtype=np.int64))


@numba.njit(cache=True)
def _insert_all(index, keys, slots):  # type: ignore[no-untyped-def]
    for slot in slots:
        index[-1 - _find(index, keys, keys[slot])] = slot


@numba.njit(cache=True)
def _resize_kernel(sketch, resized):  # type: ignore[no-untyped-def]
    width, new_width = np.int64(sketch.shape[1]), np.int64(resized.shape[1])
    for column in range(new_width):
        # The 32-bit hash prefixes that ``_reduce`` maps onto ``column``, and the old columns they came from.
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
