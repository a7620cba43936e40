"""How the readers split rows into optimizer steps and data-parallel shards.

Every reader cuts its (possibly shuffled) row stream into *global steps* of
``dp_size * num_accumulate * batch_size`` rows. Within a global step, row ``i`` goes to rank
``i % dp_size``, and each rank splits its ``num_accumulate * batch_size`` rows into
``num_accumulate`` micro-batches in order. A trailing run of rows too short for a whole global
step is dropped, for every rank at once: so every rank sees the same number of steps per epoch
without talking to the others, and every kept row goes to exactly one rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class StepLayout:
    """The shape of one optimizer step, and which part of it this rank reads."""

    batch_size: int
    num_accumulate: int
    dp_rank: int
    dp_size: int

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

    def rank_rows(self, global_step_rows: npt.NDArray[np.int64]) -> list[npt.NDArray[np.int64]]:
        """This rank's micro-batches (as row indices) of one global step's rows."""
        if len(global_step_rows) != self.rows_per_global_step:
            raise AssertionError("A global step must hold exactly `rows_per_global_step` rows.")
        mine = global_step_rows[self.dp_rank :: self.dp_size]
        return [mine[i * self.batch_size : (i + 1) * self.batch_size] for i in range(self.num_accumulate)]


def window_permutation(num_rows: int, seed: int, epoch: int, window_index: int) -> npt.NDArray[np.int64]:
    """The shuffle order of one window of rows; the same on every rank and on every resume."""
    rng = np.random.default_rng([seed, epoch, window_index])
    return rng.permutation(num_rows).astype(np.int64)
