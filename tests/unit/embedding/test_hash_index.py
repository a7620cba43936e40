"""The id -> slot map of a hash table's shard on its own: random sequences against a model of the map,
admission, eviction, expiry, determinism and its state."""

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pytest

from embedding.eviction import EvictionConfig, TtlConfig
from embedding.hash_index import HashIndex, HashPolicy, TableFullError, resize_sketch
from embedding.hash_probing import CANDIDATE_SALT, EVICTION_CANDIDATES

MASK = (1 << 64) - 1


def ids(*values: int) -> npt.NDArray[np.int64]:
    return np.array(values, dtype=np.int64)


def mix64(value: int) -> int:
    """splitmix64's finaliser, in Python integers."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & MASK
    return value ^ (value >> 31)


def sampled_slots(key: int, step: int, capacity: int) -> list[int]:
    """The slots the eviction for ``key`` in ``step`` samples, in order."""
    hash_value = mix64(mix64((key & MASK) ^ int(CANDIDATE_SALT)) ^ step)
    return [((mix64((hash_value + attempt) & MASK) >> 32) * capacity) >> 32 for attempt in range(EVICTION_CANDIDATES)]


def samples_every_slot(key: int, step: int, capacity: int) -> bool:
    """Whether the candidates of ``key`` hold every slot: then the victim is the exact minimum."""
    return set(sampled_slots(key, step, capacity)) == set(range(capacity))


@dataclass
class MapModel:
    """What an index must hold, in Python dicts: the slot, last step and count of looks of every resident key."""

    capacity: int
    policy: HashPolicy
    slot_of: dict[int, int] = field(default_factory=dict)
    last_seen: dict[int, int] = field(default_factory=dict)
    frequency: dict[int, int] = field(default_factory=dict)
    cursor: int = 0
    admitted: int = 0
    rejected: int = 0
    evicted: int = 0
    seen: set[int] = field(default_factory=set)
    expired_at: int = -1

    def expected_victim(self, key: int, step: int) -> int | None:
        """The key the eviction must take: the lowest (score, key) among the sampled slots not looked up in ``step``."""
        key_in = {slot: resident for resident, slot in self.slot_of.items()}
        best: tuple[int, int] | None = None
        for slot in sampled_slots(key, step, self.capacity):
            resident = key_in[slot]
            if self.last_seen[resident] == step:
                continue
            score = self.frequency[resident] if self.policy.eviction.name == "lfu" else self.last_seen[resident]
            if best is None or (score, resident) < best:
                best = (score, resident)
        return None if best is None else best[1]

    def check_touch(
        self,
        index: HashIndex,
        batch: npt.NDArray[np.int64],
        slots: npt.NDArray[np.int64],
        inserted: npt.NDArray[np.int64],
        step: int,
    ) -> None:
        """Check the answer of ``touch_or_insert(batch)`` in ``step`` and take it into the model."""
        self.seen.update(batch.tolist())
        slot_of_id: dict[int, int] = {}
        for key, slot in zip(batch.tolist(), slots.tolist()):
            assert slot_of_id.setdefault(key, slot) == slot, f"two occurrences of id {key} got different slots"
        self._expire(step)
        missing = sorted(key for key in slot_of_id if key not in self.slot_of)
        for key in slot_of_id:
            if key in self.slot_of:
                assert slot_of_id[key] == self.slot_of[key], f"resident id {key} moved"
        for key in batch.tolist():  # touches first: the looked-up residents are protected from eviction
            if key in self.slot_of:
                self.last_seen[key] = step
                self.frequency[key] += 1

        counts = {key: int(np.sum(batch == key)) for key in missing}
        expected_inserted = []
        for key in missing:
            slot = slot_of_id[key]
            if slot < 0:
                if self.policy.min_count == 1 and self.policy.admit_probability == 1.0:
                    assert len(self.slot_of) == self.capacity, f"id {key} was refused with free slots"
                    if self.policy.eviction.name in ("lru", "lfu"):
                        assert self.expected_victim(key, step) is None, f"id {key} was refused with a victim at hand"
                self.rejected += 1
                continue
            if len(self.slot_of) < self.capacity:
                expected_slot = self._next_free()
                assert slot == expected_slot, f"id {key} took slot {slot}, not the next free one {expected_slot}"
                self.cursor = (slot + 1) % self.capacity
            else:
                assert self.policy.eviction.name in ("lru", "lfu"), f"a full {self.policy.eviction} table evicted"
                holder = next(resident for resident, held in self.slot_of.items() if held == slot)
                assert self.last_seen[holder] != step, f"id {holder}, looked up in this step, was evicted"
                assert holder == self.expected_victim(key, step)
                self._remove(holder)
                self.evicted += 1
            self.slot_of[key], self.last_seen[key], self.frequency[key] = slot, step, counts[key]
            self.admitted += 1
            expected_inserted.append(slot)
        assert inserted.tolist() == expected_inserted
        self.check(index)

    def _expire(self, step: int) -> None:
        """Under ttl, free before a step's first lookup the residents not looked up in its last ttl_steps steps."""
        if not isinstance(self.policy.eviction, TtlConfig) or self.expired_at == step:
            return
        for key in [key for key, last in self.last_seen.items() if step - last > self.policy.eviction.ttl_steps]:
            self._remove(key)
            self.evicted += 1
        self.expired_at = step

    def _next_free(self) -> int:
        used = set(self.slot_of.values())
        candidates = ((self.cursor + k) % self.capacity for k in range(self.capacity))
        return next(slot for slot in candidates if slot not in used)

    def _remove(self, key: int) -> None:
        del self.slot_of[key], self.last_seen[key], self.frequency[key]

    def check(self, index: HashIndex) -> None:
        """The index holds exactly the model: every resident at its slot, no slot twice, the rest absent."""
        entries = index.index[index.index >= 0]
        assert entries.size == len(self.slot_of) == index.num_used
        assert np.unique(entries).size == entries.size, "two index entries hold one slot"
        assert {int(index.keys[slot]): int(slot) for slot in entries} == self.slot_of
        everyone = sorted(self.seen)
        assert index.find(ids(*everyone)).tolist() == [self.slot_of.get(key, -1) for key in everyone]
        slots, keys = index.occupied()
        assert sorted(zip(keys.tolist(), slots.tolist())) == sorted(self.slot_of.items())
        for key, slot in self.slot_of.items():
            assert index.last_seen[slot] == self.last_seen[key]
            assert index.frequency[slot] == self.frequency[key]
        assert index.statistics() == {
            "rows_used": float(len(self.slot_of)),
            "admitted": float(self.admitted),
            "rejected": float(self.rejected),
            "evicted": float(self.evicted),
        }


