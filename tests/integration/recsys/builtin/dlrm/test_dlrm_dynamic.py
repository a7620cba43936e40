"""``dlrm_criteo_tiny_dynamic`` end to end: hash tables that admit and evict as a real run goes, on 1 and 2
ranks, killed with ``kill -9`` and resumed bit-exact, and moved between 2 ranks and 1 (GitHub issue 15)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from support.resume_helpers import (
    DLRM_60_STEPS,
    assert_same_training,
    check_ok,
    committed_steps,
    kill_hard,
    load_verified,
    run_recipes,
    start_recipes,
    tensorboard_scalars,
    wait_for_checkpoint,
)

PRESET = "dlrm_criteo_tiny_dynamic"
FINAL_STEP = 60
# 300 rows per table for about 1000 values a feature: the tables fill, so ids are admitted, refused and evicted
# all through the run, and a resume that lost any of that state would diverge.
SMALL = (
    *DLRM_60_STEPS,
    "dataset.num_embeddings_per_feature=[300]",
    "metrics.recorders.console=false",
)
# Every id admitted at once and none evicted, so that a run moved to another number of ranks does the same
# arithmetic as one that stays, up to the order of float sums. (Counts of ids short of min_count carry over
# as upper bounds, which admits some ids earlier: tests/unit/embedding/test_hash_index.py checks those.)
ROOMY = (*SMALL, "dataset.num_embeddings_per_feature=[2000]", "model.embeddings.hash.min_count=1")


def train(cwd: Path, output_dir: Path, *overrides: str, nproc: int = 1) -> subprocess.CompletedProcess[str]:
    launch = ["--nproc", str(nproc)] if nproc > 1 else []
    return run_recipes(cwd, "train", PRESET, "-o", str(output_dir), *overrides, *launch, timeout=300)


def hash_counters(output_dir: Path, step: int) -> dict[str, float]:
    """The admitted, rejected and evicted ids of the run's table statistics, summed over tables, at ``step``."""
    totals: dict[str, float] = {}
    for name in ("admitted", "rejected", "evicted"):
        curves = [
            dict(tensorboard_scalars(output_dir, "train", f"hash_tables/{table}/{name}")) for table in ("C1", "C26")
        ]
        totals[name] = sum(curve[step] for curve in curves)
    return totals


def dense_model(output_dir: Path, step: int) -> dict[str, torch.Tensor]:
    state = load_verified(output_dir / "checkpoints" / f"step_{step}", "model.pt")["model"]
    return {name: tensor for name, tensor in state.items() if torch.is_tensor(tensor)}


@pytest.mark.parametrize("nproc", [1, 2])
def test_kill_9_mid_run_then_the_same_command_ends_bit_exact(tmp_path: Path, nproc: int) -> None:
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    check_ok(train(tmp_path, reference, *SMALL, nproc=nproc))
    launch = ["--nproc", str(nproc)] if nproc > 1 else []
    process = start_recipes(tmp_path, "train", PRESET, "-o", str(resumed), *SMALL, *launch)
    wait_for_checkpoint(resumed, 20, process)
    kill_hard(process)
    assert max(committed_steps(resumed)) < FINAL_STEP

    check_ok(train(tmp_path, resumed, *SMALL, nproc=nproc))

    assert "Resumed from the checkpoint of step" in (resumed / "logs" / "rank_0.log").read_text()
    assert_same_training(reference, resumed, FINAL_STEP)
    counters = hash_counters(reference, FINAL_STEP)
    assert counters["admitted"] > 0 and counters["rejected"] > 0 and counters["evicted"] > 0, counters


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_on_another_number_of_ranks(tmp_path: Path, before: int, after: int) -> None:
    stayed, moved = tmp_path / "stayed", tmp_path / "moved"
    check_ok(train(tmp_path, stayed, *ROOMY, nproc=before))
    check_ok(train(tmp_path, moved, *ROOMY, f"trainer.max_num_steps={FINAL_STEP // 2}", nproc=before))

    check_ok(train(tmp_path, moved, *ROOMY, nproc=after))

    assert "Resumed from the checkpoint of step 30" in (moved / "logs" / "rank_0.log").read_text()
    assert len(list((moved / "checkpoints" / f"step_{FINAL_STEP}").glob("rank_*.pt"))) == after
    # Every id kept its row and its optimizer state: the moved run trains on as the one that stayed.
    expected, actual = dense_model(stayed, FINAL_STEP), dense_model(moved, FINAL_STEP)
    assert expected.keys() == actual.keys()
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=1e-4, atol=1e-5, msg=f"parameter {name}")
    assert hash_counters(moved, FINAL_STEP) == hash_counters(stayed, FINAL_STEP)
