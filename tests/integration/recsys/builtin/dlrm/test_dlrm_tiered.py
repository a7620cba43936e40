"""``dlrm_criteo_tiny`` with its tables on disk or host behind a cache of 16 rows, far fewer than the rows one step
touches: the same checkpoints, metrics and tables as on the device, on 1 and 2 ranks (replicated and row-wise);
killed with ``kill -9`` while it saves (every step writes rows back and reads the next step's ahead) and resumed
bit-exact from a checkpoint of the rows written since the last full one; a damaged store refused (GitHub issue 48)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pyarrow.parquet as pa_parquet
import pytest

from support.resume_helpers import (
    DLRM_60_STEPS,
    assert_bitwise_equal,
    assert_same_training,
    check_ok,
    checkpoints_dir,
    committed_steps,
    final_states,
    metric_history,
    one_line_error,
    read_metadata,
    run_recipes,
    stall_env,
    start_recipes,
    tensorboard_scalars,
    wait_and_kill_at_stall,
)

PRESET = "dlrm_criteo_tiny"
FINAL_STEP = 60
SMALL = (*DLRM_60_STEPS, "dataset.num_embeddings_per_feature=[500]", "metrics.recorders.console=false")
ON_DISK = ("model.embeddings.storage=disk", "model.embeddings.cache.rows=16", "trainer.pipeline=true")


def train(
    cwd: Path, output_dir: Path, *overrides: str, nproc: int = 1, preset: str = PRESET
) -> subprocess.CompletedProcess[str]:
    launch = ["--nproc", str(nproc)] if nproc > 1 else []
    return run_recipes(cwd, "train", preset, "-o", str(output_dir), *SMALL, *overrides, *launch, timeout=300)


def exported_tables(cwd: Path, output_dir: Path) -> dict[str, list[list[float]]]:
    """The last checkpoint's tables as ``export-tables`` writes them: every row, by table."""
    destination = output_dir.parent / f"{output_dir.name}_tables"
    check_ok(run_recipes(cwd, "export-tables", str(output_dir), "-o", str(destination)))
    return {path.stem: pa_parquet.read_table(path).to_pydict()["embedding"] for path in destination.glob("*.parquet")}


def assert_same_arithmetic(cwd: Path, reference: Path, tiered: Path) -> None:
    """The same dense model, optimizer, metrics, curves and tables: the checkpoints' table pieces differ in form
    only (a tiered table saves the rows steps wrote)."""
    shared_ref, rank_ref = final_states(reference, FINAL_STEP)
    shared_new, rank_new = final_states(tiered, FINAL_STEP)
    assert_bitwise_equal(shared_ref, shared_new, "shared state")
    assert_bitwise_equal(rank_ref["metrics"], rank_new["metrics"], "metrics")
    assert metric_history(reference) == metric_history(tiered)
    assert tensorboard_scalars(reference, "valid", "auc") == tensorboard_scalars(tiered, "valid", "auc")
    assert exported_tables(cwd, reference) == exported_tables(cwd, tiered)


@pytest.mark.parametrize(("nproc", "placement"), [(1, "auto"), (2, "auto"), (2, "row_wise")])
def test_tables_on_disk_train_bit_identically_to_tables_on_the_device(
    tmp_path: Path, nproc: int, placement: str
) -> None:
    reference, on_disk = tmp_path / "device", tmp_path / "disk"
    placed = f"model.embeddings.placement={placement}"  # auto: on 2 ranks the planner replicates these small tables
    check_ok(train(tmp_path, reference, placed, nproc=nproc))
    result = check_ok(train(tmp_path, on_disk, *ON_DISK, placed, nproc=nproc))

    assert "stored on disk" in result.stdout and "with a cache of" in result.stdout
    assert sorted(path.name for path in (on_disk / "table_stores").iterdir()) == [
        f"rank_{rank}" for rank in range(nproc)
    ]
    assert_same_arithmetic(tmp_path, reference, on_disk)


def test_hash_tables_on_disk_train_bit_identically_on_2_ranks(tmp_path: Path) -> None:
    reference, on_disk = tmp_path / "device", tmp_path / "disk"
    # 300 slots per table for about 1000 values a feature: ids are admitted, refused and evicted all through the run.
    dynamic = ("dataset.num_embeddings_per_feature=[300]",)
    check_ok(train(tmp_path, reference, *dynamic, nproc=2, preset="dlrm_criteo_tiny_dynamic"))
    check_ok(train(tmp_path, on_disk, *dynamic, *ON_DISK, nproc=2, preset="dlrm_criteo_tiny_dynamic"))

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
