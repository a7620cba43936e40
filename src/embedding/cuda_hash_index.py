"""The index of a hash table's shard on a CUDA device, next to the rows it maps ids to.

:class:`CudaHashIndex` is a :class:`~embedding.hash_index.HashIndex` whose arrays live on the
device, and which takes a step's ids all at once where the CPU index takes them one after the
other, yet comes to the same slots, admissions, evictions and counts: runs reproduce and resume
bit-exact, and a checkpoint moves between CPU and GPU unchanged. (HierarchicalKV inserts in
parallel too, but its slots depend on the threads' timing.) A training lookup:

1. takes the batch's unique ids and counts (torch, sorted), and finds them, one thread each: an
   id that holds a slot is marked used in this step and counted;
2. admits the absent ones: a seeded coin each, in parallel; the count-min sketch in order, by
   one thread, as each count sees those before it (only with ``min_count`` > 1);
3. gives the admitted ones, in id order, the free slots from the cursor on;
4. lets the rest evict, if the eviction policy evicts. Each ranks its 8 candidate slots by the
   policy's score (compiled into the kernel, one kernel per score), in parallel: taking a slot
   changes no other slot's score, so an id takes the best candidate that no id before it took.
   An id whose best candidate no other id ranks takes it at once; the few others are resolved
   in order by one thread;
5. writes the new ids into their slots and the index (compare-and-swap, one thread each; rebuilt
   whole when ids were evicted, since removing them from linear probing is sequential work).

The shared per-id steps (hashing, probing, counting, coins, ranking) are the CPU index's own
source (:mod:`embedding.hash_probing`). The base class's numpy arrays become a host copy: the
counters stay current there, the rest is brought back when a checkpoint, an export or a reshard
reads it, and loading a state writes it to the device. Without a GPU, numba's simulator
(``NUMBA_ENABLE_CUDASIM=1``) runs the same kernels on CPU tensors, which is how the tests run
them on machines without one.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from numba import cuda

from embedding.eviction import Score
from embedding.hash_index import SKETCH_DEPTH, HashIndex, HashPolicy
from embedding.hash_probing import (
    EMPTY,
    EVICTION_CANDIDATES,
    MAX_COUNT,
    coin,
    count_occurrences,
    find,
    home,
    rank_candidates,
)
from embedding.kernels.cuda import as_device_array, stream_of

_THREADS_PER_BLOCK = 256


@cuda.jit
def _find_kernel(index, keys, ids, slots):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < ids.size:
        position = find(index, keys, ids[i])
        slots[i] = index[position] if position >= 0 else -1


@cuda.jit
def _touch_kernel(index, keys, last_seen, frequency, ids, counts, step, slots):  # type: ignore[no-untyped-def]
    """Find unique ``ids``; a found slot is marked as used in ``step`` and counted ``counts`` times more."""
    i = cuda.grid(1)
    if i < ids.size:
        position = find(index, keys, ids[i])
        if position < 0:
            slots[i] = -1
        else:
            slot = index[position]
            last_seen[slot] = step
            frequency[slot] = min(np.int64(frequency[slot]) + counts[i], np.int64(MAX_COUNT))
            slots[i] = slot


@cuda.jit
def _count_kernel(sketch, counters, ids, counts, min_count, admitted):  # type: ignore[no-untyped-def]
    """Count the occurrences of ``ids`` without a row, in order (each count sees those before it)."""
    if cuda.grid(1) == 0:
        for i in range(ids.size):
            admitted[i] = count_occurrences(sketch, counters, ids[i], counts[i]) >= min_count


@cuda.jit
def _coin_kernel(ids, step, seed, probability, admitted):  # type: ignore[no-untyped-def]
    i = cuda.grid(1)
    if i < ids.size and admitted[i]:
        admitted[i] = coin(ids[i], step, seed, probability)


@functools.cache
def _rank_kernel(score: Score) -> Any:
    """The kernel that ranks eviction candidates by ``score``, compiled once per eviction policy's score."""

    @cuda.jit
    def rank(keys, last_seen, frequency, ids, step, ranked):  # type: ignore[no-untyped-def]
        """Each id's eviction candidates, best first, -1 after the last."""
        i = cuda.grid(1)
        if i < ids.size:
            row = ranked[i]
            for j in range(rank_candidates(keys, last_seen, frequency, ids[i], step, score, row), row.size):
                row[j] = -1

    return rank


