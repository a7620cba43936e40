"""The start-up memory check counts a table on disk by its cache: its rows are in the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from embedding import EmbeddingTableConfig, ShardedEmbeddingCollection
from embedding.memory import TableMemoryError
from embedding.tiers import TableStorage

ROWS = 10**12
"""Far more rows of dim 64 (256 TB) than any machine's memory."""


def test_a_table_on_disk_needs_only_its_cache_in_memory(tmp_path: Path) -> None:
    table = EmbeddingTableConfig("big", ROWS, 64, ("f",), storage=TableStorage("disk", cache_rows=1000))
    collection = ShardedEmbeddingCollection([table], storage_dir=str(tmp_path))
    assert collection.memory_bytes == 1000 * 64 * 4


def test_the_same_table_on_the_device_is_refused() -> None:
    with pytest.raises(TableMemoryError, match="The sparse tables need"):
        ShardedEmbeddingCollection([EmbeddingTableConfig("big", ROWS, 64, ("f",))])
