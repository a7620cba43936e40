"""``train --nproc N`` after Ctrl-C: the launcher exits 130 when its ranks did, and 1 naming the rank that failed
otherwise (GitHub issue 16). The launcher and its ranks as processes:
tests/integration/recipes/test_launcher_faults.py."""

from __future__ import annotations

import signal

import pytest
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from recipes import launch


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
