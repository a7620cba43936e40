"""How the readers split rows into optimizer steps and data-parallel shards.

Every reader cuts its (possibly shuffled) row stream into *global steps* of
``dp_size * num_accumulate * batch_size`` rows. Within a global step, row ``i`` goes to rank
``i % dp_size``, and each rank splits its rows into ``num_accumulate`` micro-batches in order.

That dealing rule is a contract, not a detail: since a global step is a multiple of
``dp_size`` rows, it means that over a whole epoch the ``p``-th row of the epoch's order is
row ``p // dp_size`` of rank ``p % dp_size``'s epoch. Whatever gathers the ranks' per-row
outputs (predictions, say) restores the epoch's order by taking one row from each rank in
turn, without knowing the batch size or where steps begin.

What happens to a trailing run of rows too short for a whole global step is the reader's
``drop_last`` choice:

- ``drop_last=True`` (training): the rows are dropped, for every rank at once, so that every
  step is full. Every rank sees the same number of steps per epoch without talking to the
  others, and every kept row goes to exactly one rank.
- ``drop_last=False`` (validation, prediction: every row must be scored): the rows form one
  last, smaller global step, dealt by the same rule. Every rank still gets that step, since
  ranks run collectives (embedding all-to-alls) in lockstep; a rank that the rule gives no row
  gets micro-batches of zero rows, which models must accept.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class StepLayout:
    """The shape of one optimizer step, which part of it this rank reads, and what becomes of
    the rows that fill no whole step (see the module's docstring for the dealing contract).

    In a short last step (``drop_last=False``), each rank splits its rows, in order, into
    ``num_accumulate`` micro-batches as even as can be (sizes differ by at most one, the larger
    first) rather than filling whole micro-batches first: no micro-batch exceeds ``batch_size``,
    and one is empty only when the rank holds fewer rows than ``num_accumulate``.
    """

    batch_size: int
    num_accumulate: int
    dp_rank: int
    dp_size: int
    drop_last: bool = True

    def __post_init__(self) -> None:
        for name in ("batch_size", "num_accumulate", "dp_size"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"`{name}` must be at least 1, but is {value} instead.")
        if not 0 <= self.dp_rank < self.dp_size:
            raise ValueError(f"`dp_rank` must be in [0, {self.dp_size}), but is {self.dp_rank} instead.")

    @property
    def rows_per_rank_step(self) -> int:
        return self.batch_size * self.num_accumulate

    @property
    def rows_per_global_step(self) -> int:
        return self.rows_per_rank_step * self.dp_size

    def num_steps(self, num_rows: int) -> int:
        """The global steps ``num_rows`` rows make: the same on every rank."""
        full_steps, rest = divmod(num_rows, self.rows_per_global_step)
        return full_steps + int(rest > 0 and not self.drop_last)

    def num_dropped_rows(self, num_rows: int) -> int:
        """How many of ``num_rows`` rows no step serves."""
        return num_rows % self.rows_per_global_step if self.drop_last else 0

    def rank_rows(self, global_step_rows: npt.NDArray[np.int64]) -> list[npt.NDArray[np.int64]]:
        """This rank's micro-batches (as row indices) of one global step's rows."""
        num_rows = len(global_step_rows)
        mine = global_step_rows[self.dp_rank :: self.dp_size]
        if num_rows == self.rows_per_global_step:
            return [mine[i * self.batch_size : (i + 1) * self.batch_size] for i in range(self.num_accumulate)]
        if self.drop_last or not 0 < num_rows < self.rows_per_global_step:
            raise AssertionError(
                "A global step must hold exactly `rows_per_global_step` rows, or fewer (but some) "
                "for the last step when `drop_last` is False."
            )
        return np.array_split(mine, self.num_accumulate)

    def describe_step(self) -> str:
        """How many rows a step takes, and why: for a message about data too small to fill one."""
        return (
            f"a step takes {self.rows_per_global_step} rows (`batch_size` {self.batch_size} per rank x "
            f"{self.num_accumulate} micro-batches (`trainer.grad_accumulation`) x {self.dp_size} data-parallel ranks)"
        )

    def log_dropped_rows(self, logger: logging.Logger, epoch: int, num_dropped: int) -> None:
        """Says, once an epoch has ended, what it dropped: a training run that quietly never
        sees some rows (the same ones each epoch, without shuffling) should be told."""
        if num_dropped <= 0:
            return
        logger.info(
            "Data epoch %d dropped its last %d rows: they fill no whole global step of %d rows "
            "(dp_size %d x num_accumulate %d x batch_size %d), and `drop_last` keeps every step full.",
            epoch,
            num_dropped,
            self.rows_per_global_step,
            self.dp_size,
            self.num_accumulate,
            self.batch_size,
        )


def window_permutation(num_rows: int, seed: int, epoch: int, window_index: int) -> npt.NDArray[np.int64]:
    """The shuffle order of one window of rows; the same on every rank and on every resume."""
    rng = np.random.default_rng([seed, epoch, window_index])
    return rng.permutation(num_rows).astype(np.int64)
