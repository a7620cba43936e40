"""DDP's gradient sync also sums the Trainer's per-step values (``StepSums``) on a real 2-process gloo gang: the
gradients are DDP's own, bit for bit, and the values are summed over the ranks; a backward whose gradient sync is
skipped (accumulation) sums nothing."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from recipes.training.parallel import StepSumsDDP, step_sums
from support.gloo_jobs import free_port, gloo_gang, start_ranks


def model() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP requires
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 1))


def backward(ddp: nn.Module, rank: int) -> None:
    inputs = torch.randn(8, 6, generator=torch.Generator().manual_seed(rank))
    ddp(inputs).square().sum().backward()


def sum_on_two_ranks(rank: int, world_size: int, port: int, out_dir: str) -> None:
    with gloo_gang(rank, world_size, port) as gang:
        group = gang.as_process_group()
        plain = DistributedDataParallel(model(), process_group=group)
        summing = StepSumsDDP(model(), process_group=group)
        sums = step_sums(summing)
        assert sums is not None and step_sums(plain) is None

        backward(plain, rank)
        sums.offer(torch.tensor([rank + 1.0, 10.0 * rank, 0.5], dtype=torch.float64))
        backward(summing, rank)
        summed = sums.take()
        same = all(torch.equal(a.grad, b.grad) for a, b in zip(plain.parameters(), summing.parameters()))

        with summing.no_sync():  # an accumulation micro-batch: no sync, nothing summed
            sums.offer(torch.tensor([1.0, 1.0, 1.0], dtype=torch.float64))
            backward(summing, rank)
        unsynced = sums.take()
        result = {"summed": None if summed is None else summed.tolist(), "same": same, "unsynced": unsynced}
        Path(out_dir, f"rank_{rank}.json").write_text(json.dumps(result))


def test_the_gradient_sync_sums_the_offered_values_and_leaves_the_gradients_ddps(tmp_path: Path) -> None:
    start_ranks(sum_on_two_ranks, (2, free_port(), str(tmp_path)), world_size=2)

    for rank in range(2):
        result = json.loads((tmp_path / f"rank_{rank}.json").read_text())
        assert result == {"summed": [3.0, 10.0, 1.0], "same": True, "unsynced": None}