@cuda.jit
def _resolve_kernel(last_seen, ranked, contested, step, victims):  # type: ignore[no-untyped-def]
    """In order, give each id of ``contested`` its best candidate that no id before it took."""
    if cuda.grid(1) == 0:
        for c in range(contested.size):
            i = contested[c]
            for j in range(ranked.shape[1]):
                slot = ranked[i, j]
                if slot < 0:
                    break
                if last_seen[slot] != step:
                    victims[i] = slot
                    last_seen[slot] = step
                    break


@cuda.jit
def _enter_kernel(index, keys, slots):  # type: ignore[no-untyped-def]
    """Enter the ids of ``slots`` (absent) into the index, one thread each, claiming positions by compare-and-swap.

    The layout depends on the threads' timing, but no slot does: a slot is found wherever its id sits.
    """
    i = cuda.grid(1)
    if i < slots.size:
        slot = slots[i]
        size = index.size
        position = home(keys[slot], size)
        while cuda.atomic.cas(index, position, EMPTY, slot) != EMPTY:
            position = position + 1 if position + 1 < size else 0


class CudaHashIndex(HashIndex):
    """A :class:`HashIndex` on ``device`` (see the module's docstring)."""

    # The device arrays; the base class's numpy arrays of the same names are their host copy.
    _keys: torch.Tensor
    _last_seen: torch.Tensor
    _frequency: torch.Tensor
    _index: torch.Tensor
    _sketch: torch.Tensor
    _counters: torch.Tensor

    def __init__(
        self,
        capacity: int,
        policy: HashPolicy,
        seed: int = 0,
        sketch_width: int | None = None,
        device: torch.device | None = None,
    ) -> None:
        super().__init__(capacity, policy, seed, sketch_width)
        self.device = device if device is not None else torch.device("cuda")
        self._upload()

    @property
    def nbytes(self) -> int:
        arrays = (self._keys, self._last_seen, self._frequency, self._index)
        return sum(array.nbytes for array in arrays) + self.sketch.nbytes

    def look_up(self, ids: torch.Tensor, training: bool, table: str) -> tuple[torch.Tensor, torch.Tensor]:
        ids = ids.detach().to(self.device, torch.int64).contiguous()
        if not training:
            slots = torch.empty_like(ids)
            self._launch(_find_kernel, ids.numel(), self._index, self._keys, ids, slots)
            return slots, ids[:0]
        self._expire_due()
        unique, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
        unique_slots, inserted = self._find_or_insert(unique, counts, table)
        return unique_slots[inverse], inserted

    def find(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        return self.look_up(torch.from_numpy(ids), False, "")[0].cpu().numpy()

    def touch_or_insert(
        self, ids: npt.NDArray[np.int64], table: str
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        slots, inserted = self.look_up(torch.from_numpy(ids), True, table)
        return slots.cpu().numpy(), inserted.cpu().numpy()

    def find_or_insert(
        self, ids: npt.NDArray[np.int64], counts: npt.NDArray[np.int64], table: str
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        self._expire_due()
        slots, inserted = self._find_or_insert(self._to_device(ids), self._to_device(counts), table)
        return slots.cpu().numpy(), inserted.cpu().numpy()

    @property
    def held_keys(self) -> torch.Tensor:
        """The device's ids of the slots: the host copy lags behind, brought up to date only when a checkpoint, an
        export or a reshard reads it."""
        return self._keys

    def keys_of(self, slots: torch.Tensor) -> npt.NDArray[np.int64]:
        return self._keys[slots.to(self.device)].cpu().numpy()

    def occupied(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        self._download()
        return super().occupied()

    def state_dict(self) -> dict[str, Any]:
        self._download()
        return super().state_dict()

    def load_counts(self, sketch: npt.NDArray[np.int32], totals: npt.NDArray[np.int64] | None) -> None:
        self._download()
        super().load_counts(sketch, totals)
        self._upload()

    def _state_loaded(self) -> None:
        self._upload()

    def _find_or_insert(self, ids: torch.Tensor, counts: torch.Tensor, table: str) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`HashIndex.find_or_insert` of sorted, unique ``ids`` on the device: their slots, and those
        given to new ids, in the order of ``ids``."""
        self._reserve(self.num_used + ids.numel())
        slots = torch.empty_like(ids)
        self._launch(
            _touch_kernel, ids.numel(),
            self._index, self._keys, self._last_seen, self._frequency, ids, counts, self.step, slots,
        )  # fmt: skip
        self._host_current = False  # the found ids' last step and count changed
        missing = torch.nonzero(slots < 0).flatten()
        if missing.numel() == 0:
            return slots, ids[:0]
        missing_ids, missing_counts = ids[missing], counts[missing]
        evicted_before = int(self.counters[4])
        new_slots = self._give_slots(missing_ids, missing_counts, table)
        slots[missing] = new_slots
        given = torch.nonzero(new_slots >= 0).flatten()
        inserted = new_slots[given]
        self._keys[inserted] = missing_ids[given]
        self._last_seen[inserted] = self.step
        self._frequency[inserted] = missing_counts[given].clamp(max=MAX_COUNT).to(torch.int32)
        if self.counters[4] > evicted_before:
            self._rebuild_index()  # the evicted ids leave the index; rebuilt with the ids held now
        else:
            self._launch(_enter_kernel, inserted.numel(), self._index, self._keys, inserted)
        self.counters[2] += given.numel()
        self.counters[3] += missing.numel() - given.numel()
        return slots, inserted

    def _give_slots(self, ids: torch.Tensor, counts: torch.Tensor, table: str) -> torch.Tensor:
        """The slots that absent, sorted ``ids`` get (-1: none), as the CPU index would give them one after the
        other: admitted ids take the free slots from the cursor on, then evict, or find the shard full.

        The choices made one after the other in the CPU index depend on each other only in a few places, which
        are taken in order here too: the sketch's counts, and ids that compete for a victim.
        """
        policy = self.policy
        admitted = torch.ones(ids.numel(), dtype=torch.bool, device=self.device)
        if policy.min_count > 1:
            self._counters.copy_(torch.from_numpy(self.counters))
            self._launch(_count_kernel, 1, self._sketch, self._counters, ids, counts, policy.min_count, admitted)
            self.counters[5] = int(self._counters[5])
        if policy.admit_probability < 1.0:
            self._launch(_coin_kernel, ids.numel(), ids, self.step, self.seed, policy.admit_probability, admitted)
        slots = torch.full_like(ids, -1)
        waiting = torch.nonzero(admitted).flatten()

        num_free = min(self.capacity - self.num_used, waiting.numel())
        if num_free:
            free = torch.nonzero(self._last_seen < 0).flatten()
            first = int(torch.searchsorted(free, int(self.counters[1])))
            taken = torch.cat([free[first:], free[:first]])[:num_free]
            slots[waiting[:num_free]] = taken
            self._last_seen[taken] = self.step
            self.counters[0] += num_free
            self.counters[1] = (int(taken[-1]) + 1) % self.capacity
        waiting = waiting[num_free:]
        if waiting.numel() == 0 or self.eviction.when_full == "refuse":
            return slots
        if self.eviction.when_full == "error":
            raise self.full_error(table, int(ids[waiting[0]]))

        victims = self._victims(ids[waiting])
        slots[waiting] = victims
        self.counters[4] += int((victims >= 0).sum())
        return slots

    def _victims(self, ids: torch.Tensor) -> torch.Tensor:
        """The slot each of ``ids`` evicts (-1: none), as if they took them one after the other.

        Each id ranks its candidates (in parallel, by the scores as they stand: taking a slot changes no
        other slot's score). An id whose best candidate no other id ranks takes it; the others, few, are
        resolved in order by one thread, each taking its best candidate that no id before it took.
        """
        ranked = torch.empty((ids.numel(), EVICTION_CANDIDATES), dtype=torch.int64, device=self.device)
        assert self.eviction.score is not None  # a policy that evicts has a score
        rank = _rank_kernel(self.eviction.score)
        self._launch(rank, ids.numel(), self._keys, self._last_seen, self._frequency, ids, self.step, ranked)
        flat = ranked.flatten()
        listed = torch.nonzero(flat >= 0).flatten()
        _, which, times = torch.unique(flat[listed], return_inverse=True, return_counts=True)
        shared = torch.zeros_like(flat, dtype=torch.bool)
        shared[listed] = times[which] > 1
        best, best_shared = ranked[:, 0], shared.view(ranked.shape)[:, 0]
        victims = torch.where(best_shared, -1, best)
        contested = torch.nonzero(best_shared).flatten()
        self._launch(_resolve_kernel, min(contested.numel(), 1), self._last_seen, ranked, contested, self.step, victims)
        self._last_seen[victims[victims >= 0]] = self.step
        return victims

    def _rebuild_index(self) -> None:
        self._index.fill_(EMPTY)
        used = torch.nonzero(self._last_seen >= 0).flatten()
        self._launch(_enter_kernel, used.numel(), self._index, self._keys, used)

    def _reserve(self, num_entries: int) -> None:
        size = self._index_size(num_entries)
        if size > self._index.numel():
            self._index = torch.empty(size, dtype=torch.int32, device=self.device)
            self._rebuild_index()

    def _expire_due(self) -> None:
        lifetime = self.eviction.expires_after
        if lifetime is None or self._expired_at == self.step:
            return
        expired = torch.nonzero((self._last_seen >= 0) & (self.step - self._last_seen > lifetime)).flatten()
        if expired.numel():
            self._last_seen[expired] = -1
            self._rebuild_index()
            self.counters[0] -= expired.numel()
            self.counters[4] += expired.numel()
            self._host_current = False
        self._expired_at = self.step

    def _launch(self, kernel: Any, num_threads: int, *arguments: Any) -> None:
        """Run ``kernel`` with ``num_threads`` threads on torch's current stream (nothing for none)."""
        if num_threads == 0:
            return
        blocks = -(-num_threads // _THREADS_PER_BLOCK)
        threads = min(num_threads, _THREADS_PER_BLOCK)
        device_arguments = [as_device_array(a) if isinstance(a, torch.Tensor) else a for a in arguments]
        kernel[blocks, threads, stream_of(self._keys)](*device_arguments)

    def _to_device(self, array: npt.NDArray[Any]) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device, copy=True)

    def _upload(self) -> None:
        """Make the device arrays those of the host copy, entering the used slots into a fresh index."""
        self._keys = self._to_device(self.keys)
        self._last_seen = self._to_device(self.last_seen)
        self._frequency = self._to_device(self.frequency)
        self._counters = self._to_device(self.counters)
        # Without min_count the sketch has no columns; the kernels then never read it, but take a non-empty array.
        sketch = self.sketch if self.sketch.shape[1] > 0 else np.zeros((SKETCH_DEPTH, 1), dtype=np.int32)
        self._sketch = self._to_device(sketch)
        self._index = torch.full((self._index_size(self.num_used),), EMPTY, dtype=torch.int32, device=self.device)
        used = torch.nonzero(self._last_seen >= 0).flatten()
        self._launch(_enter_kernel, used.numel(), self._index, self._keys, used)
        self._host_current = True

    def _download(self) -> None:
        """Bring the host copy up to date with the device (the index layout stays on the device)."""
        if self._host_current:
            return
        self.keys[:] = self._keys.cpu().numpy()
        self.last_seen[:] = self._last_seen.cpu().numpy()
        self.frequency[:] = self._frequency.cpu().numpy()
        if self.sketch.shape[1] > 0:
            self.sketch[...] = self._sketch.cpu().numpy()
        self._host_current = True
