"""Runs of ``dlrm_criteo_tiny`` with its tables on disk or host, and what tells two runs did the same arithmetic
(issue 48's tests: ``tests/integration/recsys/builtin/dlrm/test_dlrm_tiered*.py``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pyarrow.parquet as pa_parquet

from support.resume_helpers import (
    DLRM_60_STEPS,
    assert_bitwise_equal,
    check_ok,
    final_states,
    metric_history,
    run_recipes,
    tensorboard_scalars,
)

PRESET = "dlrm_criteo_tiny"
FINAL_STEP = 60
SMALL = (*DLRM_60_STEPS, "dataset.num_embeddings_per_feature=[500]", "metrics.recorders.console=false")
ON_DISK = ("model.embeddings.storage=disk", "model.embeddings.cache.rows=16", "trainer.pipeline=true")


def train(
    cwd: Path, output_dir: Path, *overrides: str, nproc: int = 1, preset: str = PRESET
) -> subprocess.CompletedProcess[str]:
    """``train PRESET`` as ``SMALL`` sizes it, with ``overrides``, on ``nproc`` ranks."""
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
