"""A gang of one process that needs no ``torch.distributed`` initialisation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.distributed import ProcessGroup

from gang.gang import Gang, GangError, PendingCollective, ReduceOperation, check_rank


class FakeGang(Gang):
    """The gang of a single process: every collective is the identity.

    It lets single-process training run the same code path as a distributed job without
    calling ``init_process_group``.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self._device = torch.device(device)

    @property
    def rank(self) -> int:
        return 0

    @property
    def size(self) -> int:
        return 1

    @property
    def device(self) -> torch.device:
        return self._device

    def close(self) -> None:
        pass

    def make_gang(self, ranks: Sequence[int]) -> Gang | None:
        for rank in ranks:
            check_rank(rank, 1)
        return self if ranks else None

    def as_process_group(self) -> ProcessGroup:
        raise GangError("A `FakeGang` has no process group; it stands for one process without torch.distributed.")

    def barrier(self) -> None:
        pass

    def all_reduce(self, tensor: torch.Tensor, op: ReduceOperation) -> None:
        pass  # The reduction of one tensor is that tensor, whatever the operation.

    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        output.copy_(input.unsqueeze(0))

    def start_all_gather(self, output: torch.Tensor, input: torch.Tensor) -> PendingCollective:
        self.all_gather(output, input)
        return _Done()

    def all_to_all(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
    ) -> None:
        output.copy_(input)

    def broadcast(self, tensor: torch.Tensor, source_rank: int = 0) -> None:
        check_rank(source_rank, 1)

    def all_gather_object(self, obj: Any) -> list[Any]:
        return [obj]


class _Done:
    """A collective of one process, done when it starts."""

    def wait(self) -> None:
        pass
