"""Eviction policies by name: one registered from outside the package, by decorator or by an installed package's
entry point, drives the CPU and the GPU index to the same slots by its own score, and resharding keeps the ids it
scores highest; a policy that gives up no id refuses to reshard into too few slots; a config that names an unknown
policy, is another policy's or has an option out of range is one line."""

import importlib.metadata
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from embedding import EmbeddingTableConfig, ShardedStateError
from embedding.cuda_hash_index import CudaHashIndex
from embedding.dynamic_state import hash_shard_state, load_hash_shard
from embedding.eviction import EVICTION_POLICIES, EvictionConfig, EvictionConfigError, EvictionSpec, TtlConfig
from embedding.hash_index import HashIndex, HashPolicy
from embedding.id_hashing import owner_ranks
from embedding.planner import row_wise
from embedding.sharding import TableShard, build_groups
from support.mru_eviction import mru
from unit.embedding.test_cuda_hash_index import DEVICE, assert_same_state, feed, random_steps
from unit.embedding.test_hash_index import ids, samples_every_slot

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


@pytest.fixture
def isolated_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry as it was before the test, afterwards: a policy registered in a test stays in it."""
    monkeypatch.setattr(EVICTION_POLICIES, "_components", dict(EVICTION_POLICIES._components))


@pytest.fixture
def by_decorator(isolated_policies: None) -> None:
    EVICTION_POLICIES.register("mru")(mru)


@pytest.fixture
def by_entry_point(isolated_policies: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``mru`` offered as an installed package offers it: imported when the name is first looked up."""
    point = importlib.metadata.EntryPoint("mru", "support.mru_eviction:MRU", EVICTION_POLICIES.entry_point_group)
    installed = importlib.metadata.entry_points

    def entry_points(group: str) -> object:
        return [point] if group == point.group else installed(group=group)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert "mru" not in EVICTION_POLICIES._components
    yield
    assert "mru" in EVICTION_POLICIES._components


@pytest.fixture(params=["by_decorator", "by_entry_point"])
def registered(request: pytest.FixtureRequest) -> None:
    request.getfixturevalue(request.param)


def fill_two_slots(index: HashIndex) -> HashIndex:
    """Slot 0: id 10, looked up in step 0; slot 1: id 20, in step 1. Now in step 2."""
    for key in (10, 20):
        index.touch_or_insert(ids(key), "t")
        index.advance()
    return index


@pytest.mark.usefixtures("registered")
def test_a_registered_policy_evicts_by_its_own_score_on_cpu_and_gpu() -> None:
    mru = HashPolicy(eviction=EvictionConfig("mru"))
    new_id = next(key for key in range(100, 200) if samples_every_slot(key, 2, 2))
    for index in (HashIndex(2, mru), CudaHashIndex(2, mru, device=DEVICE)):
        slots, inserted = fill_two_slots(index).touch_or_insert(ids(new_id), "t")
        assert slots.tolist() == [1] and inserted.tolist() == [1]  # id 20's: the most recent (lru takes id 10's)

    steps = random_steps(4, num_steps=30, vocabulary=40)
    cpu, gpu = HashIndex(12, mru, seed=2), CudaHashIndex(12, mru, seed=2, device=DEVICE)
    assert feed(gpu, steps) == feed(cpu, steps)
    assert_same_state(gpu, cpu)
    assert cpu.statistics()["evicted"] > 10


def hash_shards(policy: HashPolicy, capacity: int, world_size: int) -> list[TableShard]:
    table = EmbeddingTableConfig("t", capacity, 2, ("x",), kind="hash", hash_policy=policy)
    plan = {"t": row_wise(capacity, world_size)}
    cpu = torch.device("cpu")
    return [build_groups([table], plan, world_size, rank, 0, cpu)[0].shards[0] for rank in range(world_size)]


def saved_piece(policy: HashPolicy, keys: list[int]) -> dict[str, object]:
    """A one-rank checkpoint piece of ``keys``, the i-th looked up in step i."""
    (shard,) = hash_shards(policy, len(keys), 1)
    assert shard.dynamic is not None
    for key in keys:
        shard.dynamic.index.touch_or_insert(ids(key), "t")
        shard.dynamic.index.advance()
    return {"tables": {"t": hash_shard_state(shard)}}


@pytest.mark.usefixtures("registered")
def test_resharding_keeps_the_ids_the_policy_scores_highest() -> None:
    mru = HashPolicy(eviction=EvictionConfig("mru"))
    candidates = np.arange(1000, dtype=np.int64)
    owners = owner_ranks(candidates, 2)
    keys = [*candidates[owners == 0][:6].tolist(), *candidates[owners == 1][:2].tolist()]  # 6 ids for 4 slots
    piece = saved_piece(mru, keys)

    first, second = hash_shards(mru, 8, 2)
    for shard in (first, second):
        load_hash_shard(shard, [piece])
    assert first.dynamic is not None and second.dynamic is not None
    # The least recently looked-up four of rank 0's six (lru would keep the last four).
    assert first.dynamic.index.occupied()[1].tolist() == sorted(keys[:4])
    assert second.dynamic.index.occupied()[1].tolist() == sorted(keys[6:])


def test_a_policy_that_gives_up_no_id_refuses_to_reshard_into_too_few_slots() -> None:
    policy = HashPolicy(eviction=EvictionConfig("none"))
    piece = saved_piece(policy, list(range(8)))
    shards = hash_shards(policy, 8, 4)
    with pytest.raises(ShardedStateError, match=r"holds \d+ of them and its eviction is 'none', which gives up no id"):
        for shard in shards:
            load_hash_shard(shard, [piece])


@pytest.mark.usefixtures("by_decorator")
def test_an_unknown_policy_is_one_line_naming_the_known_ones_registered_ones_included() -> None:
    with pytest.raises(EvictionConfigError) as info:
        EvictionConfig("fifo")

    assert str(info.value) == "The eviction policy must be one of lfu, lru, mru, none, ttl, but is 'fifo' instead."


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("ttl", {}, "The config of eviction policy 'ttl' must be of class TtlConfig, but is of class EvictionConfig"),
        ("lru", {"ttl_steps": 3}, "policy 'lru' must be of class EvictionConfig, but is of class TtlConfig instead."),
        ("ttl", {"ttl_steps": 0}, "`ttl_steps` of eviction policy 'ttl' must be an integer >= 1, but is 0 instead."),
    ],
)
def test_another_policys_config_or_an_option_out_of_range_is_one_line(
    name: str, options: dict[str, int], message: str
) -> None:
    config_class = TtlConfig if options else EvictionConfig
    with pytest.raises(EvictionConfigError) as info:
        config_class(name=name, **options)

    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_policy_that_evicts_must_have_a_score() -> None:
    with pytest.raises(ValueError, match="`score` of a policy that evicts must be a register_jitable function"):
        EvictionSpec(when_full="evict")
