"""``train --nproc N`` when its launcher is stopped or killed: the ranks follow it (GitHub issue 16).

Ctrl-C or SIGTERM to the launcher reaches every rank, which commits a checkpoint and exits; the
launcher waits for them and exits with their code. A launcher killed outright (``kill -9``, or the
terminal closing) takes its ranks with it at once. The output directory's lock is rank 0's,
and when rank 0 cannot take it no rank trains.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from recipes.cli import launch
from recipes.runtime.run_lock import LOCK_FILE_NAME, RunLock
from support.resume_helpers import (
    checkpoints_dir,
    committed_steps,
    load_verified,
    read_metadata,
    recipes_env,
    run_recipes,
    wait_until,
)

# Far more steps than the tests let run; small enough for a 2-core machine.
LONG_RUN = (
    "trainer.max_num_steps=100000",
    "trainer.validate_every_n_steps=null",
    "metrics.recorders.console=false",
    "dataset.num_train_samples=4096",
    "dataset.batch_size=64",
    "checkpoint.every_n_steps=10",
    # A rank left waiting in a collective waits an hour: longer than any wait of these tests, so that a test
    # fails when a rank waits for a peer that is gone, instead of passing once the collective times out.
    "gang.timeout_s=3600",
)

# Ranks killed with their launcher die at once (their parent-death signal). Ranks that survived it would train on,
# or wait the hour of LONG_RUN's collective timeout for a dead peer: far past this limit, which no load reaches.
SURVIVAL_LIMIT_S = 120.0


def start_launcher(output_dir: Path, *extra: str) -> Any:
    command = [sys.executable, "-m", "recipes", "train", "ctr_tiny", "-o", str(output_dir), *LONG_RUN, *extra]
    return subprocess.Popen(
        [*command, "--nproc", "2"],
        cwd=output_dir.parent,
        env=recipes_env({"PYTHONUNBUFFERED": "1"}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A launcher in a terminal, which SIGHUP stops: under `nohup` (as a CI job may run the suite) it would
        # inherit SIGHUP ignored and rightly keep training, as `launch` says.
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )


def wait_for_training(output_dir: Path, launcher: Any) -> list[int]:
    """Wait until both ranks train; their pids, rank 0's first."""
    logs = [output_dir / f"logs/rank_{rank}.log" for rank in (0, 1)]
    wait_until(lambda: all(log.is_file() and "Training starts" in log.read_text() for log in logs), launcher)
    ranks = launch.child_pids(launcher.pid)
    assert len(ranks) == 2, ranks
    return sorted(ranks, key=rank_of)


def rank_of(pid: int) -> int:
    """The RANK that torchrun gave a worker process, read from its environment."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in environ if v.startswith(b"RANK=")).split(b"=", 1)[1])


def alive(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (dead, not yet reaped by an init that may never reap it) does not."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between the open and the read
        return False
    return stat.rsplit(") ", 1)[1][0] not in "ZX"


def wait_until_gone(pids: list[int], limit_s: float) -> None:
    """Wait until none of ``pids`` runs; fail past ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while any(alive(pid) for pid in pids):
        assert time.monotonic() < deadline, f"ranks {[pid for pid in pids if alive(pid)]} outlived their launcher"
        time.sleep(0.05)


def stop(process: Any, pids: list[int]) -> None:
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    if process.poll() is None:
        process.kill()
    process.communicate(timeout=60)


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGHUP], ids=["kill-9", "terminal-closed"])
def test_no_rank_outlives_its_launcher(tmp_path: Path, signum: int) -> None:
    output_dir = tmp_path / "run"
    launcher = start_launcher(output_dir)
    ranks: list[int] = []
    try:
        ranks = wait_for_training(output_dir, launcher)
        # Only rank 0 holds the output directory's lock.
        holder = RunLock(str(output_dir))._read_record()
        assert holder is not None and holder.pid == ranks[0]

        os.kill(launcher.pid, signum)
        wait_until_gone(ranks, SURVIVAL_LIMIT_S)
        _, stderr = launcher.communicate(timeout=60)
    finally:
        stop(launcher, ranks)

    if signum == signal.SIGHUP:
        assert launcher.returncode == 128 + signal.SIGHUP
        assert "error: the launcher got SIGHUP; its ranks were stopped." in stderr
    with RunLock(str(output_dir)) as lock:  # A rank killed outright leaves a lock to take over.
        assert lock.taken_over is not None and lock.taken_over.pid == ranks[0]


