"""A read lease held by another process keeps a checkpoint from a prune; killed, it leaves nothing behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from checkpoint import CheckpointManager, CheckpointPolicy
from gang import FakeGang

HOLD_STEP_1 = textwrap.dedent(
    """
    import sys, time
    from checkpoint.reading import read_lease
    from checkpoint.store import CheckpointStore

    with read_lease(CheckpointStore(sys.argv[1]), 1):
        print("held", flush=True)
        time.sleep(600)
    """
)


def save(manager: CheckpointManager, step: int) -> None:
    manager.save(step, {"model": {"w": torch.full((2,), float(step))}})


def steps(manager: CheckpointManager) -> list[int]:
    return [info.step for info in manager.list_checkpoints()]


def test_a_reader_in_another_process_holds_its_checkpoint_and_a_killed_one_holds_nothing(tmp_path: Path) -> None:
    root = str(tmp_path / "checkpoints")
    manager = CheckpointManager(root, FakeGang(), CheckpointPolicy(keep_last_n=1))
    save(manager, 1)
    reader = subprocess.Popen([sys.executable, "-c", HOLD_STEP_1, root], stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout is not None and reader.stdout.readline() == "held\n"
        save(manager, 2)
        assert steps(manager) == [1, 2]
    finally:
        reader.kill()
        reader.wait(timeout=60)

    save(manager, 3)
    assert steps(manager) == [3]
    assert sorted(path.name for path in (tmp_path / "checkpoints").iterdir()) == ["step_3"]
