from __future__ import annotations

import errno
import time
from pathlib import Path

import torch
from torch.multiprocessing.spawn import spawn

from checkpoint import CheckpointManager, CheckpointPolicy
from gang import FakeGang
from support.gloo_jobs import free_port, gloo_gang


def rank_state_of(rank: int, step: int) -> dict[str, object]:
    return {"reader": {"position": 100 * rank + step}, "shard": torch.full((3,), float(rank))}


def save_on_every_rank(rank: int, world_size: int, port: int, root: str) -> None:
    with gloo_gang(rank, world_size, port) as gang:
        manager = CheckpointManager(root, gang, CheckpointPolicy(keep_last_n=1), gang_sizes={"dp": world_size})
        shared = {"model": {"w": torch.arange(4.0)}}
        manager.save(1, shared, rank_state_of(rank, 1))
        manager.save(2, shared, rank_state_of(rank, 2), blocking=False)
        manager.wait()
        # Every rank sees the committed checkpoint once wait() returns, and the pruned one is gone.
        assert [info.step for info in manager.list_checkpoints()] == [2]
        loaded = manager.load(2)
        assert loaded.load_rank_state(rank)["reader"] == {"position": 100 * rank + 2}


def test_two_ranks_write_their_states_and_one_rank_reads_both(tmp_path: Path) -> None:
    root = str(tmp_path / "checkpoints")
    spawn(save_on_every_rank, args=(2, free_port(), root), nprocs=2, join=True)

    loaded = CheckpointManager(root, FakeGang()).load(2)

    assert loaded.num_ranks == 2 and loaded.metadata.gang_sizes == {"dp": 2}
    assert set(loaded.metadata.files) == {"model.pt", "rank_0.pt", "rank_1.pt"}
    for old_rank in range(2):
        state = loaded.load_rank_state(old_rank)
        assert state["reader"] == {"position": 100 * old_rank + 2}
        assert torch.equal(state["shard"], torch.full((3,), float(old_rank)))
    assert torch.equal(loaded.shared_state["model"]["w"], torch.arange(4.0))


def resume_on_every_rank(rank: int, world_size: int, port: int, root: str, results: str) -> None:
    with gloo_gang(rank, world_size, port) as gang:
        loaded = CheckpointManager(root, gang, gang_sizes={"dp": world_size}).load_newest_intact()
        outcome = "none" if loaded is None else f"{loaded.step} {loaded.load_rank_state(rank)['reader']['position']}"
        Path(results, f"rank_{rank}.txt").write_text(outcome)


def test_a_rank_file_only_one_rank_reads_being_damaged_makes_every_rank_resume_the_previous_checkpoint(
    tmp_path: Path,
) -> None:
    root = str(tmp_path / "checkpoints")
    spawn(save_on_every_rank, args=(2, free_port(), root), nprocs=2, join=True)  # Keeps step 2 only.
    spawn(save_again_on_every_rank, args=(2, free_port(), root), nprocs=2, join=True)  # Steps 2 and 3.
    rank_1_file = tmp_path / "checkpoints" / "step_3" / "rank_1.pt"
    data = bytearray(rank_1_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    rank_1_file.write_bytes(data)
    results = tmp_path / "results"
    results.mkdir()

    spawn(resume_on_every_rank, args=(2, free_port(), root, str(results)), nprocs=2, join=True)

    # Rank 0 read its own intact files of step 3, yet resumes step 2 with rank 1: the ranks agree.
    assert [(results / f"rank_{rank}.txt").read_text() for rank in range(2)] == ["2 2", "2 102"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_2", "step_3.damaged"]
    assert (tmp_path / "checkpoints" / "step_3.damaged" / "rank_1.pt").read_bytes() == bytes(data)


def save_again_on_every_rank(rank: int, world_size: int, port: int, root: str) -> None:
    with gloo_gang(rank, world_size, port) as gang:
        CheckpointManager(root, gang, gang_sizes={"dp": world_size}).save(
            3, {"model": {"w": torch.arange(4.0)}}, rank_state_of(rank, 3)
        )


def fail_async_save_on_rank_1(rank: int, world_size: int, port: int, root: str, results: str) -> None:
    with gloo_gang(rank, world_size, port) as gang:
        manager = CheckpointManager(root, gang, gang_sizes={"dp": world_size}, done_marker_timeout_s=600.0)
        manager.save(1, {"model": {"w": torch.arange(4.0)}}, rank_state_of(rank, 1))
        if rank == 1:
            fs = manager._store.fs
            original_open = fs.open

            def full_disk(path: str, mode: str = "rb", **kwargs: object) -> object:
                if "w" in mode and path.endswith("/rank_1.pt"):
                    raise OSError(errno.ENOSPC, "No space left on device")
                return original_open(path, mode, **kwargs)

            fs.open = full_disk
        start = time.monotonic()
        manager.save(2, {"model": {"w": torch.arange(4.0)}}, rank_state_of(rank, 2), blocking=False)
        try:
            manager.wait()
            outcome = "saved"
        except Exception as ex:
            outcome = f"{type(ex).__name__}: {ex}"
        Path(results, f"rank_{rank}.txt").write_text(f"{time.monotonic() - start:.1f}\n{outcome}")


def test_an_async_save_failing_on_one_rank_fails_on_every_rank_at_once(tmp_path: Path) -> None:
    root = str(tmp_path / "checkpoints")
    results = tmp_path / "results"
    results.mkdir()

    spawn(fail_async_save_on_rank_1, args=(2, free_port(), root, str(results)), nprocs=2, join=True)

    outcomes = [(results / f"rank_{rank}.txt").read_text().split("\n", 1) for rank in range(2)]
    assert outcomes[1][1].startswith("CheckpointWriteError: Could not save the checkpoint of step 2: writing ")
    assert "rank_1.pt failed with [Errno 28] No space left on device" in outcomes[1][1]
    # Rank 0 stops waiting for rank 1's files when rank 1 says it failed, not at the 600 s timeout: far sooner than
    # that under any load.
    assert outcomes[0][1].startswith("RuntimeError: Rank 1 failed to write its files of "), outcomes[0][1]
    assert float(outcomes[0][0]) < 120.0
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_1"]
