"""``dlrm_criteo_tiny`` on 2 ranks with its tables on disk behind caches of 16 rows: replicated, row-wise and hash
tables train to the same checkpoints, metrics and tables as on the device (GitHub issue 48)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.resume_helpers import check_ok
from support.tiered_runs import ON_DISK, assert_same_arithmetic, train


@pytest.mark.parametrize("placement", ["auto", "row_wise"])
def test_tables_on_disk_train_bit_identically_on_2_ranks(tmp_path: Path, placement: str) -> None:
    reference, on_disk = tmp_path / "device", tmp_path / "disk"
    placed = f"model.embeddings.placement={placement}"  # auto: the planner replicates these small tables
    check_ok(train(tmp_path, reference, placed, nproc=2))
    check_ok(train(tmp_path, on_disk, *ON_DISK, placed, nproc=2))

    assert sorted(path.name for path in (on_disk / "table_stores").iterdir()) == ["rank_0", "rank_1"]
    assert_same_arithmetic(tmp_path, reference, on_disk)


def test_hash_tables_on_disk_train_bit_identically_on_2_ranks(tmp_path: Path) -> None:
    reference, on_disk = tmp_path / "device", tmp_path / "disk"
    # 300 slots per table for about 1000 values a feature: ids are admitted, refused and evicted all through the run.
    dynamic = ("dataset.num_embeddings_per_feature=[300]",)
    check_ok(train(tmp_path, reference, *dynamic, nproc=2, preset="dlrm_criteo_tiny_dynamic"))
    check_ok(train(tmp_path, on_disk, *dynamic, *ON_DISK, nproc=2, preset="dlrm_criteo_tiny_dynamic"))

    assert_same_arithmetic(tmp_path, reference, on_disk)
