"""``dlrm_criteo_tiny`` with its tables on disk or host behind a cache of 16 rows, far fewer than the rows one step
touches: the same checkpoints, metrics and tables as on the device (on 2 ranks: ``test_dlrm_tiered_ranks.py``);
killed with ``kill -9`` while it saves (every step writes rows back and reads the next step's ahead) and resumed
bit-exact from a checkpoint of the rows written since the last full one; a damaged store refused (GitHub issue 48)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.resume_helpers import (
    assert_same_training,
    check_ok,
    checkpoints_dir,
    committed_steps,
    one_line_error,
    read_metadata,
    stall_env,
    start_recipes,
    wait_and_kill_at_stall,
)
from support.tiered_runs import FINAL_STEP, ON_DISK, PRESET, SMALL, assert_same_arithmetic, train


def test_tables_on_disk_train_bit_identically_to_tables_on_the_device(tmp_path: Path) -> None:
    reference, on_disk = tmp_path / "device", tmp_path / "disk"
    check_ok(train(tmp_path, reference))
    result = check_ok(train(tmp_path, on_disk, *ON_DISK))

    assert "stored on disk" in result.stdout and "with a cache of" in result.stdout
    assert [path.name for path in (on_disk / "table_stores").iterdir()] == ["rank_0"]
    assert_same_arithmetic(tmp_path, reference, on_disk)


def test_tables_on_host_with_a_per_table_cache_train_bit_identically(tmp_path: Path) -> None:
    reference, on_host = tmp_path / "device", tmp_path / "host"
    check_ok(train(tmp_path, reference))
    per_table = ("model.embeddings.storage=host", "model.embeddings.tables={C1: {storage: disk, cache: {rows: 4}}}")
    check_ok(train(tmp_path, on_host, *per_table, "model.embeddings.cache={rows: 32, eviction: lfu}"))

    assert_same_arithmetic(tmp_path, reference, on_host)


def test_kill_9_mid_run_with_tables_on_disk_then_the_same_command_ends_bit_exact(tmp_path: Path) -> None:
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    # The checkpoint of step 40 holds the rows written since 20's; the run is killed while it saves step 60.
    deltas = (*ON_DISK, "checkpoint.full_every=2")
    check_ok(train(tmp_path, reference, *deltas))
    marker = tmp_path / "stalled"
    stall = stall_env("before_rename", FINAL_STEP, marker)
    process = start_recipes(tmp_path, "train", PRESET, "-o", str(resumed), *SMALL, *deltas, env=stall, stalling=True)
    wait_and_kill_at_stall(process, marker)
    assert max(committed_steps(resumed)) == 40

    check_ok(train(tmp_path, resumed, *deltas))

    assert "Resumed from the checkpoint of step 40" in (resumed / "logs" / "rank_0.log").read_text()
    assert read_metadata(checkpoints_dir(resumed) / "step_40").base_step == 20
    assert_same_training(reference, resumed, FINAL_STEP)


@pytest.mark.parametrize("damage", ["truncated", "overwritten"])
def test_a_damaged_disk_store_is_refused_in_one_line_and_kept(tmp_path: Path, damage: str) -> None:
    output_dir = tmp_path / "run"
    check_ok(train(tmp_path, output_dir, *ON_DISK, "trainer.max_num_steps=20"))
    store = sorted((output_dir / "table_stores" / "rank_0").iterdir())[0]
    if damage == "truncated":
        with open(store, "r+b") as file:
            file.truncate(store.stat().st_size // 2)
    else:
        with open(store, "r+b") as file:
            file.write(b"not a row store")
    before = store.read_bytes()

    result = train(tmp_path, output_dir, *ON_DISK, "trainer.max_num_steps=40")

    assert result.returncode == 2
    line = one_line_error(result)
    assert str(store) in line and "nothing was changed" in line
    assert store.read_bytes() == before
    assert max(committed_steps(output_dir)) == 20