def random_batches(seed: int, num_steps: int, vocabulary: int) -> list[list[npt.NDArray[np.int64]]]:
    """Steps of one to three micro-batches of ids drawn from a skewed vocabulary of any int64 values."""
    rng = np.random.default_rng(seed)
    words = rng.integers(-(2**63), 2**63 - 1, size=vocabulary, dtype=np.int64, endpoint=True)
    weights = 1.0 / np.arange(1, vocabulary + 1)
    return [
        [
            words[rng.choice(vocabulary, size=int(rng.integers(0, 9)), p=weights / weights.sum())]
            for _ in range(int(rng.integers(1, 4)))
        ]
        for _ in range(num_steps)
    ]


@pytest.mark.parametrize(
    "policy",
    [
        HashPolicy(eviction=EvictionConfig("lru")),
        HashPolicy(eviction=EvictionConfig("lfu")),
        HashPolicy(eviction=TtlConfig(ttl_steps=2)),
        HashPolicy(eviction=EvictionConfig("lru"), min_count=2),
        HashPolicy(eviction=EvictionConfig("lfu"), admit_probability=0.5),
        HashPolicy(eviction=TtlConfig(ttl_steps=1), min_count=2, admit_probability=0.7),
    ],
    ids=["lru", "lfu", "ttl", "lru-min_count", "lfu-probability", "ttl-both"],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_lookups_keep_the_index_equal_to_a_model_of_the_map(policy: HashPolicy, seed: int) -> None:
    # 12 slots for 40 ids in 15 index entries: long probe runs, and every eviction or expiry shifts some back.
    index, model = HashIndex(12, policy, seed=seed), MapModel(12, policy)
    for step, micro_batches in enumerate(random_batches(seed, num_steps=60, vocabulary=40)):
        for batch in micro_batches:
            slots, inserted = index.touch_or_insert(batch, "t")
            model.check_touch(index, batch, slots, inserted, step)
        index.advance()
    assert model.evicted > 10 and model.admitted > 20  # the sequence did exercise deletions


def test_find_changes_nothing_and_reports_absent_ids_as_minus_one() -> None:
    index = HashIndex(4, HashPolicy())
    index.touch_or_insert(ids(5, -5), "t")
    before = {name: array.copy() for name, array in arrays(index).items()}
    assert index.find(ids(-5, 6, 5, 6)).tolist() == [0, -1, 1, -1]  # new ids take slots in id order
    assert all(np.array_equal(array, before[name]) for name, array in arrays(index).items())


def test_occurrences_of_one_id_in_a_batch_share_its_slot_and_count_its_frequency() -> None:
    index = HashIndex(4, HashPolicy())
    slots, inserted = index.touch_or_insert(ids(9, 3, 9, 9), "t")
    assert slots.tolist() == [1, 0, 1, 1] and inserted.tolist() == [0, 1]  # new ids go to slots in id order
    index.touch_or_insert(ids(9, 9), "t")
    assert index.frequency[1] == 5 and index.frequency[0] == 1


# Admission.


def test_min_count_admits_an_id_at_its_min_count_th_occurrence_across_steps() -> None:
    index = HashIndex(8, HashPolicy(min_count=3))
    for step in range(2):
        slots, inserted = index.touch_or_insert(ids(42), "t")
        assert slots.tolist() == [-1] and inserted.size == 0, f"admitted at occurrence {step + 1}"
        index.advance()
    slots, inserted = index.touch_or_insert(ids(42), "t")
    assert slots.tolist() == [0] and inserted.tolist() == [0]
    assert index.statistics() == {"rows_used": 1.0, "admitted": 1.0, "rejected": 2.0, "evicted": 0.0}


def test_min_count_counts_occurrences_within_a_step_and_its_micro_batches() -> None:
    index = HashIndex(8, HashPolicy(min_count=3))
    assert index.touch_or_insert(ids(7, 7, 7, 8), "t")[0].tolist() == [0, 0, 0, -1]  # 3 occurrences at once
    assert index.touch_or_insert(ids(8), "t")[0].tolist() == [-1]  # 2nd occurrence of 8, same step
    assert index.touch_or_insert(ids(8, 9), "t")[0].tolist() == [1, -1]  # 3rd: admitted
    assert index.find(ids(7, 8, 9)).tolist() == [0, 1, -1]


def test_min_count_keeps_counting_an_evicted_id_which_then_comes_back_at_once() -> None:
    index = HashIndex(1, HashPolicy(min_count=2, eviction=EvictionConfig("lru")))
    index.touch_or_insert(ids(1, 1), "t")
    index.advance()
    index.touch_or_insert(ids(2, 2), "t")  # evicts 1
    index.advance()
    assert index.find(ids(1)).tolist() == [-1]
    assert index.touch_or_insert(ids(1), "t")[0].tolist() == [0]  # counted twice already


def test_min_count_still_filters_ids_seen_once_after_a_long_stream_of_them() -> None:
    """The sketch ages its counts: after 100 steps of 500 fresh ids each (50 times its width), ids seen once
    must still be mostly refused, and ids seen twice in a step still admitted."""
    index = HashIndex(100_000, HashPolicy(min_count=2), sketch_width=1024)
    rng = np.random.default_rng(0)
    for _ in range(100):
        once, twice = rng.integers(-(2**62), 2**62, 500), rng.integers(-(2**62), 2**62, 20)
        slots = index.touch_or_insert(np.concatenate([once, twice, twice]), "t")[0]
        index.advance()
    assert float(np.mean(slots[:500] >= 0)) < 0.2
    assert bool(np.all(slots[500:] >= 0))


def test_the_index_grows_with_the_ids_it_holds_and_keeps_finding_them() -> None:
    index = HashIndex(100_000, HashPolicy())
    assert index.index.size == 1024
    rng = np.random.default_rng(3)
    held, slots, sizes = np.empty(0, np.int64), np.empty(0, np.int64), []
    for _ in range(8):
        fresh = rng.integers(-(2**62), 2**62, 3000)
        slots = np.concatenate([slots, index.touch_or_insert(fresh, "t")[0]])
        index.advance()
        held = np.concatenate([held, fresh])
        assert np.array_equal(index.find(held), slots)  # every id still where it was put
        assert sorted(slots.tolist()) == list(range(held.size))
        assert np.sum(index.index >= 0) == held.size <= 0.8 * index.index.size
        sizes.append(index.index.size)
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1] <= 125_000


