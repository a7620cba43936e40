"""InMemoryReader: DP sharding, equal steps per rank, the last step kept or dropped, exact resume, epochs."""

from __future__ import annotations

import logging

import pytest
import torch

from recsys.data.memory import InMemoryReader


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


def rank_sequences(epochs: list[list[list[torch.Tensor]]]) -> list[list[int]]:
    """Each rank's indices over an epoch, in the order it read them."""
    return [flat(steps) for steps in epochs]


def interleave(per_rank: list[list[int]]) -> list[int]:
    """The epoch's order back from the ranks' reads: index ``p`` is rank ``p % dp``'s ``p // dp``-th."""
    dp_size = len(per_rank)
    return [per_rank[p % dp_size][p // dp_size] for p in range(sum(len(reads) for reads in per_rank))]


@pytest.mark.parametrize("num_accumulate", [1, 2])
@pytest.mark.parametrize("dp_size", [1, 2, 3])
@pytest.mark.parametrize("num_samples", [23, 24, 25, 37])
def test_without_drop_last_the_ranks_read_every_sample_once_in_the_dealing_order(
    num_samples: int, dp_size: int, num_accumulate: int
) -> None:
    readers = [
        InMemoryReader(
            identity,
            num_samples,
            batch_size=2,
            num_accumulate=num_accumulate,
            dp_rank=rank,
            dp_size=dp_size,
            shuffle=False,
            drop_last=False,
        )
        for rank in range(dp_size)
    ]

    epochs = [read_epoch(reader) for reader in readers]

    num_steps = -(-num_samples // (2 * num_accumulate * dp_size))
    assert [len(steps) for steps in epochs] == [num_steps] * dp_size
    assert {reader.steps_per_epoch for reader in readers} == {num_steps}
    assert all(len(batches) == num_accumulate for steps in epochs for batches in steps)
    assert interleave(rank_sequences(epochs)) == list(range(num_samples))


@pytest.mark.parametrize("dp_size", [1, 2, 3])
def test_without_drop_last_a_shuffled_epoch_is_its_permutation_dealt_out(dp_size: int) -> None:
    readers = [
        InMemoryReader(identity, 29, batch_size=3, dp_rank=rank, dp_size=dp_size, seed=4, drop_last=False)
        for rank in range(dp_size)
    ]
    for reader in readers:
        reader.reset()  # Epoch 1: its permutation is drawn from seed + 1.

    order = interleave(rank_sequences([read_epoch(reader) for reader in readers]))

    assert order == torch.randperm(29, generator=torch.Generator().manual_seed(5)).tolist()


def test_a_rank_the_short_last_step_does_not_reach_reads_zero_row_batches() -> None:
    # 25 samples, steps of 3 ranks x 4: two full steps, then one sample, for rank 0 only.
    readers = [
        InMemoryReader(identity, 25, batch_size=4, dp_rank=rank, dp_size=3, shuffle=False, drop_last=False)
        for rank in range(3)
    ]

    last_steps = [read_epoch(reader)[-1] for reader in readers]

    assert [[batch.tolist() for batch in step] for step in last_steps] == [[[24]], [[]], [[]]]
    assert all(batch.dtype == torch.int64 for step in last_steps for batch in step)


@pytest.mark.parametrize(
    ("num_samples", "expected"),
    [
        # 30 samples, steps of 2 ranks x 2 micro-batches x 4: 14 left, 7 a rank, split 4 + 3.
        (30, [[4, 3], [4, 3]]),
        # 19 samples: 3 left, 2 for rank 0 (one per micro-batch), 1 for rank 1.
        (19, [[1, 1], [1, 0]]),
        # 17 samples: 1 left, for rank 0's first micro-batch.
        (17, [[1, 0], [0, 0]]),
    ],
)
def test_with_accumulation_the_short_last_step_splits_each_rank_s_rows_evenly(
    num_samples: int, expected: list[list[int]]
) -> None:
    readers = [
        InMemoryReader(
            identity,
            num_samples,
            batch_size=4,
            num_accumulate=2,
            dp_rank=rank,
            dp_size=2,
            shuffle=False,
            drop_last=False,
        )
        for rank in range(2)
    ]

    epochs = [read_epoch(reader) for reader in readers]

    assert [[len(batch) for batch in steps[-1]] for steps in epochs] == expected
    assert interleave(rank_sequences(epochs)) == list(range(num_samples))


@pytest.mark.parametrize("stop_after", [0, 1, 2, 3, 4])
def test_without_drop_last_state_dict_resumes_at_the_exact_next_batch(stop_after: int) -> None:
    def make() -> InMemoryReader[torch.Tensor]:
        # 25 samples, steps of 8: three full steps and a short one of a single sample.
        return InMemoryReader(identity, 25, batch_size=2, num_accumulate=2, dp_rank=1, dp_size=2, drop_last=False)

    uninterrupted = make()
    uninterrupted.reset()
    expected = read_epoch(uninterrupted)

    interrupted = make()
    interrupted.reset()
    head = [next(interrupted) for _ in range(stop_after)]
    resumed = make()
    resumed.load_state_dict(interrupted.state_dict())

    assert flat(head + read_epoch(resumed)) == flat(expected)
    assert [len(batch) for batch in expected[-1]] == [0, 0], "rank 1 gets nothing of the last sample"


def test_drop_last_deals_as_it_always_did() -> None:
    # Rank r reads every dp_size-th index of the permutation from r, cut into whole steps.
    num_samples, batch_size, num_accumulate, dp_size, seed = 53, 3, 2, 3, 8
    for rank in range(dp_size):
        reader = InMemoryReader(identity, num_samples, batch_size, num_accumulate, rank, dp_size, seed=seed)
        order = torch.randperm(num_samples, generator=torch.Generator().manual_seed(seed))
        mine = order[rank::dp_size][: num_samples // dp_size]
        num_steps = len(mine) // (batch_size * num_accumulate)
        expected = [
            [mine[(s * num_accumulate + m) * batch_size :][:batch_size].tolist() for m in range(num_accumulate)]
            for s in range(num_steps)
        ]

        assert [[batch.tolist() for batch in step] for step in read_epoch(reader)] == expected


def test_drop_last_logs_once_per_epoch_how_many_samples_it_dropped(caplog: pytest.LogCaptureFixture) -> None:
    # 23 samples, steps of 2 ranks x 4: 7 dropped every epoch.
    reader = InMemoryReader(identity, 23, batch_size=4, dp_rank=1, dp_size=2)

    with caplog.at_level(logging.INFO, logger="recsys.data.memory"):
        read_epoch(reader)
        with pytest.raises(StopIteration):
            next(reader)
        reader.reset()
        read_epoch(reader)

    messages = [record.getMessage() for record in caplog.records]
    assert all(record.levelno == logging.INFO for record in caplog.records)
    assert [message.split(":")[0] for message in messages] == [
        "Data epoch 0 dropped its last 7 rows",
        "Data epoch 1 dropped its last 7 rows",
    ]
    assert "global step of 8 rows (dp_size 2 x num_accumulate 1 x batch_size 4)" in messages[0]


@pytest.mark.parametrize(("num_samples", "drop_last"), [(24, True), (23, False)])
def test_nothing_is_logged_when_nothing_is_dropped(
    caplog: pytest.LogCaptureFixture, num_samples: int, drop_last: bool
) -> None:
    reader = InMemoryReader(identity, num_samples, batch_size=4, dp_size=2, drop_last=drop_last)

    with caplog.at_level(logging.INFO, logger="recsys.data.memory"):
        read_epoch(reader)

    assert caplog.records == []
