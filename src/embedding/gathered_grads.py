"""Every rank's gradients of a replicated group, gathered in one collective, so that every replica applies the
same update.

On the CPU, where a training forward sorts its ids, a rank sends each distinct id once with its gradient summed
(:func:`embedding.kernels.cpu.sum_by_id`): a replicated table is small, so a batch repeats its ids often, and
every rank gathers, sorts and sums only the distinct ones. Otherwise each rank sends its ids, its gradient rows
and, only where they say something, the bag of each id (not when every bag holds one id, as for Criteo-style
features) and the ids' scales (not when every scale is 1). Either way, what each rank sends is known at its
forward: the counts and the flags travel then, in the background (:class:`GradLayout`), so that the backward's
one collective starts at once. The rows are written into the send buffer and stay, once gathered, where they
arrived: the fused kernel reads them in place. At global batch 8192 on two ranks of ``dlrm_criteo_tiny``, every
occurrence sent and sorted took about 16 ms of a rank's 175 ms step (under a profiler) outside the collective
(docs/benchmarks.md, "Data-parallel scaling").
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from embedding.sharding import GradRecord
from gang import Gang

# Every block of the buffer starts 8-aligned, so that its int64 and float32 views hold.
_ALIGN = 8


class GradLayout:
    """What every rank of ``gang`` sends in a backward: its gradient rows (bags), its ids, whether it sends
    the bag of each id and whether it sends scales; all-gathered in the background from the moment it is made."""

    def __init__(self, gang: Gang, num_bags: int, num_ids: int, sends_bags: bool, sends_scales: bool) -> None:
        self.num_rows, self.sends_bags = num_bags, sends_bags
        self._gathered = torch.empty((gang.size, 4), dtype=torch.int64, device=gang.device)
        self._local = torch.tensor([num_bags, num_ids, sends_bags, sends_scales], dtype=torch.int64, device=gang.device)
        self._pending = gang.start_all_gather(self._gathered, self._local)

    def wait(self) -> list[_RankBlocks]:
        """Every rank's blocks, in rank order."""
        self._pending.wait()
        return [_RankBlocks(*row) for row in self._gathered.tolist()]


@dataclass(frozen=True)
class LocalGrads:
    """What this rank sends: ``grad_pieces`` (concatenated: a row per bag) and, per id, its row ``ids``, its bag
    (``None``: id ``k`` is bag ``k``) and its scale (``None``: 1)."""

    ids: torch.Tensor
    grad_pieces: Sequence[torch.Tensor]
    bag_of_each_id: torch.Tensor | None
    scales: torch.Tensor | None


def gather_grads(gang: Gang, local: LocalGrads, layout: GradLayout, dim: int) -> GradRecord:
    """Every rank's gradients, as one record in rank order (one all-gather)."""
    blocks = layout.wait()
    width = max(rank.num_bytes(dim) for rank in blocks)
    send = torch.empty(width, dtype=torch.uint8, device=local.ids.device)
    mine = blocks[gang.rank].views(send, dim)
    mine.ids.copy_(local.ids)
    if local.bag_of_each_id is not None:
        mine.bags.copy_(local.bag_of_each_id)
    if local.scales is not None:
        mine.scales.copy_(local.scales)
    torch.cat(list(local.grad_pieces), out=mine.rows)

    gathered = send.new_empty((gang.size, width))
    gang.all_gather(gathered, send)
    views = [rank.views(gathered[index], dim) for index, rank in enumerate(blocks)]
    return GradRecord(
        ids=torch.cat([view.ids for view in views]),
        grad_rows=tuple(view.rows for view in views),
        grad_index=_grad_index(blocks, views),
        grad_scale=_grad_scale(blocks, views),
    )


@dataclass(frozen=True)
class _RankBlocks:
    """The blocks of one rank's buffer, in this order: ids (int64), bags (int64; if sent), scales (float32; if
    sent), gradient rows (float32)."""

    num_bags: int
    num_ids: int
    sends_bags: int
    sends_scales: int

    def num_bytes(self, dim: int) -> int:
        return sum(_aligned(count * dtype.itemsize) for dtype, count in self._blocks(dim))

    def views(self, buffer: torch.Tensor, dim: int) -> _Views:
        """The blocks of ``buffer`` (a rank's bytes), as tensors."""
        start, tensors = 0, []
        for dtype, count in self._blocks(dim):
            tensors.append(buffer[start : start + count * dtype.itemsize].view(dtype))
            start += _aligned(count * dtype.itemsize)
        ids, bags, scales, rows = tensors
        return _Views(ids, bags, scales, rows.view(self.num_bags, dim))

    def _blocks(self, dim: int) -> list[tuple[torch.dtype, int]]:
        """Each block's dtype and number of elements."""
        return [
            (torch.int64, self.num_ids),
            (torch.int64, self.num_ids if self.sends_bags else 0),
            (torch.float32, self.num_ids if self.sends_scales else 0),
            (torch.float32, self.num_bags * dim),
        ]


@dataclass(frozen=True)
class _Views:
    ids: torch.Tensor
    bags: torch.Tensor
    scales: torch.Tensor
    rows: torch.Tensor


def _grad_index(blocks: Sequence[_RankBlocks], views: Sequence[_Views]) -> torch.Tensor:
    """Each id's row among all ranks' gradient rows, read one rank after the other."""
    device = views[0].ids.device
    if not any(rank.sends_bags for rank in blocks):  # id k of the gathered ids is row k
        return torch.arange(sum(rank.num_ids for rank in blocks), device=device)
    first_rows = [0, *itertools.accumulate(rank.num_bags for rank in blocks)]
    return torch.cat(
        [
            (view.bags if rank.sends_bags else torch.arange(rank.num_ids, device=device)) + first_row
            for rank, view, first_row in zip(blocks, views, first_rows)
        ]
    )


def _grad_scale(blocks: Sequence[_RankBlocks], views: Sequence[_Views]) -> torch.Tensor | None:
    if not any(rank.sends_scales for rank in blocks):
        return None
    return torch.cat(
        [
            view.scales if rank.sends_scales else torch.ones(rank.num_ids, device=view.ids.device)
            for rank, view in zip(blocks, views)
        ]
    )


def _aligned(num_bytes: int) -> int:
    return -(-num_bytes // _ALIGN) * _ALIGN


__all__ = ["GradLayout", "LocalGrads", "gather_grads"]