def test_admit_probability_admits_about_that_fraction_of_fresh_ids() -> None:
    index = HashIndex(20_000, HashPolicy(admit_probability=0.3), seed=5)
    slots, inserted = index.touch_or_insert(np.arange(-10_000, 10_000, dtype=np.int64) * 7919, "t")
    fraction = float(np.mean(slots >= 0))
    assert 0.28 < fraction < 0.32
    assert inserted.size == index.num_used == int(np.sum(slots >= 0))
    assert index.statistics()["rejected"] == float(np.sum(slots < 0))


def coin_decisions(seed: int, step: int, order: npt.NDArray[np.int64] | None = None) -> npt.NDArray[np.bool_]:
    """Which of the ids 0..999, offered in ``order`` to a fresh index with admit_probability 0.5, are admitted."""
    order = np.arange(1000, dtype=np.int64) if order is None else order
    index = HashIndex(1000, HashPolicy(admit_probability=0.5), seed=seed)
    index.step = step
    slots, _ = index.touch_or_insert(order, "t")
    admitted = np.zeros(1000, dtype=bool)
    admitted[order] = slots >= 0
    return admitted


def test_admit_probability_decides_by_id_step_and_seed_alone() -> None:
    reference = coin_decisions(seed=1, step=3)
    assert np.array_equal(coin_decisions(seed=1, step=3, order=np.arange(999, -1, -1)), reference)  # not by order
    assert not np.array_equal(coin_decisions(seed=1, step=4), reference)  # a new coin every step
    assert not np.array_equal(coin_decisions(seed=2, step=3), reference)  # and every seed


