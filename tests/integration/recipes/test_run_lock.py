"""The output directory's lock as users meet it (GitHub issue 16): a zombie holder is dead; a second ``train``
into a running directory is refused, ``eval``/``predict``/``checkpoints`` read it, and a new run takes over
the lock of one killed with ``kill -9`` and resumes it bit-exact."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from recipes.runtime.run_lock import LOCK_FILE_NAME, Holder
from support.cli_runs import checkpoints_listing
from support.resume_helpers import (
    FINAL_STEP,
    assert_same_training,
    check_ok,
    committed_steps,
    kill_hard,
    one_line_error,
    run_recipes,
    shared_run,
    stall_env,
    start_recipes,
    train_args,
    wait_until,
)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux's /proc")
def test_a_zombie_holder_is_dead() -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while Path(f"/proc/{process.pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert Holder(socket.gethostname(), process.pid, "then").is_running() is False
    finally:
        process.wait()


# End to end -------------------------------------------------------------------------------------


@pytest.fixture
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shared_run(tmp_path_factory, "reference")


def start_stalled_run(tmp_path: Path, output_dir: Path) -> Any:
    """A run holding the lock, asleep inside the save of step 20, with step 10 committed."""
    marker = tmp_path / "stalled"
    process = start_recipes(
        tmp_path, *train_args(output_dir), env=stall_env("before_rename", 20, marker), stalling=True
    )
    wait_until(marker.exists, process)
    assert committed_steps(output_dir) == [10]
    return process


def test_a_second_train_into_a_running_directory_exits_2_naming_the_holder_and_writes_nothing(
    tmp_path: Path,
) -> None:
    output_dir = tmp_path / "run"
    first = start_stalled_run(tmp_path, output_dir)
    try:
        record = json.loads((output_dir / LOCK_FILE_NAME).read_text())
        before = {path: path.read_bytes() for path in (output_dir / "config.yaml", output_dir / "logs/rank_0.log")}

        second = run_recipes(tmp_path, *train_args(output_dir))

        assert second.returncode == 2
        line = one_line_error(second)
        assert f"{output_dir} is in use by another training run" in line
        assert f"pid {first.pid} on host {socket.gethostname()}, since {record['since']}" in line
        assert {path: path.read_bytes() for path in before} == before
        assert first.poll() is None
    finally:
        kill_hard(first)


def test_eval_predict_and_checkpoints_read_a_running_directory(tmp_path: Path) -> None:
    output_dir = tmp_path / "run"
    first = start_stalled_run(tmp_path, output_dir)
    try:
        listed = checkpoints_listing(output_dir)
        scored = check_ok(run_recipes(tmp_path, "eval", str(output_dir)))
        predicted = check_ok(run_recipes(tmp_path, "predict", str(output_dir), "-o", str(tmp_path / "p.csv")))

        assert re.search(r"^\s*10\s", listed, re.MULTILINE), listed
        assert "auc=" in scored.stdout
        assert "Wrote the predictions" in predicted.stdout and (tmp_path / "p.csv").is_file()
        assert json.loads((output_dir / LOCK_FILE_NAME).read_text())["pid"] == first.pid
        assert first.poll() is None
    finally:
        kill_hard(first)


def test_the_lock_of_a_run_killed_with_kill_9_is_taken_over_and_the_run_resumes_bit_exact(
    tmp_path: Path, reference: Path
) -> None:
    output_dir = tmp_path / "run"
    first = start_stalled_run(tmp_path, output_dir)
    kill_hard(first)
    assert json.loads((output_dir / LOCK_FILE_NAME).read_text())["pid"] == first.pid

    result = check_ok(run_recipes(tmp_path, *train_args(output_dir)))

    taken_over = f"Took over the lock of {output_dir} from pid {first.pid} on host {socket.gethostname()}"
    assert taken_over in result.stderr
    log = (output_dir / "logs" / "rank_0.log").read_text()
    assert taken_over in log and "Resumed from the checkpoint of step 10." in log
    assert not (output_dir / LOCK_FILE_NAME).exists()
    assert_same_training(reference, output_dir, FINAL_STEP)
