"""The ``Gang`` protocol: a set of processes that run collectives together.

A gang hides ``torch.distributed`` process groups behind one small interface so that
the rest of the framework is written once for one process and for many. The names follow
fairseq2's gangs: the root gang holds every process, the DP gang the replicas of one model
shard, the TP gang the shards of one replica.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from enum import Enum
from typing import Any, Protocol

import torch
from torch.distributed import ProcessGroup


class ReduceOperation(Enum):
    """How ``Gang.all_reduce`` combines the tensors of its ranks."""

    SUM = "sum"
    MEAN = "mean"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"


class PendingCollective(Protocol):
    """A collective started and not yet waited for."""

    def wait(self) -> Any:
        """Block until the collective is done on this rank."""


class GangError(RuntimeError):
    """A gang could not be set up or used."""


class Gang(ABC):
    """A set of processes that take part in the same collective operations."""

    @property
    @abstractmethod
    def rank(self) -> int:
        """This process's index in the gang, from 0 to ``size - 1``."""

    @property
    @abstractmethod
    def size(self) -> int:
        """The number of processes in the gang."""

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """The device that the gang's collectives run on."""

    @abstractmethod
    def close(self) -> None:
        """Release the gang's resources; the gang is unusable afterwards."""

    @abstractmethod
    def make_gang(self, ranks: Sequence[int]) -> Gang | None:
        """Make a sub-gang of ``ranks``.

        Every process of the job must call it, at the same point, even the processes outside this
        gang (torch creates a process group by a call of every process, in the same order); the
        ranks of this gang not in ``ranks`` get ``None``.
        """

    @abstractmethod
    def as_process_group(self) -> ProcessGroup:
        """The underlying process group, for torch APIs such as DDP that need one."""

    @abstractmethod
    def barrier(self) -> None:
        """Wait until every rank has reached this point."""

    @abstractmethod
    def all_reduce(self, tensor: torch.Tensor, op: ReduceOperation) -> None:
        """Reduce ``tensor`` over the gang, in place, on every rank."""

    @abstractmethod
    def all_gather(self, output: torch.Tensor, input: torch.Tensor) -> None:
        """Gather ``input`` from every rank into ``output``, of shape ``[size, *input.shape]``."""

    @abstractmethod
    def start_all_gather(self, output: torch.Tensor, input: torch.Tensor) -> PendingCollective:
        """Start :meth:`all_gather` and return at once; ``output`` holds the result once ``wait`` returns.

        Its latency then passes while the rank computes. Every rank still starts it at the same point
        of its sequence of collectives, and neither tensor may change before ``wait``.
        """

    @abstractmethod
    def all_to_all(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int] | None = None,
        input_split_sizes: Sequence[int] | None = None,
    ) -> None:
        """Scatter slices of ``input`` (along dim 0) to every rank and gather theirs into ``output``.

        Slice ``k`` of ``input`` (``input_split_sizes[k]`` rows) goes to rank ``k``;
        slice ``k`` of ``output`` comes from rank ``k``. Without split sizes, every slice
        has ``len / size`` rows.
        """

    @abstractmethod
    def broadcast(self, tensor: torch.Tensor, source_rank: int = 0) -> None:
        """Copy ``tensor`` from ``source_rank`` to every rank, in place."""

    @abstractmethod
    def all_gather_object(self, obj: Any) -> list[Any]:
        """Gather one picklable object from every rank, in rank order."""

    def broadcast_object(self, obj: Any, source_rank: int = 0) -> Any:
        """Return ``source_rank``'s ``obj`` on every rank."""
        return self.all_gather_object(obj)[source_rank]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size}, device={self.device})"


def check_rank(rank: int, size: int) -> None:
    """Raise if ``rank`` is not a valid rank of a gang of ``size`` processes."""
    if not 0 <= rank < size:
        raise ValueError(f"`rank` must be in [0, {size}), but is {rank} instead.")