def test_another_seed_does_not_replay_the_coins_of_other_steps() -> None:
    """The coin hashes ``step ^ seed``: seed 1 at step 0 flips exactly the coins of seed 0 at step 1, so runs
    with seeds 0 and 1 admit the same ids, a step apart; any seed s at step t replays seed 0 at step s ^ t."""
    for seed, step in ((1, 0), (2, 5), (6, 3)):
        assert not np.array_equal(coin_decisions(seed=seed, step=step), coin_decisions(seed=0, step=seed ^ step))


def test_an_id_refused_by_its_coin_stays_refused_in_later_micro_batches_of_the_step() -> None:
    index = HashIndex(100, HashPolicy(admit_probability=0.5))
    slots, _ = index.touch_or_insert(np.arange(40, dtype=np.int64), "t")
    refused = np.flatnonzero(slots < 0).astype(np.int64)
    assert 0 < refused.size < 40
    assert np.all(index.touch_or_insert(refused, "t")[0] < 0)
    index.advance()
    assert np.any(index.touch_or_insert(refused, "t")[0] >= 0)  # the next step flips again


# Eviction.


def fill_two_slots(policy: HashPolicy) -> HashIndex:
    """Slot 0: id 10, looked up 3 times in step 0; slot 1: id 20, once in step 1. Now in step 2."""
    index = HashIndex(2, policy)
    index.touch_or_insert(ids(10, 10, 10), "t")
    index.advance()
    index.touch_or_insert(ids(20), "t")
    index.advance()
    return index


