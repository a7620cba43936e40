"""ProcessGroupGang over real gloo processes: a collective started in the background and waited for later."""

from __future__ import annotations

from pathlib import Path

import torch

from gang import ReduceOperation
from support.gloo_jobs import free_port, gloo_gang, start_ranks


def _worker(rank: int, world_size: int, port: int, out: Path) -> None:
    with gloo_gang(rank, world_size, port) as gang:
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


def test_a_started_all_gather_completes_beside_a_blocking_collective(tmp_path: Path) -> None:
    start_ranks(_worker, (2, free_port(), tmp_path), 2)

    for rank in (0, 1):
        result = torch.load(tmp_path / f"rank_{rank}.pt")
        assert torch.equal(result["gathered"], torch.tensor([[0, 0, 7], [1, 10, 7]]))
        assert torch.equal(result["reduced"], torch.tensor([3.0]))
        assert result["shape_error"] == "`output` must have shape (2, 3), but has (3, 3) instead."
