"""Tables on host or disk train to exactly the tables on the device, whatever the cache size."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from embedding import (
    EVICTION_POLICIES,
    EmbeddingTableConfig,
    HashPolicy,
    ShardedEmbeddingCollection,
    SparseFeatures,
    SparseOptimizer,
    merge_delta,
)
from embedding.optimizers import sparse_optimizer_config
from embedding.tiers import TableStorage
from support.jagged_ids import jagged
from support.resume_helpers import assert_bitwise_equal

NUM_ROWS = 500


def tables(storage: TableStorage) -> list[EmbeddingTableConfig]:
    return [
        EmbeddingTableConfig("a", NUM_ROWS, 4, ("x", "y"), storage=storage),
        EmbeddingTableConfig("b", 60, 4, ("z",), pooling="mean", initializer="normal", storage=storage),
    ]


def batches(num_steps: int, batch: int = 32) -> list[SparseFeatures]:
    generator = torch.Generator().manual_seed(3)
    out = []
    for _ in range(num_steps):
        lengths = torch.randint(0, 4, (batch,), generator=generator)
        hot = torch.randint(0, 40, (int(lengths.sum()),), generator=generator)
        cold = torch.randint(0, NUM_ROWS, (int(lengths.sum()),), generator=generator)
        ids = torch.where(torch.rand(hot.shape, generator=generator) < 0.6, hot, cold)
        z = torch.randint(0, 60, (batch,), generator=generator)
        out.append(
            SparseFeatures(
                {
                    "x": jagged(ids.tolist(), lengths.tolist()),
                    "y": jagged(torch.randint(0, NUM_ROWS, (batch,), generator=generator).tolist(), [1] * batch),
                    "z": jagged(z.tolist(), [1] * batch),
                }
            )
        )
    return out


def train(
    storage: TableStorage, optimizer: str, tmp_path: Path, num_steps: int = 12, ahead: str | None = None
) -> dict[str, torch.Tensor]:
    """The tables (and state) after ``num_steps`` steps, read back through a checkpoint piece; ``ahead``: each
    step's rows read ahead as a train pipeline on a CPU (``prepare``) or a GPU (``read``) does."""
    collection = ShardedEmbeddingCollection(
        tables(storage), seed=5, optimizer=sparse_optimizer_config(optimizer, lr=0.1), storage_dir=str(tmp_path)
    )
    sparse = SparseOptimizer(collection)
    for features in batches(num_steps):
        if ahead is not None:
            assert collection.reads_ahead == storage.tiered
        if ahead == "prepare":
            features = collection.prepare_ahead(features, collection.gang)
        elif ahead == "read":
            features = collection.read_ahead(features)
        train_step(collection, sparse, features)
    if ahead is not None:
        (tier,) = [group.tier for group in collection.groups if group.tier is not None]
        assert tier.statistics["read_ahead"] > 0
    return whole_tables(collection)


@pytest.mark.parametrize("ahead", ["prepare", "read"])
def test_rows_read_ahead_train_bit_identically(ahead: str, tmp_path: Path) -> None:
    on_device = train(TableStorage(), "adam", tmp_path / "device")
    tiered = train(TableStorage("disk", cache_rows=16), "adam", tmp_path / "tiered", ahead=ahead)

    for key in on_device:
        assert torch.equal(on_device[key], tiered[key]), key


def train_step(collection: ShardedEmbeddingCollection, sparse: SparseOptimizer, features: SparseFeatures) -> None:
    """One step of a squared loss on the pooled rows: forward, backward, the fused update."""
    sparse.zero_grad()
    outputs = collection(features)
    head = torch.linspace(-1, 1, 4)
    sum(((out * head).sum(1) - 0.3).square().sum() for out in outputs.values()).backward()
    sparse.step()


def whole_tables(collection: ShardedEmbeddingCollection) -> dict[str, torch.Tensor]:
    """Every row and state of every table, loaded from this collection's pieces into tables on the device."""
    device_twin = ShardedEmbeddingCollection(tables(TableStorage()), seed=99, optimizer=collection.optimizer)
    SparseOptimizer(device_twin)
    device_twin.load_sharded_state_dict([collection.sharded_state_dict()])
    out = {}
    for name, shard in device_twin.shards.items():
        out[name] = shard.weight.clone()
        out.update({f"{name}.{key}": value.clone() for key, value in shard.optimizer_state.items()})
    return out


