"""Find-or-insert throughput of a hash table's index (``HashIndex.touch_or_insert``) against a Python dict.

The ids are Zipf(1.1) ranks (numpy zipf, fixed seed) spread over the whole int64 range by
splitmix64 (a bijection of 64-bit words, so distinct ranks stay distinct ids). For each size N
(1,000,000 and 10,000,000 by default) the index of ``capacity = N + N // 100`` slots, eviction
lru, is pre-filled with the ids of ranks 1..N (``load_keys``, all last seen at step 0), then
warm-up batches run until every slot is used, so that the measured batches run the table full:
each absent id evicts one. A batch is 4096 x 26 ids, one call of ``touch_or_insert`` (the
training path: a find per occurrence, then the absent ids sorted, deduplicated and inserted),
then ``advance`` (untimed), as the optimizer's step does.

The baseline is a Python dict doing the same mapping on one thread: pre-filled with the same N
ids (id -> slot 0..N-1), each batch's ids mapped by ``setdefault(id, len(d))``, so that a new id
gets the next slot number. It never evicts (it grows by the batches' new ids). Its time counts
the conversions that give it the same input and output as the index (an int64 array in,
``tolist``; a slot array out, ``np.array``); its loop alone is shown too. Both sides see the
same batches and take turns batch by batch (the first of the two alternating), and the table
gives medians and interquartile ranges over the measured batches. Each batch is then looked up
once more, in the next step, by both: every id is resident then (an id looked up in a step is
never evicted in it), and the caches hold the batch, which times the find path alone.

Bytes per resident key: the index's per-slot arrays (keys, last_seen, frequency) and its
open-addressing array of slot numbers, over the ids it holds once full (the operating load
factor: every slot used, the addressing array ``1 / ENTRIES_PER_SLOT`` full); the count-min sketch that
a table with ``min_count > 1`` adds is given apart. The rows themselves (dim x 4 bytes, and
their optimizer state) are not counted.

Then the steps of ``touch_or_insert`` are timed one by one on more batches (``--profile``
batches): the find of every occurrence, the sort of the absent ids, and their admission and
insertion (with eviction).

The kernels are serial numba functions (no ``prange``), so numba's thread count does not
matter to them; the script still sets it to 1.

    python benchmarks/hash_table.py [--sizes 1000000 10000000] [--batches 20] [--warmup 3] [--profile 5]

The last line reads ``speedup_1M=X speedup_10M=Y bytes_per_key=Z`` (speed-ups over the dict
with its conversions, bytes at the largest size, sketch excluded).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Iterator

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".numba_cache"))

import numba
import numpy as np
import numpy.typing as npt

from embedding import hash_index
from embedding.eviction import EvictionConfig
from embedding.hash_index import HashIndex, HashPolicy

BATCH_IDS = 4096 * 26
ZIPF_A = 1.1
TABLE = "bench"

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)


def spread(ranks: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Ranks mapped over the whole int64 range by splitmix64 (a bijection)."""
    value = ranks.astype(np.uint64) * _GOLDEN
    value ^= value >> np.uint64(30)
    value *= _MIX_1
    value ^= value >> np.uint64(27)
    value *= _MIX_2
    value ^= value >> np.uint64(31)
    return value.view(np.int64)


def zipf_batches(seed: int) -> Iterator[npt.NDArray[np.int64]]:
    rng = np.random.default_rng(seed)
    while True:
        yield spread(rng.zipf(ZIPF_A, size=BATCH_IDS))


