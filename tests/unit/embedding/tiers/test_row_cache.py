"""The cache of a tiered table: places, pins, overflow, eviction rules, write-back and records read ahead."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from embedding import EmbeddingTableConfig
from embedding.tiers import TableStorage
from embedding.tiers.row_cache import WAYS, TieredRows
from embedding.tiers.store_opener import FreshRecords
from embedding.tiers.stores import DamagedStoreError, DiskStore, HostStore

NUM_ROWS, DIM = 1000, 4


def cache(cache_rows: int, eviction: str = "lru") -> TieredRows:
    table = EmbeddingTableConfig("t", NUM_ROWS, DIM, ("x",))
    fresh = FreshRecords([table], [(0, NUM_ROWS)], [0], seed=1)
    storage = TableStorage("host", cache_rows=cache_rows, eviction=eviction)  # type: ignore[arg-type]
    tier = TieredRows(
        lambda width: HostStore(NUM_ROWS, width, fresh), fresh, storage, cache_rows, DIM, torch.device("cpu")
    )
    tier.set_optimizer_state({"sum": torch.zeros(tier.num_places)}, {"sum": 0.0})
    return tier


def rows(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_a_lookup_bigger_than_the_cache_gets_a_place_per_row_and_gives_the_overflow_back() -> None:
    tier = cache(WAYS)
    ids = torch.arange(300).repeat(2)

    places = tier.install(ids, training=True)

    assert torch.equal(places[:300], places[300:])  # a row looked up twice has one place
    assert places[:300].unique().numel() == 300
    tier.weight[places[:300]] += 1.0  # the step
    tier.release()
    assert tier.statistics["written_back"] == 300 - WAYS  # the overflow rows went back; the cached stay dirty
    tier.flush()
    fresh = np.empty((300, DIM + 1), dtype=np.float32)
    tier.fresh(np.arange(300), fresh)
    assert np.array_equal(tier.store.read(np.arange(300))[:, :DIM], fresh[:, :DIM] + np.float32(1.0))


@pytest.mark.parametrize(("eviction", "hot_rows_kept"), [("lru", False), ("lfu", True)])
def test_lfu_keeps_the_often_looked_up_rows_through_a_scan_and_lru_does_not(eviction: str, hot_rows_kept: bool) -> None:
    tier = cache(WAYS, eviction)  # one set: every row competes for the same places
    hot = rows(*range(WAYS // 2))
    for _ in range(5):
        places = tier.install(hot, training=False)
        tier.release([places.numpy()])
    for row in range(100, 100 + WAYS):  # a scan of rows looked up once, as many as the places
        places = tier.install(rows(row), training=False)
        tier.release([places.numpy()])
    hits = tier.statistics["hits"]

    tier.install(hot, training=False)

    assert (tier.statistics["hits"] - hits == hot.numel()) is hot_rows_kept


def test_evaluation_lookups_neither_pin_nor_dirty_rows() -> None:
    tier = cache(WAYS)
    places = tier.install(torch.arange(50), training=False)
    tier.release([places.numpy()])

    tier.install(torch.arange(50, 100), training=False)

    assert tier.statistics["written_back"] == 0
    assert tier.statistics["fetched"] == 100


def test_records_read_ahead_that_a_write_back_changed_are_read_again() -> None:
    tier = cache(WAYS)
    staged = tier.prefetch(rows(7))  # the fresh record of row 7, read ahead
    place = tier.install(rows(7), training=True)  # brought in (not from ``staged``), changed by a step
    tier.weight[place] = 42.0
    tier.release()
    tier.install(torch.arange(1000 - WAYS * 4, 1000), training=False)  # row 7 leaves: written back
    assert 7 not in tier._tags

    again = tier.install(rows(7), training=False, staged=staged)

    assert torch.equal(tier.weight[again], torch.full((1, DIM), 42.0))


@pytest.mark.parametrize("copies", ["compiled", "torch"])
def test_records_read_ahead_before_a_load_are_read_again(copies: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if copies == "torch":  # as on a GPU
        monkeypatch.setattr(TieredRows, "_host_views", lambda self: None)
    tier = cache(WAYS)
    staged = tier.prefetch(rows(7))  # the fresh record of row 7, read ahead
    tier.clear()  # a load: the store's rows are the checkpoint's from here on
    tier.store.write(np.array([7]), np.full((1, DIM + 1), 42.0, dtype=np.float32))

    place = tier.install(rows(7), training=False, staged=staged)

    assert torch.equal(tier.weight[place], torch.full((1, DIM), 42.0))


def test_a_disk_store_is_this_process_alone_and_refuses_another_table(tmp_path: Path) -> None:
    table = EmbeddingTableConfig("t", NUM_ROWS, DIM, ("x",))
    fresh = FreshRecords([table], [(0, NUM_ROWS)], [0], seed=1)
    path = str(tmp_path / "t.rows")
    store = DiskStore(path, "t", NUM_ROWS, DIM, fresh)

    with pytest.raises(DamagedStoreError, match="another process has it open"):
        DiskStore(path, "t", NUM_ROWS, DIM, fresh)
    del store
    with pytest.raises(DamagedStoreError, match="header differs"):
        DiskStore(path, "u", NUM_ROWS, DIM, fresh)
    with pytest.raises(DamagedStoreError, match="header differs"):
        DiskStore(path, "t", NUM_ROWS, DIM + 1, fresh)
    DiskStore(path, "t", NUM_ROWS, DIM, fresh)  # its own store, reused


def test_a_disk_store_holds_the_rows_written_densely_and_rewrites_them_in_place(tmp_path: Path) -> None:
    num_rows, width = 10_000_000, 8
    store = DiskStore(str(tmp_path / "t.rows"), "t", num_rows, width, lambda rows, out: out.fill(-1.0))
    scattered = np.array([9_999_999, 17, 4_000_003], dtype=np.int64)

    store.write(scattered, np.arange(24, dtype=np.float32).reshape(3, width))
    store.write(scattered[:1], np.full((1, width), 7.0, dtype=np.float32))  # again: in place
    allocated = os.stat(store.path).st_blocks * 512

    assert allocated < 1 << 20  # a 10,000,000-row store: a few pages of slots and one of records, not 3 rows' pages
    assert np.array_equal(store.read(scattered)[:, 0], [7.0, 8.0, 16.0])
    assert np.array_equal(store.read(np.array([5]))[0], np.full(width, -1.0))  # never written: fresh
    store.clear()
    store.write(np.array([5]), np.full((1, width), 3.0, dtype=np.float32))  # takes the first record again
    assert np.array_equal(store.read(np.array([5, 17]))[:, 0], [3.0, -1.0])
