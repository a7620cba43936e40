"""ProcessGroupGang over real gloo processes: a collective started in the background and waited for later."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import spawn as mp_spawn

from gang import ProcessGroupGang, ReduceOperation


def _worker(rank: int, world_size: int, port: int, out: Path) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        assert dist.group.WORLD is not None
        gang = ProcessGroupGang(dist.group.WORLD, torch.device("cpu"))
        gathered = torch.empty(world_size, 3, dtype=torch.int64)
        pending = gang.start_all_gather(gathered, torch.tensor([rank, 10 * rank, 7]))
        reduced = torch.tensor([rank + 1.0])
        gang.all_reduce(reduced, ReduceOperation.SUM)  # another collective while the first is in flight
        pending.wait()
        try:
            gang.start_all_gather(torch.empty(world_size + 1, 3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))
            shape_error = ""
        except ValueError as ex:
            shape_error = str(ex)
        torch.save({"gathered": gathered, "reduced": reduced, "shape_error": shape_error}, out / f"rank_{rank}.pt")
    finally:
        dist.barrier()
        dist.destroy_process_group()
    os._exit(0)  # skip the interpreter's teardown, where gloo sometimes aborts


@pytest.mark.slow
def test_a_started_all_gather_completes_beside_a_blocking_collective(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    mp_spawn(_worker, args=(2, port, tmp_path), nprocs=2)

    for rank in (0, 1):
        result = torch.load(tmp_path / f"rank_{rank}.pt")
        assert torch.equal(result["gathered"], torch.tensor([[0, 0, 7], [1, 10, 7]]))
        assert torch.equal(result["reduced"], torch.tensor([3.0]))
        assert result["shape_error"] == "`output` must have shape (2, 3), but has (3, 3) instead."