def test_lru_evicts_the_least_recently_looked_up_slot() -> None:
    index = fill_two_slots(HashPolicy(eviction=EvictionConfig("lru")))
    new_id = next(key for key in range(100, 200) if samples_every_slot(key, 2, 2))
    slots, inserted = index.touch_or_insert(ids(new_id), "t")
    assert slots.tolist() == [0] and inserted.tolist() == [0]  # id 10's slot: seen in step 0, not 1
    assert index.find(ids(10, 20)).tolist() == [-1, 1]
    assert index.statistics()["evicted"] == 1.0


def test_lfu_evicts_the_least_often_looked_up_slot() -> None:
    index = fill_two_slots(HashPolicy(eviction=EvictionConfig("lfu")))
    new_id = next(key for key in range(100, 200) if samples_every_slot(key, 2, 2))
    slots, _ = index.touch_or_insert(ids(new_id), "t")
    assert slots.tolist() == [1]  # id 20's slot: once, against 3 times for id 10, though more recent
    assert index.find(ids(10, 20)).tolist() == [0, -1]
    assert index.frequency[1] == 1  # the new id's own count, not id 20's


@pytest.mark.parametrize("eviction", ["lru", "lfu"])
def test_ids_looked_up_in_the_current_step_are_never_evicted(eviction: str) -> None:
    index = HashIndex(4, HashPolicy(eviction=EvictionConfig(eviction)))
    index.touch_or_insert(ids(1, 2, 3, 4), "t")
    index.advance()
    for step, new_id in enumerate(range(100, 110)):
        kept = [key for key in (1, 2, 3, 4) if key != 1 + step % 4]
        index.touch_or_insert(ids(*kept), "t")  # earlier micro-batch of the step
        (open_slot,) = set(range(4)) - set(index.find(ids(*kept)).tolist())
        slots, _ = index.touch_or_insert(ids(new_id), "t")
        assert index.find(ids(*kept)).min() >= 0, f"step {step}: a protected id was evicted"
        # The one slot open to eviction, if sampled; else no row in this step.
        assert slots[0] == (open_slot if open_slot in sampled_slots(new_id, index.step, 4) else -1)
        index.touch_or_insert(ids(1 + step % 4), "t")  # the only one open to eviction comes back
        index.advance()


def test_a_full_table_whose_slots_were_all_looked_up_in_this_step_refuses_new_ids() -> None:
    index = HashIndex(3, HashPolicy(eviction=EvictionConfig("lru")))
    index.touch_or_insert(ids(1, 2, 3), "t")
    slots, inserted = index.touch_or_insert(ids(4, 5), "t")
    assert slots.tolist() == [-1, -1] and inserted.size == 0
    assert index.statistics() == {"rows_used": 3.0, "admitted": 3.0, "rejected": 2.0, "evicted": 0.0}