@pytest.mark.parametrize("optimizer", ["rowwise_adagrad", "adam", "sgd"])
@pytest.mark.parametrize(
    "storage",
    [
        TableStorage("host", cache_rows=16),
        TableStorage("disk", cache_rows=16, eviction="lfu"),
        TableStorage("disk", cache_rows=200),
    ],
    ids=["host-16-lru", "disk-16-lfu", "disk-200-lru"],
)
def test_tiered_tables_train_bit_identically_to_the_device(
    storage: TableStorage, optimizer: str, tmp_path: Path
) -> None:
    on_device = train(TableStorage(), optimizer, tmp_path / "device")
    tiered = train(storage, optimizer, tmp_path / "tiered")
    assert on_device.keys() == tiered.keys()
    for key in on_device:
        assert torch.equal(on_device[key], tiered[key]), key


def hash_tables(storage: TableStorage) -> list[EmbeddingTableConfig]:
    policy = HashPolicy(min_count=2, eviction=EVICTION_POLICIES.default("lru")())
    return [EmbeddingTableConfig("h", 64, 4, ("x", "y", "z"), kind="hash", hash_policy=policy, storage=storage)]


def train_hash(storage: TableStorage, tmp_path: Path, num_steps: int = 12) -> dict[str, Any]:
    """A hash table of 64 slots for a few hundred ids (ids admitted, refused and evicted all along), trained and
    saved."""
    collection = ShardedEmbeddingCollection(
        hash_tables(storage), seed=5, optimizer=sparse_optimizer_config("adam", lr=0.1), storage_dir=str(tmp_path)
    )
    sparse = SparseOptimizer(collection)
    for features in batches(num_steps):
        train_step(collection, sparse, features)
    return collection.sharded_state_dict()


@pytest.mark.parametrize(
    "storage", [TableStorage("host", cache_rows=4), TableStorage("disk", cache_rows=16, eviction="lfu")]
)
def test_tiered_hash_tables_train_and_save_bit_identically_to_the_device(storage: TableStorage, tmp_path: Path) -> None:
    on_device = train_hash(TableStorage(), tmp_path / "device")
    tiered = train_hash(storage, tmp_path / "tiered")

    assert on_device["tables"]["h"]["index"]["counters"][-1] > 0  # ids were evicted
    assert_bitwise_equal(on_device, tiered)

    reloaded = ShardedEmbeddingCollection(hash_tables(storage), seed=5, storage_dir=str(tmp_path / "reloaded"))
    SparseOptimizer(reloaded, sparse_optimizer_config("adam", lr=0.1))
    reloaded.load_sharded_state_dict([tiered])
    assert_bitwise_equal(reloaded.sharded_state_dict(), on_device)


def test_a_tiered_delta_over_its_base_is_the_full_state(tmp_path: Path) -> None:
    storage = TableStorage("disk", cache_rows=16)
    collection = ShardedEmbeddingCollection(
        [tables(storage)[0], replace(hash_tables(storage)[0], features=("z",))],
        seed=5,
        optimizer=sparse_optimizer_config("adam", lr=0.1),
        storage_dir=str(tmp_path),
    )
    sparse = SparseOptimizer(collection)
    steps = batches(16)
    for step, features in enumerate(steps):
        if step == 15:  # a full checkpoint, then a step
            base = copy.deepcopy(collection.sharded_state_dict())
            collection.forget_changes()
        train_step(collection, sparse, features)

    delta = copy.deepcopy(collection.delta_state_dict(base_step=15))
    assert {name: piece.get("delta_of") for name, piece in delta["tables"].items()} == {"a": 15, "h": 15}
    assert delta["tables"]["a"]["row_ids"].numel() < base["tables"]["a"]["row_ids"].numel()
    assert_bitwise_equal(merge_delta(delta, base, 15), collection.sharded_state_dict())
