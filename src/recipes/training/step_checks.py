"""What the Trainer checks of a recipe's train unit and train reader as it steps: slips that would train
without an error and give another result.

- Every micro-batch, the unit's loss: it must be unreduced, one element per target (``TrainUnit``). A mean
  trains with a gradient ``batch size`` times too small, and the ``(summed loss, targets)`` pair of old is no
  loss at all; both are refused in one line that says what to return. The loss is summed and counted here,
  for the Trainer to divide by the step's targets, so no other reduction can slip through.
- At the first step, over the data-parallel ranks: that they read different rows (a reader that ignores
  ``dp_rank``/``dp_size`` gives every rank the same batches: a smaller data set, seen ``dp_size`` times), and,
  where the config types its train batch size ``recipes.GlobalBatchSize``, that every micro-batch holds the
  rank's share of it (a reader that ignores ``per_rank_batch_size`` trains on larger batches). Each rank
  hashes its step's batches before the unit sees them (a model may change ids in place) and counts the rows
  of their losses; one all-gather of those few numbers, at the first step's last forward pass, tells every
  rank the same, so all stop together with the same line, before any optimizer step or checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import torch

from gang import Gang
from recipes.errors import ConfigError, UserError
from units import TrainUnit

BatchT = TypeVar("BatchT")

_WHAT_TO_RETURN = (
    "a TrainUnit returns the unreduced loss, one element per target "
    '(`binary_cross_entropy_with_logits(logits, labels, reduction="none")`), which the Trainer sums and counts'
)


@dataclass(frozen=True)
class ConfiguredBatchSize:
    """The train batch size the first step checks: the config's field typed ``GlobalBatchSize`` (``batch_size.py``)."""

    key: str
    """The dotted config key (``dataset.batch_size``)."""
    size: int
    """The rows of a train micro-batch over all data-parallel ranks together."""

    def per_rank(self, dp_size: int) -> int:
        """Each data-parallel rank's rows of a train micro-batch."""
        if self.size % dp_size != 0:
            raise ConfigError(
                f"`{self.key}` must be a multiple of the {dp_size} data-parallel ranks, but is {self.size} instead."
            )
        return self.size // dp_size


@dataclass
class _FirstStep:
    """What a rank saw of the first step's micro-batches so far."""

    digest: hashlib.blake2b = field(default_factory=lambda: hashlib.blake2b(digest_size=8))
    has_tensors: bool = False
    rows: list[int] = field(default_factory=list)


class StepChecks(Generic[BatchT]):
    """Runs the train unit on a micro-batch, checks what it returns and reduces it: the sum of its loss and the
    number of targets, for the Trainer to divide by the step's; at the first step, the ranks' batches too."""

    def __init__(self, unit: TrainUnit[BatchT], dp: Gang, batch_size: ConfiguredBatchSize | None) -> None:
        self._unit = unit
        self._dp = dp
        self._batch_size = batch_size
        self._first_step: _FirstStep | None = _FirstStep()

    def summed_loss(self, batch: BatchT, is_last: bool) -> tuple[torch.Tensor, int]:
        """The unit's loss of ``batch``, a micro-batch of a step (``is_last``: its last), summed, and its targets."""
        first = self._first_step
        if first is not None:
            for tensor in _tensors(batch):
                _hash_tensor(first.digest, tensor)
                first.has_tensors = True
        loss = self._unreduced(self._unit(batch))
        if first is not None:
            first.rows.append(loss.shape[0])
            if is_last:
                self._first_step = None
                self._check_ranks(first)
        return loss.sum(), loss.numel()

    def _unreduced(self, returned: object) -> torch.Tensor:
        unit = type(self._unit).__name__
        if isinstance(returned, tuple):
            raise UserError(f"The train unit {unit} returned a tuple, but {_WHAT_TO_RETURN}.")
        if not isinstance(returned, torch.Tensor):
            raise UserError(f"The train unit {unit} returned a {type(returned).__name__}, but {_WHAT_TO_RETURN}.")
        if returned.dim() == 0:
            raise UserError(
                f"The train unit {unit} returned a 0-dim loss (a mean or a sum: torch's default reduction), "
                f"but {_WHAT_TO_RETURN}."
            )
        return returned

    def _check_ranks(self, first: _FirstStep) -> None:
        """Every rank's first step, gathered: different rows on each, of the configured size."""
        digest = int.from_bytes(first.digest.digest(), "little", signed=True)
        mine = torch.tensor([first.has_tensors, digest, min(first.rows), max(first.rows)], dtype=torch.int64)
        gathered = torch.empty((self._dp.size, 4), dtype=torch.int64, device=self._dp.device)
        self._dp.all_gather(gathered, mine.to(self._dp.device))
        ranks = gathered.tolist()
        problems = [self._same_rows(ranks), self._wrong_sizes(ranks)]
        if any(problems):
            raise UserError(" ".join(f"At the first step, {problem}." for problem in problems if problem))

    def _same_rows(self, ranks: list[list[int]]) -> str | None:
        by_digest: dict[int, list[int]] = {}
        for rank, (has_tensors, digest, _, _) in enumerate(ranks):
            if has_tensors:
                by_digest.setdefault(digest, []).append(rank)
        same = next((group for group in by_digest.values() if len(group) > 1), None)
        if same is None:
            return None
        ranks_named = f"{', '.join(map(str, same[:-1]))} and {same[-1]}"
        return (
            f"data-parallel ranks {ranks_named} read the same batches: the train reader must split the rows by "
            "`context.gangs.dp.rank` and `context.gangs.dp.size`"
        )

    def _wrong_sizes(self, ranks: list[list[int]]) -> str | None:
        if self._batch_size is None:
            return None
        expected = self._batch_size.per_rank(self._dp.size)
        held = [
            f"rank {rank}: {low}" if low == high else f"rank {rank}: {low} to {high}"
            for rank, (_, _, low, high) in enumerate(ranks)
            if (low, high) != (expected, expected)
        ]
        if not held:
            return None
        key, size, dp_size = self._batch_size.key, self._batch_size.size, self._dp.size
        return (
            f"the train loss has the wrong number of rows a micro-batch ({', '.join(held)}): `{key}`={size} over "
            f"{dp_size} data-parallel rank(s) makes {expected}; the train reader must read "
            f"`per_rank_batch_size(config.{key}, context.gangs.dp.size)` rows, and the train unit return one "
            "loss row per batch row"
        )


def _tensors(value: object) -> Iterator[torch.Tensor]:
    """The tensors of a batch, through dataclasses, mappings (sparse features too), lists and tuples."""
    if isinstance(value, torch.Tensor):
        yield value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for part in dataclasses.fields(value):
            yield from _tensors(getattr(value, part.name))
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _hash_tensor(digest: hashlib.blake2b, tensor: torch.Tensor) -> None:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    digest.update(f"{flat.dtype}{tuple(tensor.shape)}".encode())
    digest.update(flat.view(torch.uint8).numpy().tobytes())