def test_lru_victims_of_a_large_table_are_among_its_oldest_slots() -> None:
    capacity = 64
    index = HashIndex(capacity, HashPolicy(eviction=EvictionConfig("lru")))
    for key in range(capacity):  # id k takes slot k in step k
        index.touch_or_insert(ids(key), "t")
        index.advance()
    victims = []
    for new_id in range(1000, 1016):
        victims.append(int(index.touch_or_insert(ids(new_id), "t")[0][0]))
        index.advance()
    # The exact order would evict slots 0..15 (mean 7.5), a random choice slots of mean 31.5.
    assert float(np.mean(victims)) < 20


# Expiry, and tables that do not evict.


def test_ttl_frees_ids_not_looked_up_for_more_than_ttl_steps() -> None:
    index = HashIndex(4, HashPolicy(eviction=TtlConfig(ttl_steps=2)))
    index.touch_or_insert(ids(1, 2), "t")  # step 0
    index.advance()
    index.touch_or_insert(ids(2), "t")  # step 1
    index.advance()
    index.touch_or_insert(ids(3), "t")  # step 2: id 1 idle for 2 steps, kept
    assert index.find(ids(1, 2, 3)).tolist() == [0, 1, 2]
    index.advance()
    assert index.touch_or_insert(ids(4), "t")[1].tolist() == [3]  # step 3: id 1 idle for 3 steps, freed
    assert index.find(ids(1, 2, 3, 4)).tolist() == [-1, 1, 2, 3]
    assert index.statistics() == {"rows_used": 3.0, "admitted": 4.0, "rejected": 0.0, "evicted": 1.0}
    index.advance()
    index.advance()
    index.touch_or_insert(ids(5), "t")  # step 5: ids 2 and 3 idle for 4 and 3 steps
    assert index.find(ids(2, 3, 4, 5)).tolist() == [-1, -1, 3, 0]  # the cursor wrapped onto the freed slot 0
    assert index.statistics()["evicted"] == 3.0 and index.num_used == 2


def test_a_full_ttl_table_refuses_new_ids_until_some_expire() -> None:
    index = HashIndex(2, HashPolicy(eviction=TtlConfig(ttl_steps=1)))
    index.touch_or_insert(ids(1, 2), "t")
    index.advance()
    slots, inserted = index.touch_or_insert(ids(3), "t")  # step 1: both idle for 1 step only
    assert slots.tolist() == [-1] and inserted.size == 0
    assert index.find(ids(1, 2)).tolist() == [0, 1]
    index.advance()
    # Step 2: neither was looked up in step 1, so both are freed before the step's first lookup, whatever
    # the step looks up; id 2 comes back to a fresh row, on the slot the cursor reaches first.
    slots, inserted = index.touch_or_insert(ids(2), "t")
    assert slots.tolist() == [0] and inserted.tolist() == [0]
    slots, inserted = index.touch_or_insert(ids(3), "t")
    assert slots.tolist() == [1] and inserted.tolist() == [1]
    assert index.statistics() == {"rows_used": 2.0, "admitted": 4.0, "rejected": 1.0, "evicted": 2.0}


def test_ttl_expiry_of_an_id_does_not_depend_on_unrelated_new_ids() -> None:
    """Both indexes leave id 7 idle for steps 1 and 2 (ttl 1): it must be freed, its row to start anew at step 3.

    Expiry runs before a step's first lookup, whether or not the step brings new ids.
    """
    outcomes = []
    for unrelated in ([], [8]):
        index = HashIndex(4, HashPolicy(eviction=TtlConfig(ttl_steps=1)))
        index.touch_or_insert(ids(7), "t")
        index.advance()
        index.advance()
        index.touch_or_insert(ids(*unrelated), "t")
        index.advance()
        inserted = index.touch_or_insert(ids(7), "t")[1]
        outcomes.append((inserted.size, index.statistics()["evicted"]))
    assert outcomes == [(1, 1.0), (1, 1.0)], f"(rows given to id 7, ids expired) without and with id 8: {outcomes}"


