"""``train --nproc N`` after Ctrl-C: the launcher exits 130 when its ranks did, and 1 naming the rank that failed
otherwise (GitHub issue 16). The launcher and its ranks as processes:
tests/integration/recipes/test_launcher_faults.py."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from recipes.cli import launch


def test_after_ctrl_c_the_launcher_exits_130_when_the_ranks_did(capsys: pytest.CaptureFixture[str]) -> None:
    forwarder = launch._StopForwarder(grace_s=60, enabled=True)
    forwarder.received = signal.SIGINT

    def failed(*codes: int) -> ChildFailedError:
        return ChildFailedError(
            "recipes", {r: ProcessFailure(r, 1, code, "/nonexistent") for r, code in enumerate(codes)}
        )

    # Rank 1, closing down when rank 0 exited, got torchrun's SIGTERM.
    assert launch._failure_exit_code(failed(130, -signal.SIGTERM), forwarder, []) == 130
    assert capsys.readouterr().err == ""  # Rank 0 said it.
    assert launch._failure_exit_code(failed(130, 1), forwarder, []) == 1
    assert "rank 1 exited with code 1" in capsys.readouterr().err


def failed(*codes: int) -> ChildFailedError:
    return ChildFailedError("recipes", {r: ProcessFailure(r, 1, code, "/nonexistent") for r, code in enumerate(codes)})


def test_the_ranks_one_line_errors_are_said_once_by_the_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Once every rank printed its line, and torchrun its own report of the failure, at length."""
    line = "error: `dataset.train_path` must name existing files, but data.csv does not exist."
    monkeypatch.setenv(launch.ERROR_DIR_ENV, str(tmp_path))
    for rank in (1, 0):
        monkeypatch.setenv("RANK", str(rank))
        assert launch.report_rank_error(line)

    code = launch._failure_exit_code(
        failed(2, 2), launch._StopForwarder(60, enabled=True), launch._rank_errors(str(tmp_path))
    )

    assert code == 2
    assert capsys.readouterr().err == f"{line}\n"


def test_a_rank_killed_by_a_signal_is_named_before_the_errors_its_death_caused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    peer_gone = "error: RuntimeError: Connection closed by peer [127.0.0.1]:29500"

    code = launch._failure_exit_code(failed(1, -signal.SIGKILL), launch._StopForwarder(60, enabled=True), [peer_gone])

    assert code == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: rank 0 exited with code 1; rank 1 was killed by SIGKILL (the ranks' own errors are in "
        "OUTPUT_DIR/logs/rank_K.log)",
        peer_gone,
    ]


def test_a_rank_that_torchrun_stopped_after_its_peer_failed_is_not_named(capsys: pytest.CaptureFixture[str]) -> None:
    """Rank 0 exited with its error line while rank 1 was still closing down; torchrun then sent rank 1 SIGTERM."""
    locked = "error: the output directory run is in use by another training run."

    code = launch._failure_exit_code(failed(2, -signal.SIGTERM), launch._StopForwarder(60, enabled=True), [locked])

    assert code == 2
    assert capsys.readouterr().err == f"{locked}\n"


def test_a_rank_stopped_by_sigterm_before_its_peers_failed_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    peer_gone = "error: RuntimeError: Connection closed by peer [127.0.0.1]:29500"
    failures = {
        0: ProcessFailure(0, 1, 1, "/nonexistent"),
        1: ProcessFailure(1, 2, -signal.SIGTERM, "/nonexistent"),
    }
    failures[1].timestamp = failures[0].timestamp - 5  # Stopped from outside first: the cause of rank 0's error.

    code = launch._failure_exit_code(
        ChildFailedError("recipes", failures), launch._StopForwarder(60, enabled=True), [peer_gone]
    )

    assert code == 1
    assert "rank 1 was killed by SIGTERM" in capsys.readouterr().err.splitlines()[0]