@pytest.mark.parametrize(
    ("signum", "exit_code"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)], ids=["SIGINT", "SIGTERM"]
)
def test_a_stop_signal_to_the_launcher_reaches_the_ranks_which_commit_a_checkpoint(
    tmp_path: Path, signum: int, exit_code: int
) -> None:
    output_dir = tmp_path / "run"
    launcher = start_launcher(output_dir)
    ranks: list[int] = []
    try:
        ranks = wait_for_training(output_dir, launcher)
        wait_until(lambda: bool(committed_steps(output_dir)), launcher)
        os.kill(launcher.pid, signum)
        _, stderr = launcher.communicate(timeout=240)
    finally:
        stop(launcher, ranks)

    assert launcher.returncode == exit_code, stderr
    assert not any(alive(pid) for pid in ranks)
    stop_step = committed_steps(output_dir)[-1]
    last = checkpoints_dir(output_dir) / f"step_{stop_step}"
    assert read_metadata(last).resumable
    assert load_verified(last, "trainer.pt")["trainer"]["step_nr"] == stop_step
    for rank in (0, 1):
        log = (output_dir / f"logs/rank_{rank}.log").read_text()
        assert f"Received signal {int(signum)}; stopping after this step." in log
        assert f"Training stopped at step {stop_step} on request." in log
    assert not (output_dir / LOCK_FILE_NAME).exists()
    if signum == signal.SIGINT:
        errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
        assert errors == [
            f"error: interrupted at step {stop_step}, after saving its checkpoint; the same command resumes there."
        ]
        assert "Traceback" not in stderr


def test_when_rank_0_cannot_lock_the_output_dir_no_rank_trains(tmp_path: Path) -> None:
    output_dir = tmp_path / "run"
    with RunLock(str(output_dir)):
        # No rank waits for rank 0 in a collective: one that did would wait LONG_RUN's hour, past run_recipes' timeout.
        result = run_recipes(tmp_path, "train", "ctr_tiny", "-o", str(output_dir), *LONG_RUN, "--nproc", "2")

    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # The ranks' one-line error, said once by the launcher.
    [line] = lines
    assert f"is in use by another training run (pid {os.getpid()} on host {socket.gethostname()}" in line
    assert not (output_dir / "logs").exists() and not (output_dir / "checkpoints").exists()


# The launcher's part, in this process, with sleeping processes for ranks ---------------------------


def sleeper(ignore_sigint: bool) -> subprocess.Popen[str]:
    code = "import signal, time\n"
    if ignore_sigint:
        code += "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    code += "print('ready', flush=True)\ntime.sleep(120)\n"
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    return process


def test_ranks_that_do_not_stop_within_the_grace_are_killed_and_the_launcher_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ranks = [sleeper(ignore_sigint=True) for _ in range(2)]
    forwarder = launch._StopForwarder(grace_s=0.5, enabled=True)
    try:
        with forwarder:
            forwarder._handle(signal.SIGINT, None)
            codes = [rank.wait(timeout=30) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()

    assert codes == [-signal.SIGKILL, -signal.SIGKILL]
    failures = {r: ProcessFailure(r, rank.pid, -signal.SIGKILL, "/nonexistent") for r, rank in enumerate(ranks)}
    assert launch._failure_exit_code(ChildFailedError("recipes", failures), forwarder, []) == 1
    assert capsys.readouterr().err == (
        "error: the ranks did not save and exit within 0.5 s of SIGINT, so they were killed; "
        "the last committed checkpoint is intact.\n"
    )


def test_a_rank_whose_launcher_is_gone_before_it_starts_dies_at_once(tmp_path: Path) -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    code = "from recipes.cli.launch import die_with_launcher\ndie_with_launcher()\nprint('survived')\n"
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=recipes_env({launch.LAUNCHER_PID_ENV: str(gone.pid)}),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == -signal.SIGKILL and "survived" not in result.stdout
