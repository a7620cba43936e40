"""Ctrl-C (SIGINT) on one process, end to end: the run finishes its step, commits a checkpoint and exits
130; running the command again ends bit for bit as if never interrupted. A second Ctrl-C exits at
once, and the last committed checkpoint still loads (GitHub issue 16)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from recipes.runtime.run_lock import LOCK_FILE_NAME
from support.resume_helpers import (
    FINAL_STEP,
    assert_same_training,
    check_ok,
    checkpoints_dir,
    committed_steps,
    load_verified,
    one_line_error,
    read_metadata,
    run_recipes,
    shared_run,
    stall_env,
    start_recipes,
    train_args,
    wait_for_checkpoint,
    wait_until,
)
from support.stalling_cli import STALL_SECONDS

# Whatever step Ctrl-C stops at, the stopped run publishes, validates and saves there, as an
# uninterrupted run does at every step with these: so the two runs must agree bit for bit.
EVERY_STEP = (
    "trainer.publish_metrics_every_n_steps=1",
    "trainer.validate_every_n_steps=1",
    "checkpoint.every_n_steps=1",
    "dataset.num_valid_samples=64",
)

STOPPING = "Received signal 2; stopping after this step."


@pytest.fixture
def every_step_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_run(tmp_path_factory, "every_step", *EVERY_STEP)


@pytest.fixture
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_run(tmp_path_factory, "reference")


def test_ctrl_c_commits_a_checkpoint_exits_130_and_the_rerun_ends_bit_exact(
    tmp_path: Path, every_step_reference: Path
) -> None:
    output_dir = tmp_path / "run"
    process = start_recipes(tmp_path, *train_args(output_dir, *EVERY_STEP))
    wait_for_checkpoint(output_dir, 10, process)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)

    assert process.returncode == 130, stderr
    stop_step = committed_steps(output_dir)[-1]
    assert 10 <= stop_step < FINAL_STEP
    assert STOPPING in stderr
    line = one_line_error(subprocess.CompletedProcess(process.args, process.returncode, "", stderr))
    assert (
        line == f"error: interrupted at step {stop_step}, after saving its checkpoint; the same command resumes there."
    )
    last = checkpoints_dir(output_dir) / f"step_{stop_step}"
    assert read_metadata(last).resumable
    assert load_verified(last, "trainer.pt")["trainer"]["step_nr"] == stop_step
    assert not (output_dir / LOCK_FILE_NAME).exists()

    check_ok(run_recipes(tmp_path, *train_args(output_dir, *EVERY_STEP)))

    assert f"Resumed from the checkpoint of step {stop_step}." in (output_dir / "logs" / "rank_0.log").read_text()
    assert_same_training(every_step_reference, output_dir, FINAL_STEP)


def test_a_second_ctrl_c_during_the_save_exits_at_once_and_the_last_committed_checkpoint_loads(
    tmp_path: Path, reference: Path
) -> None:
    output_dir = tmp_path / "run"
    marker = tmp_path / "stalled"
    stall = stall_env("before_rename", 20, marker)
    process = start_recipes(tmp_path, *train_args(output_dir), env=stall, stalling=True)
    wait_until(marker.exists, process)  # Inside the save of step 20: whole, but not yet renamed.
    log = output_dir / "logs" / "rank_0.log"

    process.send_signal(signal.SIGINT)
    wait_until(lambda: STOPPING in log.read_text(), process)
    process.send_signal(signal.SIGINT)
    # At once: the save it interrupts stalls for STALL_SECONDS; a process that waited for it would still run when
    # this timeout (far beyond what an exit takes under any load) ends the test.
    _, stderr = process.communicate(timeout=STALL_SECONDS / 5)

    assert process.returncode == 130, stderr
    assert "Received signal 2 again; exiting at once. The last committed checkpoint is intact." in stderr
    assert "Traceback" not in stderr
    assert committed_steps(output_dir) == [10]
    assert any(p.name.startswith("step_20.tmp-") for p in checkpoints_dir(output_dir).iterdir())
    step_10 = checkpoints_dir(output_dir) / "step_10"
    for file_name in read_metadata(step_10).files:
        load_verified(step_10, file_name)
    assert not (output_dir / LOCK_FILE_NAME).exists()  # Released before the exit: no stale lock to report.

    result = check_ok(run_recipes(tmp_path, *train_args(output_dir)))

    assert "Took over the lock" not in result.stderr
    assert "Resumed from the checkpoint of step 10." in log.read_text()
    assert_same_training(reference, output_dir, FINAL_STEP)