def test_touch_or_insert_expires_like_find_or_insert() -> None:
    """``touch_or_insert`` is ``find_or_insert`` of the unique ids: under ttl, both expire before looking up."""
    answers = []
    for touch in (True, False):
        index = HashIndex(4, HashPolicy(eviction=TtlConfig(ttl_steps=1)))
        index.touch_or_insert(ids(7), "t")
        index.advance()
        index.advance()  # step 2: id 7 idle for 2 steps
        if touch:
            slots, inserted = index.touch_or_insert(ids(7, 9), "t")
        else:
            slots, inserted = index.find_or_insert(ids(7, 9), np.ones(2, dtype=np.int64), "t")
        answers.append((slots.tolist(), inserted.tolist(), index.statistics()))
    assert answers[0] == answers[1]


def test_eviction_none_raises_table_full_naming_the_table_and_its_capacity() -> None:
    index = HashIndex(3, HashPolicy(eviction=EvictionConfig("none")))
    index.touch_or_insert(ids(1, 2, 3), "t")
    index.advance()
    assert index.touch_or_insert(ids(3, 2, 1), "t")[0].tolist() == [2, 1, 0]  # residents are still found
    with pytest.raises(TableFullError, match=r"Table 'clicks' is full: all 3 rows .* id 4 finds no row"):
        index.touch_or_insert(ids(1, 4), "clicks")


def test_eviction_none_refuses_ids_short_of_min_count_without_raising() -> None:
    index = HashIndex(1, HashPolicy(eviction=EvictionConfig("none"), min_count=2))
    index.touch_or_insert(ids(1, 1), "t")
    assert index.touch_or_insert(ids(2), "t")[0].tolist() == [-1]  # not admitted: no slot needed
    with pytest.raises(TableFullError, match="all 1 rows"):
        index.touch_or_insert(ids(2), "t")


def test_large_capacities_print_with_thousands_separators() -> None:
    index = HashIndex(1200, HashPolicy(eviction=EvictionConfig("none")))
    index.touch_or_insert(np.arange(1200, dtype=np.int64), "big")
    with pytest.raises(TableFullError, match="all 1,200 rows"):
        index.touch_or_insert(ids(-1), "big")


# Determinism and state.

POLICY = HashPolicy(eviction=EvictionConfig("lru"), min_count=2, admit_probability=0.7)


def feed(index: HashIndex, steps: list[list[npt.NDArray[np.int64]]]) -> list[tuple[list[int], list[int]]]:
    answers = []
    for micro_batches in steps:
        for batch in micro_batches:
            slots, inserted = index.touch_or_insert(batch, "t")
            answers.append((slots.tolist(), inserted.tolist()))
        index.advance()
    return answers


def arrays(index: HashIndex) -> dict[str, npt.NDArray[np.generic]]:
    return {
        "keys": index.keys,
        "last_seen": index.last_seen,
        "frequency": index.frequency,
        "index": index.index,
        "sketch": index.sketch,
        "counters": index.counters,
    }


def assert_same_slots(first: HashIndex, second: HashIndex) -> None:
    """The same ids in the same slots, counts and sketch (the index layout may differ)."""
    (slots, keys), (other_slots, other_keys) = first.occupied(), second.occupied()
    assert np.array_equal(slots, other_slots) and np.array_equal(keys, other_keys)
    for name in ("last_seen", "frequency", "sketch", "counters"):
        assert np.array_equal(getattr(first, name), getattr(second, name)), name
    assert first.step == second.step


def test_two_indexes_fed_the_same_lookups_end_identical() -> None:
    steps = random_batches(3, num_steps=40, vocabulary=50)
    first, second = HashIndex(10, POLICY, seed=4), HashIndex(10, POLICY, seed=4)
    assert feed(first, steps) == feed(second, steps)
    for name, array in arrays(first).items():
        assert np.array_equal(array, arrays(second)[name]), name
    assert first.statistics()["evicted"] > 0 and first.statistics()["rejected"] > 0