class DictMap:
    """The baseline: a dict from id to slot, a new id taking the next slot number."""

    def __init__(self, keys: npt.NDArray[np.int64]) -> None:
        self.slots: dict[int, int] = dict(zip(keys.tolist(), range(keys.size)))
        self.loop_seconds = 0.0
        """Time of the last call's loop alone, without the conversions."""

    def map(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        keys = ids.tolist()
        slots = self.slots
        setdefault = slots.setdefault
        start = time.perf_counter()
        found = [setdefault(key, len(slots)) for key in keys]
        self.loop_seconds = time.perf_counter() - start
        return np.array(found, dtype=np.int64)

    def bytes_per_key(self) -> float:
        """The dict's table and its int objects (keys, and slots above 256), per key."""
        some = list(self.slots.items())[-1000:]
        key_bytes = statistics.fmean(sys.getsizeof(key) for key, _ in some)
        slot_bytes = statistics.fmean(sys.getsizeof(slot) for _, slot in some)
        return sys.getsizeof(self.slots) / len(self.slots) + key_bytes + slot_bytes


def index_bytes(index: HashIndex) -> int:
    return index.keys.nbytes + index.last_seen.nbytes + index.frequency.nbytes + index.index.nbytes


def profile_batch(index: HashIndex, ids: npt.NDArray[np.int64]) -> tuple[float, float, float, int, int]:
    """``touch_or_insert``'s steps on ``ids``, timed one by one (the same calls as that method):
    seconds to find every occurrence, to sort the absent ones, to admit and insert them; and the
    numbers of absent occurrences and of inserted ids."""
    start = time.perf_counter()
    slots = np.empty(ids.size, dtype=np.int64)
    hash_index._touch_kernel(index.index, index.keys, index.last_seen, index.frequency, ids, index.step, slots)
    found = time.perf_counter()
    missing = np.flatnonzero(slots < 0)
    unique, inverse, counts = np.unique(ids[missing], return_inverse=True, return_counts=True)
    sorted_ = time.perf_counter()
    unique_slots, inserted = index.find_or_insert(unique, counts, TABLE)
    slots[missing] = unique_slots[inverse]
    done = time.perf_counter()
    index.advance()
    return found - start, sorted_ - found, done - sorted_, missing.size, inserted.size


def quartiles(values: list[float]) -> tuple[float, float, float]:
    low, _, high = statistics.quantiles(values, n=4)
    return low, statistics.median(values), high


def run_size(size: int, batches: int, warmup: int, profile: int) -> dict[str, float]:
    capacity = size + size // 100
    keys = spread(np.arange(1, size + 1, dtype=np.int64))
    keys.sort()
    index = HashIndex(capacity, HashPolicy(eviction=EvictionConfig("lru")))
    start = time.perf_counter()
    index.load_keys(keys, np.zeros(size, dtype=np.int32), np.ones(size, dtype=np.int32), step=0)
    fill_index = time.perf_counter() - start
    index.advance()
    start = time.perf_counter()
    baseline = DictMap(keys)
    fill_dict = time.perf_counter() - start
    del keys
    print(
        f"\n{size:,} resident ids, capacity {capacity:,}: pre-filled in {fill_index:.2f} s (index), "
        f"{fill_dict:.2f} s (dict)"
    )

    # Warm up (numba's first calls, the caches) until the table is full, so that every measured
    # insertion evicts; the dict sees the same batches.
    stream = zipf_batches(seed=size)
    warm = 0
    while warm < warmup or (index.num_used < capacity and warm < 200):
        ids = next(stream)
        index.touch_or_insert(ids, TABLE)
        index.advance()
        baseline.map(ids)
        warm += 1
    evicted_before = index.statistics()["evicted"]

    ours: list[float] = []
    theirs: list[float] = []
    loops: list[float] = []
    ours_again: list[float] = []
    theirs_again: list[float] = []
    inserted_total = 0
    for turn in range(batches):
        ids = next(stream)
        # The new batch, then the same batch again in the next step: every id is then resident
        # (none is evicted in the step that looks it up), which times the find alone.
        for times_ours, times_dict in ((ours, theirs), (ours_again, theirs_again)):
            for side in ("ours", "dict") if turn % 2 == 0 else ("dict", "ours"):
                if side == "ours":
                    start = time.perf_counter()
                    _, inserted = index.touch_or_insert(ids, TABLE)
                    times_ours.append(time.perf_counter() - start)
                    index.advance()
                    inserted_total += inserted.size
                else:
                    start = time.perf_counter()
                    baseline.map(ids)
                    times_dict.append(time.perf_counter() - start)
                    if times_dict is theirs:
                        loops.append(baseline.loop_seconds)
    evicted = index.statistics()["evicted"] - evicted_before

    phases: list[tuple[float, float, float, int, int]] = [profile_batch(index, next(stream)) for _ in range(profile)]

    per_key = index_bytes(index) / index.num_used
    sketch_index = HashIndex(capacity, HashPolicy(min_count=2, eviction=EvictionConfig("lru")))
    sketch_per_key = sketch_index.sketch.nbytes / index.num_used
    del sketch_index
    dict_per_key = baseline.bytes_per_key()

    print(
        f"warm-up: {warm} batches; then {batches} batches of {BATCH_IDS:,} ids, each followed by itself again, "
        f"the table full ({index.num_used:,} ids)"
    )
    print(
        f"per new batch: {inserted_total / batches:,.0f} ids inserted, {evicted / batches:,.0f} evicted "
        f"({inserted_total / batches / BATCH_IDS:.1%} of the ids)\n"
    )
    print("| side | median ms/batch | IQR ms | median M ids/s |")
    print("| --- | ---: | ---: | ---: |")
    rows = [
        ("HashIndex.touch_or_insert", ours),
        ("dict.setdefault (with tolist, np.array)", theirs),
        ("dict.setdefault (loop alone)", loops),
        ("same batch again: HashIndex.touch_or_insert", ours_again),
        ("same batch again: dict.setdefault (with tolist, np.array)", theirs_again),
    ]
    for name, seconds in rows:
        low, median, high = quartiles(seconds)
        print(f"| {name} | {median * 1e3:.2f} | {low * 1e3:.1f}-{high * 1e3:.1f} | {BATCH_IDS / median / 1e6:.2f} |")
    speedup = statistics.median(theirs) / statistics.median(ours)
    speedup_loop = statistics.median(loops) / statistics.median(ours)
    speedup_again = statistics.median(theirs_again) / statistics.median(ours_again)
    print(
        f"\nspeed-up over the dict: {speedup:.2f}x (over its loop alone: {speedup_loop:.2f}x); "
        f"the same batch again, every id resident: {speedup_again:.2f}x"
    )
    print(
        f"bytes per resident id: {per_key:.1f} (keys 8, last_seen 4, frequency 4 per slot, index "
        f"{index.index.nbytes / index.capacity:.2f} per slot, at {index.num_used / index.index.size:.0%} "
        "of the index); "
        f"count-min sketch with min_count > 1: {sketch_per_key:.1f} more; the dict: about {dict_per_key:.0f}"
    )
    if phases:
        find, sort, insert = (statistics.median(values) for values in list(zip(*phases))[:3])
        missing = statistics.median(p[3] for p in phases)
        inserted_ids = statistics.median(p[4] for p in phases)
        print(
            f"\ntouch_or_insert, step by step (median of {profile} batches): find every occurrence {find * 1e3:.2f} ms "
            f"({find / BATCH_IDS * 1e9:.0f} ns/id), sort {missing:,.0f} absent occurrences {sort * 1e3:.2f} ms, "
            f"admit and insert {inserted_ids:,.0f} ids (each evicting one) {insert * 1e3:.2f} ms "
            f"({insert / max(inserted_ids, 1) * 1e9:.0f} ns/insert)"
        )
    return {"speedup": speedup, "bytes_per_key": per_key}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile", type=int, default=5, help="batches timed step by step after the measurement")
    args = parser.parse_args()
    numba.set_num_threads(1)  # The kernels are serial anyway.

    print(f"command: {' '.join([sys.executable, *sys.argv])}")
    print(
        f"Zipf({ZIPF_A}) ids spread over int64, batches of {BATCH_IDS:,} ids, eviction lru, capacity = 1.01 x resident "
        f"ids, numba {numba.__version__} (serial kernels), one thread"
    )
    results = {size: run_size(size, args.batches, args.warmup, args.profile) for size in args.sizes}
    labels = " ".join(
        f"speedup_{size // 1_000_000}M={result['speedup']:.2f}"
        if size % 1_000_000 == 0
        else f"speedup_{size}={result['speedup']:.2f}"
        for size, result in results.items()
    )
    print(f"{labels} bytes_per_key={results[max(results)]['bytes_per_key']:.1f}")


if __name__ == "__main__":
    main()
