"""The per-id steps of a hash table's index that the CPU and the GPU index share.

Each function here is ``register_jitable``: the CPU index (:mod:`embedding.hash_index`, numba
njit, one id after the other) and the GPU index (:mod:`embedding.cuda_hash_index`, numba.cuda,
the ids of a step at once) compile the same source, so that both hash, count, flip coins and
rank eviction candidates alike, and assign the same slots to the same ids. Under numba's CUDA
simulator they run as plain Python. Candidates are ranked by the ``score`` of the table's eviction
policy (:mod:`embedding.eviction`), which the kernels pass on: each kernel is compiled for one score.

The arrays are those :class:`embedding.hash_index.HashIndex` describes: ``index`` (slot numbers,
linear probing, -1 empty), and per slot ``keys``, ``last_seen`` (-1: free) and ``frequency``;
a count-min ``sketch`` and the ``counters`` [num_used, cursor, admitted, rejected, evicted, counted].
"""

from __future__ import annotations

import numpy as np
from numba.extending import register_jitable

from embedding.id_hashing import mix64, reduce_hash

EMPTY = -1

EVICTION_CANDIDATES = 8
"""Slots sampled per eviction, as Redis samples its keys: more approximate the exact order better
and cost more reads. If all of them were looked up in the current step, the id gets no row in it."""
MAX_COUNT = 2**31 - 1

# Salts that make the hashes of one id for different purposes independent of each other.
INDEX_SALT = np.uint64(0x9E3779B97F4A7C15)
SKETCH_SALT = np.uint64(0xC2B2AE3D27D4EB4F)
COIN_SALT = np.uint64(0x165667B19E3779F9)
CANDIDATE_SALT = np.uint64(0xD6E8FEB86659FD93)


@register_jitable
def home(key, index_size):  # type: ignore[no-untyped-def]
    return reduce_hash(mix64(np.uint64(key) ^ INDEX_SALT), index_size)


@register_jitable
def find(index, keys, key):  # type: ignore[no-untyped-def]
    """The index position holding ``key``, or, if absent, minus one minus the empty position ending its probe."""
    size = index.size
    position = home(key, size)
    while True:
        slot = index[position]
        if slot == EMPTY:
            return -1 - position
        if keys[slot] == key:
            return position
        position += 1
        if position == size:
            position = 0


@register_jitable
def sketch_add(sketch, key, count):  # type: ignore[no-untyped-def]
    """Count ``count`` more occurrences of ``key`` (conservative update) and return its estimate."""
    width = sketch.shape[1]
    hash_value = mix64(np.uint64(key) ^ SKETCH_SALT)
    estimate = np.int64(2**62)
    for row in range(sketch.shape[0]):
        column = reduce_hash(mix64(hash_value + np.uint64(row)), width)
        estimate = min(estimate, np.int64(sketch[row, column]))
    estimate = min(estimate + count, np.int64(MAX_COUNT))
    for row in range(sketch.shape[0]):
        column = reduce_hash(mix64(hash_value + np.uint64(row)), width)
        if sketch[row, column] < estimate:
            sketch[row, column] = estimate
    return estimate


@register_jitable
def halve(sketch):  # type: ignore[no-untyped-def]
    """Age the counts, as TinyLFU does, once the sketch has counted as many occurrences as it has columns.

    Without it a long stream of rare ids fills every column past ``min_count`` and admits every id;
    halving at this rate admitted 7% of ids seen once against 100% of ids seen twice in a step
    (2 x 1024 columns, 500 ids seen once and 20 twice per step).
    """
    for row in range(sketch.shape[0]):
        for column in range(sketch.shape[1]):
            sketch[row, column] >>= 1


@register_jitable
def coin(key, step, seed, probability):  # type: ignore[no-untyped-def]
    # The step and the seed are mixed apart, so that no (seed, step) replays the coins of another pair.
    round_hash = mix64(mix64(np.uint64(seed) ^ COIN_SALT) + np.uint64(step))
    hash_value = mix64(mix64(np.uint64(key) ^ COIN_SALT) ^ round_hash)
    return (hash_value >> np.uint64(11)) * (1.0 / 9007199254740992.0) < probability


@register_jitable
def count_occurrences(sketch, counters, key, count):  # type: ignore[no-untyped-def]
    """Count ``count`` occurrences of an id without a row; return its estimated occurrences so far.

    The sketch halves once it has counted as many occurrences as it has columns (``counters[5]``).
    """
    estimate = sketch_add(sketch, key, count)
    counters[5] += count
    if counters[5] >= sketch.shape[1]:
        halve(sketch)
        counters[5] //= 2
    return estimate


@register_jitable
def best_candidate(keys, last_seen, frequency, key, step, score):  # type: ignore[no-untyped-def]
    """The slot to evict for ``key``: the first of :func:`rank_candidates`, found in one pass; -1 if none."""
    hash_value = _candidate_hash(key, step)
    best, best_score, best_key = -1, np.int64(0), np.int64(0)
    for attempt in range(EVICTION_CANDIDATES):
        slot = _candidate(hash_value, attempt, keys.size)
        if last_seen[slot] == step:
            continue
        slot_score = score(keys, last_seen, frequency, slot)
        if best < 0 or slot_score < best_score or (slot_score == best_score and keys[slot] < best_key):
            best, best_score, best_key = slot, slot_score, keys[slot]
    return best


@register_jitable
def rank_candidates(keys, last_seen, frequency, key, step, score, ranked):  # type: ignore[no-untyped-def]
    """Write into ``ranked`` the distinct slots sampled to make room for ``key`` that were not looked up in
    ``step``, the best victim first: the lowest (score, key), by the eviction policy's ``score`` (see
    :class:`embedding.eviction.EvictionSpec`). Return how many there are."""
    hash_value = _candidate_hash(key, step)
    count = 0
    for attempt in range(EVICTION_CANDIDATES):
        slot = _candidate(hash_value, attempt, keys.size)
        if last_seen[slot] == step:
            continue
        duplicate = False
        for j in range(count):
            duplicate = duplicate or ranked[j] == slot
        if duplicate:
            continue
        slot_score = score(keys, last_seen, frequency, slot)
        position = count
        while position > 0:
            other = ranked[position - 1]
            other_score = score(keys, last_seen, frequency, other)
            if other_score < slot_score or (other_score == slot_score and keys[other] < keys[slot]):
                break
            ranked[position] = other
            position -= 1
        ranked[position] = slot
        count += 1
    return count


@register_jitable
def _candidate_hash(key, step):  # type: ignore[no-untyped-def]
    return mix64(mix64(np.uint64(key) ^ CANDIDATE_SALT) ^ np.uint64(step))


@register_jitable
def _candidate(hash_value, attempt, capacity):  # type: ignore[no-untyped-def]
    return reduce_hash(mix64(hash_value + np.uint64(attempt)), capacity)
