"""Delta pieces: the rows changed since a full checkpoint, which put over it give the full tables bit for bit."""

import copy
from typing import Any

import pytest
import torch

from embedding import (
    EmbeddingTableConfig,
    EvictionConfig,
    HashPolicy,
    JaggedIds,
    ShardedEmbeddingCollection,
    ShardedStateError,
    SparseFeatures,
    SparseOptimizer,
    merge_delta,
)
from embedding.optimizers.adam import AdamConfig

FIXED = EmbeddingTableConfig("fixed", 1000, 4, ("f",))
HASH = EmbeddingTableConfig(
    "hashed", 64, 4, ("h",), kind="hash", hash_policy=HashPolicy(eviction=EvictionConfig("lru"))
)


def build(seed: int = 3) -> tuple[ShardedEmbeddingCollection, SparseOptimizer]:
    collection = ShardedEmbeddingCollection([FIXED, HASH], seed=seed)
    return collection, SparseOptimizer(collection, AdamConfig(lr=0.1))


def train(collection: ShardedEmbeddingCollection, optimizer: SparseOptimizer, steps: range, batch: int = 16) -> None:
    """Steps over few rows of the fixed table, and over more hash ids than the table has slots (so some are
    evicted, and their slots given to new ids)."""
    for step in steps:
        generator = torch.Generator().manual_seed(step)
        fixed = torch.randint(0, 20, (batch,), generator=generator)
        hashed = torch.randint(0, 200, (batch,), generator=generator)
        offsets = torch.arange(batch + 1)
        features = SparseFeatures({"f": JaggedIds(fixed, offsets), "h": JaggedIds(hashed, offsets)})
        outputs = collection(features)
        loss = sum(
            (output * torch.linspace(-1.0, 1.0, output.numel()).view_as(output)).sum() for output in outputs.values()
        )
        assert isinstance(loss, torch.Tensor)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def full_copy(collection: ShardedEmbeddingCollection) -> dict[str, Any]:
    return copy.deepcopy(collection.sharded_state_dict())


def assert_same(left: Any, right: Any) -> None:
    """Equal bit for bit: tensors by value and dtype, mappings by their keys."""
    if isinstance(left, torch.Tensor):
        assert isinstance(right, torch.Tensor) and left.dtype == right.dtype
        assert torch.equal(left, right)
    elif isinstance(left, dict):
        assert isinstance(right, dict) and left.keys() == right.keys()
        for key in left:
            assert_same(left[key], right[key])
    else:
        assert left == right


def test_a_delta_over_its_base_is_the_full_state_and_holds_only_the_changed_rows() -> None:
    collection, optimizer = build()
    train(collection, optimizer, range(10))  # the hash table full: the steps after evict ids
    collection.forget_changes()
    base = full_copy(collection)
    train(collection, optimizer, range(10, 14), batch=4)

    delta = copy.deepcopy(collection.delta_state_dict(base_step=10))
    fixed = delta["tables"]["fixed"]
    assert fixed["delta_of"] == 10 and 0 < fixed["row_ids"].numel() <= 20
    assert fixed["weight"].size(0) == fixed["row_ids"].numel()
    hashed = delta["tables"]["hashed"]
    assert hashed["weight"].size(0) == hashed["changed"].numel() <= 16 < hashed["index"]["keys"].numel()

    merged = merge_delta(delta, base, base_step=10)
    assert_same(merged, full_copy(collection))

    restored, _ = build(seed=99)  # another seed: every row must come from the pieces
    restored.load_sharded_state_dict([merged])
    assert_same(full_copy(restored), full_copy(collection))


def test_deltas_are_cumulative_and_after_a_load_every_table_is_saved_whole() -> None:
    collection, optimizer = build()
    collection.forget_changes()
    base = full_copy(collection)
    train(collection, optimizer, range(3))
    first = collection.delta_state_dict(base_step=0)["tables"]["fixed"]["row_ids"]
    train(collection, optimizer, range(3, 6))
    second = collection.delta_state_dict(base_step=0)["tables"]["fixed"]["row_ids"]
    assert set(first.tolist()) <= set(second.tolist())
    assert_same(merge_delta(collection.delta_state_dict(base_step=0), copy.deepcopy(base), 0), full_copy(collection))

    collection.load_sharded_state_dict([base])
    assert_same(collection.delta_state_dict(base_step=0)["tables"]["fixed"], full_copy(collection)["tables"]["fixed"])


def test_a_delta_is_refused_without_its_base_or_over_another() -> None:
    collection, optimizer = build()
    collection.forget_changes()
    base = full_copy(collection)
    train(collection, optimizer, range(2))
    delta = collection.delta_state_dict(base_step=4)
    with pytest.raises(ShardedStateError, match="must lie over the checkpoint of step 7, but lies over 4"):
        merge_delta(delta, base, base_step=7)
    with pytest.raises(ShardedStateError, match=r"must hold table '\w+' whole"):
        merge_delta(delta, {"tables": {}}, base_step=4)
    restored, _ = build()
    with pytest.raises(ShardedStateError, match=r"must be whole to be loaded, but is a delta over .* step 4"):
        restored.load_sharded_state_dict([delta])
