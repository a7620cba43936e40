"""A stop request, end to end: SIGTERM (a scheduler's preemption notice) or SIGUSR1 makes a training
process finish its step, save a checkpoint and exit 0; running the command again resumes there."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from support.resume_helpers import (
    check_ok,
    checkpoints_dir,
    committed_steps,
    load_verified,
    metric_history,
    read_metadata,
    run_recipes,
    start_recipes,
    train_args,
    wait_for_checkpoint,
)

# Far more steps than the test lets it run: only the signal ends it.
LONG_RUN = "trainer.max_num_steps=5000"


@pytest.mark.parametrize(
    "signum",
    [pytest.param(signal.SIGTERM, id="SIGTERM"), pytest.param(signal.SIGUSR1, id="SIGUSR1")],
)
def test_a_stop_signal_saves_a_checkpoint_exits_0_and_a_rerun_resumes_there(tmp_path: Path, signum: int) -> None:
    output_dir = tmp_path / "run"
    process = start_recipes(tmp_path, *train_args(output_dir, LONG_RUN))
    wait_for_checkpoint(output_dir, 10, process)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=120)

    assert process.returncode == 0, stderr
    assert f"Received signal {int(signum)}; stopping after this step." in stderr
    stop_step = committed_steps(output_dir)[-1]
    assert 10 <= stop_step < 5000
    last = checkpoints_dir(output_dir) / f"step_{stop_step}"
    assert read_metadata(last).resumable
    assert load_verified(last, "trainer.pt")["trainer"]["step_nr"] == stop_step
    log = (output_dir / "logs" / "rank_0.log").read_text()
    assert f"Training stopped at step {stop_step} on request." in log
    # The step the signal interrupted was finished; a stop is a resume point only: it publishes no metrics off the
    # schedule (every 4 steps).
    assert metric_history(output_dir)["train"][-1]["step"] == stop_step - stop_step % 4
    # Nor does it validate off the schedule (every 20 steps); its checkpoint, unless the schedule's (every 10 steps),
    # is marked a resume point only.
    assert [row["step"] for row in metric_history(output_dir).get("valid", [])] == list(range(20, stop_step + 1, 20))
    interrupted = stop_step % 10 != 0
    assert read_metadata(last).interrupted == interrupted
    assert read_metadata(last).score is None or not interrupted

    check_ok(run_recipes(tmp_path, *train_args(output_dir, f"trainer.max_num_steps={stop_step + 3}")))

    log = (output_dir / "logs" / "rank_0.log").read_text()
    assert f"Resumed from the checkpoint of step {stop_step}." in log
    assert re.search(rf"Training starts at step {stop_step} ", log)
    assert committed_steps(output_dir)[-1] == stop_step + 3
    if interrupted:  # A resume point only: gone once a later checkpoint is saved.
        assert stop_step not in committed_steps(output_dir)
