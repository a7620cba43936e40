from __future__ import annotations

from pathlib import Path

import pytest

from checkpoint.metadata import FileRecord
from checkpoint.store import CheckpointStore


def test_done_markers_give_every_rank_files_and_are_removed(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    temp_dir = store.temp_dir(3, "abc")
    store.fs.makedirs(temp_dir)
    store.write_done_marker(temp_dir, 0, {"model.pt": FileRecord(10, "aa"), "rank_0.pt": FileRecord(2, "bb")})
    store.write_done_marker(temp_dir, 1, {"rank_1.pt": FileRecord(3, "cc")})

    records = store.wait_for_done_markers(temp_dir, world_size=2, timeout_s=1.0)

    assert records == {
        "model.pt": FileRecord(10, "aa"),
        "rank_0.pt": FileRecord(2, "bb"),
        "rank_1.pt": FileRecord(3, "cc"),
    }
    assert store.fs.ls(temp_dir) == []


def test_waiting_for_a_rank_that_never_finishes_times_out_naming_it(tmp_path: Path) -> None:
    store = CheckpointStore(str(tmp_path))
    temp_dir = store.temp_dir(3, "abc")
    store.fs.makedirs(temp_dir)
    store.write_done_marker(temp_dir, 0, {})

    with pytest.raises(TimeoutError, match=r"ranks \[1, 2\] to finish writing"):
        store.wait_for_done_markers(temp_dir, world_size=3, timeout_s=0.1)
