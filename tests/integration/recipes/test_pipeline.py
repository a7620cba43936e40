"""The train pipeline end to end: the pipelined loop is the plain loop, bit for bit, on 1, 2 and 2 x 2 ranks,
with micro-batches, and through kill -9 and a resume (GitHub issue 17)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from support.resume_helpers import (
    DLRM_60_STEPS,
    assert_bitwise_equal,
    assert_same_training,
    check_ok,
    committed_steps,
    kill_hard,
    load_verified,
    run_recipes,
    start_recipes,
    wait_for_checkpoint,
)

# End to end: the pipelined loop is the plain loop, bit for bit, through kill -9 and a resume. ----------

PRESET = "dlrm_criteo_tiny"
FINAL_STEP = 60
RUN = (
    *DLRM_60_STEPS,
    "model.embeddings.placement=row_wise",  # every table's ids travel to their owners
    "metrics.recorders.console=false",
)


def train(cwd: Path, output_dir: Path, *overrides: str, nproc: int) -> subprocess.CompletedProcess[str]:
    launch = ["--nproc", str(nproc)] if nproc > 1 else []
    return run_recipes(cwd, "train", PRESET, "-o", str(output_dir), *RUN, *overrides, *launch, timeout=300)


def test_a_pipelined_run_killed_and_resumed_on_2_ranks_is_the_plain_run(tmp_path: Path) -> None:
    plain, piped = tmp_path / "plain", tmp_path / "piped"
    check_ok(train(tmp_path, plain, "trainer.pipeline=false", nproc=2))
    piping = "trainer.pipeline=true"  # `auto` leaves it off where the ranks' threads take every core.
    process = start_recipes(tmp_path, "train", PRESET, "-o", str(piped), *RUN, piping, "--nproc", "2")
    wait_for_checkpoint(piped, 20, process)
    kill_hard(process)
    assert max(committed_steps(piped)) < FINAL_STEP

    check_ok(train(tmp_path, piped, piping, nproc=2))

    log = (piped / "logs" / "rank_1.log").read_text()
    assert "Resumed from the checkpoint of step" in log and "ids sent ahead" in log
    assert_same_training(plain, piped, FINAL_STEP)
    rank_1 = [load_verified(run / "checkpoints" / f"step_{FINAL_STEP}", "rank_1.pt") for run in (plain, piped)]
    assert_bitwise_equal(rank_1[0]["sharded"], rank_1[1]["sharded"], "rank_1.pt's tables")


def test_micro_batches_of_a_pipelined_step_are_the_plain_loops(tmp_path: Path) -> None:
    plain, piped = tmp_path / "plain", tmp_path / "piped"
    check_ok(train(tmp_path, plain, "trainer.grad_accumulation=2", "trainer.pipeline=false", nproc=1))
    # Parsed on two threads too, in the background thread's reads: still the same rows, in the same order.
    piped_run = ("trainer.grad_accumulation=2", "dataset.parse_threads=2", "trainer.pipeline=true")
    check_ok(train(tmp_path, piped, *piped_run, nproc=1))
    assert_same_training(plain, piped, FINAL_STEP)


def test_a_pipelined_run_on_2_x_2_ranks_sends_ids_on_clones_of_the_dp_groups_and_is_the_plain_run(
    tmp_path: Path,
) -> None:
    # The tables live on the DP gangs ({0, 2} and {1, 3}); their clones are made by all four processes. 40 steps
    # (of four processes on the cores of two) keep a validation and a checkpoint mid-run, which the pipeline must
    # drain for and pick up after; the 2-rank test above trains the whole 60.
    plain, piped = tmp_path / "plain", tmp_path / "piped"
    final_step = 40
    shorter = (f"trainer.max_num_steps={final_step}", "gang.tp_size=2")
    check_ok(train(tmp_path, plain, *shorter, "trainer.pipeline=false", nproc=4))
    check_ok(train(tmp_path, piped, *shorter, "trainer.pipeline=true", nproc=4))

    assert "ids sent ahead" in (piped / "logs" / "rank_3.log").read_text()
    assert_same_training(plain, piped, final_step)
    for rank in range(4):
        name = f"rank_{rank}.pt"
        pieces = [load_verified(run / "checkpoints" / f"step_{final_step}", name) for run in (plain, piped)]
        assert_bitwise_equal(pieces[0]["sharded"], pieces[1]["sharded"], f"rank_{rank}.pt's tables")
