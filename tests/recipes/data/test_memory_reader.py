"""InMemoryReader: DP sharding, equal steps per rank, exact resume, epochs."""

from __future__ import annotations

import pytest
import torch

from recipes.data.memory import InMemoryReader


def identity(indices: torch.Tensor) -> torch.Tensor:
    return indices


def read_epoch(reader: InMemoryReader[torch.Tensor]) -> list[list[torch.Tensor]]:
    return list(reader)


def flat(steps: list[list[torch.Tensor]]) -> list[int]:
    return [int(i) for batches in steps for batch in batches for i in batch]


@pytest.mark.parametrize("dp_size", [1, 2, 3])
def test_dp_shards_cover_every_sample_once_with_equal_step_counts(dp_size: int) -> None:
    # 24 samples, steps of batch 2 x accumulation 2: 24 / dp_size samples per rank, a whole number of steps.
    readers = [
        InMemoryReader(identity, 24, batch_size=2, num_accumulate=2, dp_rank=rank, dp_size=dp_size, seed=5)
        for rank in range(dp_size)
    ]

    epochs = [read_epoch(reader) for reader in readers]

    assert len({len(steps) for steps in epochs}) == 1, "every rank runs the same number of steps"
    assert all(len(batches) == 2 and all(len(b) == 2 for b in batches) for steps in epochs for batches in steps)
    seen = [i for steps in epochs for i in flat(steps)]
    assert sorted(seen) == list(range(24))


def test_the_tail_that_fills_no_step_is_dropped_on_every_rank_alike() -> None:
    # 23 samples over 2 ranks: 11 per rank, steps of 4 -> 2 steps per rank, 3 samples per rank dropped.
    readers = [InMemoryReader(identity, 23, batch_size=4, dp_rank=rank, dp_size=2) for rank in range(2)]

    epochs = [read_epoch(reader) for reader in readers]

    assert [len(steps) for steps in epochs] == [2, 2]
    assert readers[0].steps_per_epoch == 2
    seen = flat(epochs[0]) + flat(epochs[1])
    assert len(seen) == len(set(seen)) == 16


def test_shuffle_changes_the_order_per_epoch_and_reset_advances_the_epoch() -> None:
    reader = InMemoryReader(identity, 32, batch_size=8, seed=1)

    first = flat(read_epoch(reader))
    with pytest.raises(StopIteration):
        next(reader)
    reader.reset()
    second = flat(read_epoch(reader))

    assert sorted(first) == sorted(second) == list(range(32))
    assert first != second
    assert reader.state_dict() == {"epoch": 1, "step": 4}


def test_without_shuffle_the_order_is_the_index_order() -> None:
    reader = InMemoryReader(identity, 6, batch_size=3, shuffle=False)

    assert flat(read_epoch(reader)) == [0, 1, 2, 3, 4, 5]


def test_state_dict_resumes_at_the_exact_next_batch() -> None:
    def make() -> InMemoryReader[torch.Tensor]:
        return InMemoryReader(identity, 40, batch_size=2, num_accumulate=2, dp_rank=1, dp_size=2, seed=3)

    uninterrupted = make()
    next(uninterrupted)
    uninterrupted.reset()  # Into epoch 1, whose order differs from epoch 0.
    next(uninterrupted)
    state = uninterrupted.state_dict()
    expected = flat(read_epoch(uninterrupted))

    resumed = make()
    resumed.load_state_dict(state)

    assert state == {"epoch": 1, "step": 1}
    assert flat(read_epoch(resumed)) == expected


def test_a_batch_size_below_one_is_an_error() -> None:
    with pytest.raises(ValueError, match="`batch_size` must be >= 1, but is 0 instead"):
        InMemoryReader(identity, 10, batch_size=0)
