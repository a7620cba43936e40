"""Records read ahead on a thread while write-backs land on another train to exactly the tables on the device."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from embedding import ShardedEmbeddingCollection, SparseOptimizer
from embedding.optimizers import sparse_optimizer_config
from embedding.tiers import TableStorage
from embedding.tiers.row_cache import TieredRows

from .test_tiered_tables import batches, tables, train, train_step, whole_tables


def train_prefetching(storage: TableStorage, tmp_path: Path, num_steps: int = 12) -> dict[str, torch.Tensor]:
    """As ``train``, each next batch prepared (its missing records read) on a thread while the step runs."""
    collection = ShardedEmbeddingCollection(
        tables(storage), seed=5, optimizer=sparse_optimizer_config("rowwise_adagrad", lr=0.1), storage_dir=str(tmp_path)
    )
    sparse = SparseOptimizer(collection)
    steps = batches(num_steps)
    with ThreadPoolExecutor(1) as ahead:
        features = collection.prepare_ahead(steps[0], collection.gang)
        for step in range(num_steps):
            following = (
                ahead.submit(collection.prepare_ahead, steps[step + 1], collection.gang)
                if step + 1 < num_steps
                else None
            )
            train_step(collection, sparse, features)
            if following is not None:
                features = following.result()
    return whole_tables(collection)


@pytest.mark.parametrize(
    "storage", [TableStorage("disk", cache_rows=16), TableStorage("disk", cache_rows=200, eviction="lfu")]
)
@pytest.mark.parametrize("copies", ["compiled", "torch"])
def test_prefetching_tiered_tables_train_bit_identically_to_the_device(
    storage: TableStorage, copies: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if copies == "torch":  # as on a GPU: the records copied in and out by torch's indexed copies
        monkeypatch.setattr(TieredRows, "_host_views", lambda self: None)
    on_device = train(TableStorage(), "rowwise_adagrad", tmp_path / "device")
    tiered = train_prefetching(storage, tmp_path / "tiered")
    assert on_device.keys() == tiered.keys()
    for key in on_device:
        assert torch.equal(on_device[key], tiered[key]), key
