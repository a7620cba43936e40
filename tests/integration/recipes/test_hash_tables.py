"""Hash tables in runs of the CLI (GitHub issue 15): a checkpoint of the other kind stops in one line with exit 2;
a full table without eviction stops the run with exit 1 and leaves the last checkpoint whole; TensorBoard
shows every table's rows used, load factor and id counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.cli_runs import run_main
from support.overrides import CTR_HASH, SMALL_DYNAMIC
from support.resume_helpers import committed_steps, tensorboard_scalars

STATISTICS = ("rows_used", "load_factor", "admitted", "rejected", "evicted")


def test_a_hash_checkpoint_does_not_load_into_a_fixed_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output_dir = str(tmp_path / "run")
    assert run_main(capsys, "train", "ctr_tiny", "-o", output_dir, *CTR_HASH)[0] == 0

    code, _, err = run_main(capsys, "eval", output_dir, "model.embeddings.kind=fixed")

    assert code == 2
    assert err.strip() == (
        "error: Table 'cat_0' is a fixed table, but the checkpoint holds a hash table of that name: "
        "set its kind to hash to load it."
    )


def test_a_full_table_without_eviction_stops_the_run_and_the_last_checkpoint_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output_dir = tmp_path / "run"
    code, _, err = run_main(
        capsys,
        "train",
        "dlrm_criteo_tiny_dynamic",
        "-o",
        str(output_dir),
        *SMALL_DYNAMIC,
        "trainer.max_num_steps=100",
        "checkpoint.every_n_steps=10",
        "model.embeddings.hash.eviction=none",
    )

    assert code == 1
    assert len(err.strip().splitlines()) == 1, err
    assert "is full: all 300 rows of this rank's shard hold ids and its eviction is 'none'" in err
    [last] = committed_steps(output_dir)[-1:]
    assert 10 <= last < 100
    assert run_main(capsys, "eval", str(output_dir), "--checkpoint", str(last))[0] == 0


def test_tensorboard_shows_each_tables_rows_load_factor_and_id_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output_dir = tmp_path / "run"
    args = [
        "-o",
        str(output_dir),
        *SMALL_DYNAMIC,
        "trainer.max_num_steps=60",
        "trainer.publish_metrics_every_n_steps=20",
    ]
    assert run_main(capsys, "train", "dlrm_criteo_tiny_dynamic", *args)[0] == 0

    for table in ("C1", "C26"):
        curves = {name: tensorboard_scalars(output_dir, "train", f"hash_tables/{table}/{name}") for name in STATISTICS}
        assert all([step for step, _ in curve] == [20, 40, 60] for curve in curves.values()), curves
        last = {name: curve[-1][1] for name, curve in curves.items()}
        assert last["rows_used"] == 300 and last["load_factor"] == 1.0  # the table filled up
        assert last["admitted"] - last["evicted"] == last["rows_used"]
        assert last["rejected"] > 0  # min_count 2: ids seen once wait
        admitted = [value for _, value in curves["admitted"]]
        assert admitted == sorted(admitted)  # cumulative counts
