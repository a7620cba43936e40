"""A step's agreement among the ranks, summed inside DDP's gradient all-reduce rather than by a collective of its own.

After each backward every rank must know whether every rank's loss was finite (so all step or all skip), whether
any rank was asked to stop (a signal reaches ranks at different times) and the step's targets over all ranks. A gloo
all-reduce of those few floats costs about 1.4 ms on this project's 2-core machine, a tenth of a small CPU step;
appended to the gradients DDP all-reduces anyway, they cost nothing more (``recipes.training.parallel.StepSumsDDP``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

TARGETS_SPLIT = 4096
"""A step's targets are summed as ``targets // 4096`` and ``targets % 4096``: in float32 (the gradients' dtype, in
which DDP's sync sums them) each part's sum stays exact up to 2**24, billions of targets in all."""


def step_stats(loss_sum: torch.Tensor, stop_requested: bool, num_targets: int) -> torch.Tensor:
    """This rank's values to sum, on the loss's device (offering them to the gradient sync reads nothing back):
    whether the loss is not finite, whether a stop was asked, the targets in two parts."""
    not_finite = (~torch.isfinite(loss_sum)).to(torch.float64)
    high, low = divmod(num_targets, TARGETS_SPLIT)
    rest = torch.tensor([float(stop_requested), float(high), float(low)], dtype=torch.float64)
    return torch.cat([not_finite.reshape(1), rest.to(not_finite.device)])


def local_step_stats(loss_sum: float, stop_requested: bool, num_targets: int) -> list[float]:
    """The values of ``step_stats`` as a single process reads them back, without a tensor: building one and
    reading it cost 2% of a small CPU step (``benchmarks/trainer_overhead.py``)."""
    high, low = divmod(num_targets, TARGETS_SPLIT)
    return [float(not math.isfinite(loss_sum)), float(stop_requested), float(high), float(low)]


def read_step_stats(summed: list[float]) -> tuple[bool, bool, float]:
    """From the values summed over the ranks: every loss finite, a stop asked by any rank, the targets of all."""
    return summed[0] == 0, summed[1] > 0, summed[2] * TARGETS_SPLIT + summed[3]


class StepSums:
    """A few values of a step summed over the DP gang inside DDP's gradient all-reduce: one collective fewer a
    step than summing them apart (a gloo all-reduce of 3 floats costs about 1.4 ms, a tenth of a small CPU step).

    The Trainer offers the values before the step's last backward; the hook of DDP's last bucket of that
    backward sends them appended to its gradients, and they are summed once the backward returns. A backward
    that syncs no gradient leaves them unsummed (``take`` returns ``None``), and the caller sums them itself.
    """

    def __init__(self, process_group: dist.ProcessGroup) -> None:
        self._group = process_group
        self._offered: torch.Tensor | None = None
        self._summed: torch.Tensor | None = None

    def offer(self, values: torch.Tensor) -> None:
        """``values`` (float64, 1-D) to sum with the next gradient sync."""
        self._offered, self._summed = values, None

    def take(self) -> torch.Tensor | None:
        """The offered values summed over the gang by the gradient sync since ``offer``, or ``None``."""
        summed, self._offered, self._summed = self._summed, None, None
        return summed

    def hook(self, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        """DDP's default averaging all-reduce of ``bucket`` (the gradients' bits are the same), with the offered
        values appended to the last bucket's. The values ride in the gradients' dtype, so only a float64 or
        float32 bucket takes them (float32 holds integers exactly up to 2**24: counts of a step's targets)."""
        grads: torch.Tensor = bucket.buffer()  # a ``torch.distributed.GradBucket``, which mypy's stubs lack
        offered = self._offered
        if offered is None or not bucket.is_last() or grads.dtype not in (torch.float32, torch.float64):
            return allreduce_hook(self._group, bucket)
        grads.div_(self._group.size())  # as DDP's default hook averages
        joined = torch.cat([grads, offered.to(grads.device, grads.dtype)])

        def split(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            reduced = done.value()[0]
            self._summed = reduced[grads.numel() :].to(torch.float64)
            grads.copy_(reduced[: grads.numel()])
            return grads

        return _all_reduce(joined, self._group).then(split)


def _all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.futures.Future[list[torch.Tensor]]:
    work = dist.all_reduce(tensor, group=group, async_op=True)
    assert work is not None
    future: torch.futures.Future[list[torch.Tensor]] = work.get_future()
    return future
