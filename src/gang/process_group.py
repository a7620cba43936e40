"""A gang over a real ``torch.distributed`` process group (gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup

from gang.gang import Gang, GangError, PendingCollective, ReduceOperation, check_rank

_REDUCE_OPS = {
    ReduceOperation.SUM: dist.ReduceOp.SUM,
    ReduceOperation.PRODUCT: dist.ReduceOp.PRODUCT,
    ReduceOperation.MIN: dist.ReduceOp.MIN,
    ReduceOperation.MAX: dist.ReduceOp.MAX,
}


def backend_for(device: torch.device) -> str:
    """The collective backend for ``device``: NCCL on CUDA, gloo elsewhere."""
    return "nccl" if device.type == "cuda" else "gloo"


class ProcessGroupGang(Gang):
    """A gang backed by a ``torch.distributed`` process group."""

    def __init__(self, pg: ProcessGroup, device: torch.device) -> None:
        self._pg = pg
        self._device = device
        self._rank = dist.get_rank(pg)
        self._size = dist.get_world_size(pg)

    @classmethod
    def init_default(cls, device: torch.device, timeout: timedelta) -> ProcessGroupGang:
        """Initialise the default process group from torchrun's environment and wrap it."""
        if dist.is_initialized():
            raise GangError("The default process group is already initialised; call `init_default` once.")
        dist.init_process_group(backend_for(device), timeout=timeout)
        pg = dist.group.WORLD
        assert pg is not None
        return cls(pg, device)

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    @property
    def device(self) -> torch.device:
        return self._device

    def close(self) -> None:
        dist.destroy_process_group(self._pg)

    def make_gang(self, ranks: Sequence[int]) -> Gang | None:
        for rank in ranks:
            check_rank(rank, self._size)
        global_ranks = [dist.get_global_rank(self._pg, rank) for rank in ranks]
        pg = dist.new_group(global_ranks, backend=backend_for(self._device))
        if self._rank not in ranks:
            return None
        assert pg is not None
        return ProcessGroupGang(pg, self._device)

    def as_process_group(self) -> ProcessGroup:
        return self._pg

    def barrier(self) -> None:
        if self._device.type == "cuda":
            dist.barrier(group=self._pg, device_ids=[self._device.index or 0])
        else:
            dist.barrier(group=self._pg)

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOperation) -> None:
        if op is ReduceOperation.MEAN:
            # gloo has no AVG; a sum divided by the size is the same mean on every backend.
            dist.all_reduce(tensor, dist.ReduceOp.SUM, group=self._pg)
            tensor.div_(self._size)
        else:
            dist.all_reduce(tensor, _REDUCE_OPS[op], group=self._pg)

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        self._check_gather_shape(output, input)
        dist.all_gather(list(output.unbind(0)), input.contiguous(), group=self._pg)

    def start_all_gather(self, output: torch.Tensor, input: torch.Tensor) -> PendingCollective:
        self._check_gather_shape(output, input)
        work: PendingCollective | None = dist.all_gather(
            list(output.unbind(0)), input.contiguous(), group=self._pg, async_op=True
        )
        assert work is not None, "An asynchronous collective returns its work."
        return work

    def _check_gather_shape(self, output: torch.Tensor, input: torch.Tensor) -> None:
        if output.shape != (self._size, *input.shape):
            raise ValueError(
                f"`output` must have shape {(self._size, *input.shape)}, but has {tuple(output.shape)} instead."
            )

    def all_to_all(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
    ) -> None:
        dist.all_to_all_single(
            output,
            input.contiguous(),
            output_split_sizes=None if output_split_sizes is None else list(output_split_sizes),
            input_split_sizes=None if input_split_sizes is None else list(input_split_sizes),
            group=self._pg,
        )

    def broadcast(self, tensor: torch.Tensor, source_rank: int = 0) -> None:
        check_rank(source_rank, self._size)
        dist.broadcast(tensor, dist.get_global_rank(self._pg, source_rank), group=self._pg)

    def all_gather_object(self, obj: Any) -> list[Any]:
        output: list[Any] = [None] * self._size
        dist.all_gather_object(output, obj, group=self._pg)
        return output
