from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import spawn

from checkpoint import CheckpointManager, CheckpointPolicy
from gang import FakeGang, ProcessGroupGang


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rank_state_of(rank: int, step: int) -> dict[str, object]:
    return {"reader": {"position": 100 * rank + step}, "shard": torch.full((3,), float(rank))}


def save_on_every_rank(rank: int, world_size: int, port: int, root: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        assert dist.group.WORLD is not None
        gang = ProcessGroupGang(dist.group.WORLD, torch.device("cpu"))
        manager = CheckpointManager(root, gang, CheckpointPolicy(keep_last_n=1), gang_sizes={"dp": world_size})
        shared = {"model": {"w": torch.arange(4.0)}}
        manager.save(1, shared, rank_state_of(rank, 1))
        manager.save(2, shared, rank_state_of(rank, 2), blocking=False)
        manager.wait()
        # Every rank sees the committed checkpoint once wait() returns, and the pruned one is gone.
        assert [info.step for info in manager.list_checkpoints()] == [2]
        loaded = manager.load(2)
        assert loaded.load_rank_state(rank)["reader"] == {"position": 100 * rank + 2}
    finally:
        dist.barrier()  # No rank tears down gloo while a peer still talks to it.
        dist.destroy_process_group()


@pytest.mark.slow
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
