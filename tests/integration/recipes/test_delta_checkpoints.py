"""``checkpoint.full_every``: checkpoints whose tables hold the rows changed since the last whole one, end to end.

A run killed with ``kill -9`` inside the save of a delta resumes from the delta before it (put over its base)
and ends bit-exact with a run never stopped; keep-last-1 keeps the base of the newest delta; ``export-tables``
reads a delta checkpoint whole.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow.parquet as pa_parquet
import pytest
import torch

from checkpoint import CheckpointManager
from gang import FakeGang
from recipes.checkpointing.deltas import rank_state
from support.resume_helpers import (
    DLRM_60_STEPS,
    WALL_CLOCK_METRICS,
    assert_bitwise_equal,
    check_ok,
    checkpoints_dir,
    committed_steps,
    metric_history,
    read_metadata,
    run_recipes,
    stall_env,
    start_recipes,
    train_args,
    wait_and_kill_at_stall,
)

FINAL_STEP = 40
# Saves at 10 (whole), 20 and 30 (deltas over 10), 40 (whole); keep-last-1 leaves the newest and its base.
DELTAS = ("checkpoint.full_every=3", "checkpoint.keep_last_n=1", "checkpoint.keep_best_n=null")
KINDS = {"fixed": (), "hash": ("model.embeddings.kind=hash",)}


def whole_state(output_dir: Path, step: int, rank_nr: int = 0) -> tuple[dict[str, Any], dict[str, Any], int | None]:
    """The shared state and a rank's state (its tables put over the base) of the checkpoint of ``step``, and the
    step of its base."""
    manager = CheckpointManager(str(checkpoints_dir(output_dir)), FakeGang(), clean_up=False)
    loaded = manager.load(step)
    rank = rank_state(loaded, rank_nr)
    rank["metrics"] = {k: v for k, v in rank["metrics"].items() if k not in WALL_CLOCK_METRICS}
    return loaded.shared_state, rank, loaded.metadata.base_step


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_run_killed_saving_a_delta_resumes_from_the_one_before_bit_exact(tmp_path: Path, kind: str) -> None:
    reference, resumed, marker = tmp_path / "reference", tmp_path / "resumed", tmp_path / "stalled"
    check_ok(run_recipes(tmp_path, *train_args(reference, *DELTAS, *KINDS[kind])))
    assert committed_steps(reference) == [FINAL_STEP]  # whole: no base to keep

    process = start_recipes(
        tmp_path, *train_args(resumed, *DELTAS, *KINDS[kind]), env=stall_env("before_rename", 30, marker), stalling=True
    )
    wait_and_kill_at_stall(process, marker)
    assert committed_steps(resumed) == [10, 20]  # keep-last-1 keeps step 20 and its base
    assert read_metadata(checkpoints_dir(resumed) / "step_20").base_step == 10
    tables = torch.load(checkpoints_dir(resumed) / "step_20" / "rank_0.pt", weights_only=True)["sharded"]
    pieces = next(iter(tables.values()))["tables"]
    assert all(piece.get("delta_of", 10) == 10 for piece in pieces.values())
    if kind == "fixed":  # a hash table's delta is whole here: most of its few used slots changed in 10 steps
        assert all("delta_of" in piece for piece in pieces.values())

    check_ok(run_recipes(tmp_path, *train_args(resumed, *DELTAS, *KINDS[kind])))

    assert "Resumed from the checkpoint of step 20." in (resumed / "logs" / "rank_0.log").read_text()
    shared_ref, rank_ref, base_ref = whole_state(reference, FINAL_STEP)
    shared_new, rank_new, base_new = whole_state(resumed, FINAL_STEP)
    assert (base_ref, base_new) == (None, 30)  # the resumed run saved whole first, at step 30
    assert committed_steps(resumed) == [30, FINAL_STEP]
    assert_bitwise_equal(shared_ref, shared_new, "shared state")
    assert_bitwise_equal(rank_ref, rank_new, "rank_0.pt")
    assert metric_history(reference) == metric_history(resumed)

    check_ok(run_recipes(tmp_path, "export-tables", str(resumed), "-o", str(tmp_path / "tables")))
    exported = {path.stem: pa_parquet.read_table(path) for path in (tmp_path / "tables").glob("*.parquet")}
    for table_name, piece in next(iter(rank_ref["sharded"].values()))["tables"].items():
        rows = torch.tensor(exported[table_name].column("embedding").to_pylist())
        saved = piece["weight"]
        if kind == "fixed":
            assert torch.equal(rows, saved)
        else:
            assert rows.shape == saved.shape


@pytest.mark.parametrize("after", [2, 1])
def test_a_two_rank_run_resumes_from_a_delta_on_two_ranks_bit_exact_and_on_one(tmp_path: Path, after: int) -> None:
    """DLRM's tables row- and table-wise over 2 ranks: each rank's delta goes over its own base file, and on 1 rank
    every rank's, merged, reshards as a whole checkpoint does."""
    run = ("train", "dlrm_criteo_tiny", *DLRM_60_STEPS, "checkpoint.every_n_steps=10", "checkpoint.full_every=3")
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    check_ok(run_recipes(tmp_path, *run, "-o", str(reference), "--nproc", "2", timeout=300))
    check_ok(run_recipes(tmp_path, *run, "-o", str(resumed), "trainer.max_num_steps=30", "--nproc", "2", timeout=300))
    assert read_metadata(checkpoints_dir(resumed) / "step_30").base_step == 10

    check_ok(run_recipes(tmp_path, *run, "-o", str(resumed), *(["--nproc", "2"] if after == 2 else []), timeout=300))

    assert "Resumed from the checkpoint of step 30." in (resumed / "logs" / "rank_0.log").read_text()
    if after == 2:
        for rank_nr in range(2):
            shared_ref, rank_ref, _ = whole_state(reference, 60, rank_nr)
            shared_new, rank_new, _ = whole_state(resumed, 60, rank_nr)
            assert_bitwise_equal(shared_ref, shared_new, "shared state")
            assert_bitwise_equal(rank_ref, rank_new, f"rank_{rank_nr}.pt")
        return
    expected, actual = whole_state(reference, 60)[0]["model"], whole_state(resumed, 60)[0]["model"]
    for name, tensor in expected.items():
        if torch.is_tensor(tensor):
            torch.testing.assert_close(actual[name], tensor, rtol=1e-4, atol=1e-5, msg=f"parameter {name}")