def test_state_dict_loaded_into_a_fresh_index_continues_identically() -> None:
    steps = random_batches(4, num_steps=50, vocabulary=50)
    original = HashIndex(10, POLICY, seed=4)
    feed(original, steps[:25])
    restored = HashIndex(10, POLICY, seed=4)
    restored.load_state_dict(original.state_dict())
    assert_same_slots(restored, original)
    everyone = np.unique(np.concatenate([batch for step in steps for batch in step]))
    assert np.array_equal(restored.find(everyone), original.find(everyone))
    assert feed(restored, steps[25:]) == feed(original, steps[25:])
    assert_same_slots(restored, original)


def test_state_dict_is_a_snapshot_that_later_lookups_do_not_change() -> None:
    steps = random_batches(5, num_steps=30, vocabulary=50)
    original = HashIndex(10, POLICY, seed=4)
    feed(original, steps[:15])
    state = original.state_dict()
    saved = {key: np.copy(value) for key, value in state.items()}
    feed(original, steps[15:])  # a checkpoint taken here, written later, must still be the step-15 state
    for key, value in saved.items():
        assert np.array_equal(state[key], value), f"state_dict()['{key}'] changed after it was taken"


@pytest.mark.parametrize("width", [3, 1000, 8192, 20_000])
def test_a_resized_sketch_never_counts_an_id_fewer_times(width: int) -> None:
    """Admission after a reshard must not forget occurrences: a count-min sketch may only overcount."""
    rng = np.random.default_rng(0)
    keys, counts = rng.integers(-(2**62), 2**62, 2000), rng.integers(1, 5, 2000)
    counted = HashIndex(10_000, HashPolicy(min_count=50), sketch_width=8192)  # wide enough not to age
    for key, count in zip(keys.tolist(), counts.tolist()):
        counted.find_or_insert(ids(key), ids(count), "t")  # all short of min_count: counted, never admitted
    resized = HashIndex(10_000, HashPolicy(min_count=50), sketch_width=width)
    resized.sketch[...] = resize_sketch(counted.sketch, width)
    before, after = np.zeros(2000, np.int64), np.zeros(2000, np.int64)
    for i, key in enumerate(keys.tolist()):  # a count of 0 reads the estimate without adding to it
        before[i] = _estimate(counted, key)
        after[i] = _estimate(resized, key)
    assert np.all(before >= counts) and np.all(after >= counts)
    if width == 8192:
        assert np.array_equal(after, before)


def _estimate(index: HashIndex, key: int) -> int:
    from embedding.hash_probing import sketch_add

    with np.errstate(over="ignore"):  # plain Python here: numpy warns of the hash's intended wrap-around
        return int(sketch_add(index.sketch, np.int64(key), np.int64(0)))


def test_load_keys_places_sorted_keys_in_the_first_slots_and_resets_the_counts() -> None:
    index = HashIndex(4, HashPolicy(eviction=EvictionConfig("lru")))
    index.touch_or_insert(ids(50, 60, 70), "t")
    slots = index.load_keys(ids(-3, 8, 2**63 - 1), np.array([5, 2, 4], dtype=np.int32), np.ones(3, np.int32), step=6)
    assert slots.tolist() == [0, 1, 2]
    assert index.find(ids(-3, 8, 2**63 - 1, 50, 60, 70)).tolist() == [0, 1, 2, -1, -1, -1]
    assert index.step == 6
    assert index.statistics() == {"rows_used": 3.0, "admitted": 0.0, "rejected": 0.0, "evicted": 0.0}
    assert index.touch_or_insert(ids(9), "t")[0].tolist() == [3]  # the next free slot
    index.advance()
    new_id = next(key for key in range(100, 300) if samples_every_slot(key, 7, 4))
    assert index.touch_or_insert(ids(new_id), "t")[0].tolist() == [1]  # id 8, last seen in step 2, goes first
    assert index.find(ids(8)).tolist() == [-1]
